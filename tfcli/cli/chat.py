"""`tfcli generate --chat` and `--interactive`: a conversation on stdin, or one chat reply to --prompt.

Renders what a ChatSession or a Conversation (tfcli.generate) yields; never decodes itself."""

from __future__ import annotations

import sys
from pathlib import Path

from tfcli.cli.common import TextWriter, require_utf8, stderr_console


def check_chat_options(chat: bool, system, prompt_file, interactive: bool, fill_mask, classify, json_output: bool) -> None:
    """Refuse --system without --chat, and --chat with an option it does not go with."""
    from tfcli.errors import TfcliError

    if system is not None and not chat:
        raise TfcliError("--system sets a chat's system message; it needs --chat")
    if not chat:
        return
    for name, given in (("--prompt-file", prompt_file is not None), ("--interactive", interactive), ("--fill-mask", fill_mask is not None)):
        if given:
            raise TfcliError(f"--chat and {name} do not go together", hint="--chat alone reads a conversation from stdin; --chat --prompt TEXT answers once")
    if classify is not None:
        raise TfcliError("--chat and --classify do not go together", hint="pick one")
    if json_output:
        raise TfcliError("--chat prints a conversation, not JSON", hint="drop --json")
    if system is not None:
        require_utf8(system, "the system message")


def run_chat(generator, run: Path, system: str | None, prompt: str | None, *, stream: bool) -> None:
    """A chat with the run's template: one reply to `prompt`, or a conversation on stdin when there is none."""
    from tfcli.generate.chat import ChatSession, run_template

    session = ChatSession(generator, run_template(run, generator), system)
    if prompt is not None:
        _answer_once(session, prompt, stream=stream)
    else:
        converse(generator, session)


def _answer_once(session, prompt: str, *, stream: bool) -> None:
    """One chat reply to --prompt, streamed (or printed whole with --no-stream), then the timing line."""
    from rich.text import Text

    from tfcli.generate.events import Chunk, Finished, Notice

    errors = stderr_console()
    out = TextWriter()
    finished = None
    for event in session.reply(prompt):
        if isinstance(event, Chunk) and stream:
            out.write(event.text)
        elif isinstance(event, Notice):
            errors.print(Text(f"{event.level}: {event.message}", style="yellow"), soft_wrap=True)
        elif isinstance(event, Finished):
            finished = event.result
    assert finished is not None
    out.write(("" if stream else finished.text) + "\n")
    timing = session.generator.timing
    errors.print(
        Text(
            f"{timing.new_tokens:,} tokens in {timing.total_seconds:.2f} s ({timing.tokens_per_second:,.1f} tokens/s), stopped by {finished.finish_reason}",
            style="dim",
        ),
        soft_wrap=True,
    )


def converse(generator, conversation) -> None:
    """Read lines from stdin and answer each with `conversation` (a plain Conversation or a ChatSession)."""
    from rich.text import Text

    from tfcli.errors import TfcliError
    from tfcli.generate.events import Chunk, Notice
    from tfcli.limits import BYTES_PER_TOKEN, READ_BLOCK

    errors = stderr_console()
    out = TextWriter()
    line_cap = generator.model.config.block_size * BYTES_PER_TOKEN
    long_run = generator.length_notice()
    if long_run is not None:  # each reply may run that long
        errors.print(Text(f"{long_run.level}: {long_run.message}", style="yellow"), soft_wrap=True)
    if sys.stdin.isatty():
        errors.print(Text("a conversation: type a line and press enter; /reset forgets it, /quit (or Ctrl-D) leaves", style="dim"))
    while True:
        if sys.stdin.isatty():
            errors.print(Text("> ", style="bold"), end="")
        try:
            raw = sys.stdin.buffer.readline(line_cap + 1)
        except KeyboardInterrupt:  # Ctrl-C at the prompt leaves (main says so), on a line of its own
            errors.print()
            raise
        if not raw:
            break
        if len(raw) > line_cap and not raw.endswith(b"\n"):
            while (rest := sys.stdin.buffer.readline(READ_BLOCK)) and not rest.endswith(b"\n"):
                pass  # the rest of the line is read and dropped, a block at a time
            errors.print(
                Text(f"error: that line is longer than {line_cap:,} bytes, more than the context can use; type a shorter one", style="bold red"), soft_wrap=True
            )
            continue
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            errors.print(Text(f"error: that line is not UTF-8 text (byte {exc.start}); type it again", style="bold red"), soft_wrap=True)
            continue
        command = line.strip()
        if command in ("/quit", "/exit"):
            break
        if command == "/reset":
            conversation.reset()
            errors.print(Text("(conversation forgotten)", style="dim"))
            continue
        if not command:
            continue
        try:
            for event in conversation.reply(line):
                if isinstance(event, Chunk):
                    out.write(event.text)
                elif isinstance(event, Notice):
                    errors.print(Text(f"{event.level}: {event.message}", style="yellow"), soft_wrap=True)
        except TfcliError as exc:
            errors.print(Text(f"error: {exc}", style="bold red"), soft_wrap=True)
            continue
        except KeyboardInterrupt:  # Ctrl-C during a reply ends the reply, not the conversation
            conversation.abandon_reply()
            out.write("\n")
            errors.print(Text("(reply interrupted; Ctrl-C at the prompt or /quit leaves)", style="dim"))
            continue
        out.write("\n")
