"""`tfcli generate RUN`: continue text (greedy, sampling, beam search), fill in masks, or classify.

The command checks its options and picks the mode; decoding is rendered here, a chat or a conversation on stdin in
cli/chat.py, fill-mask and classify in cli/masked.py; the decoding options make settings in cli/generate_options.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import TextWriter, print_json, require_utf8, stderr_console, terminal_safe, write_stdout
from tfcli.cli.generate_options import DecodingOptions
from tfcli.cli.options import Device, JsonFlag, Run, Threads


def _read_prompts(prompt: str | None, prompt_file: Path | None, run: Path | None = None, *, empty_ok: bool = False) -> list[str]:
    """The prompts to decode, read no further than `run`'s context can use. `empty_ok`: an empty --prompt ""
    goes on to the generator, which starts from the beginning-of-text token where the tokenizer has one (and
    else says the prompt is empty)."""
    from tfcli.errors import TfcliError

    if prompt is not None and prompt_file is not None:
        raise TfcliError("pass --prompt or --prompt-file, not both")
    if prompt is not None:
        require_utf8(prompt, "the prompt", "--prompt-file")
        if not prompt.strip() and not (empty_ok and prompt == ""):
            raise TfcliError("the prompt is empty", hint='pass some text to continue, e.g. --prompt "Once upon a time"')
        return [prompt]
    assert prompt_file is not None
    if str(prompt_file) == "-":
        lines, where = _prompt_lines(sys.stdin.buffer, "stdin", run), "stdin"
    else:
        if prompt_file.is_dir():
            raise TfcliError(f"prompt file {prompt_file} is a folder", hint="pass a text file with one prompt per line")
        if not prompt_file.exists():
            raise TfcliError(f"prompt file {prompt_file} does not exist")
        where = str(prompt_file)
        try:  # a regular file, or a pipe such as <(...)
            with open(prompt_file, "rb") as handle:
                lines = _prompt_lines(handle, where, run)
        except OSError as exc:
            raise TfcliError(f"cannot read prompt file {prompt_file}: {exc.strerror}") from exc
    if lines:
        lines[0] = lines[0].removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is not part of the first prompt
    prompts = []
    for number, line in enumerate(lines, start=1):
        try:
            prompts.append(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise TfcliError(f"{where} is not UTF-8 text (prompt {number}, byte {exc.start})") from exc
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise TfcliError(f"{where} holds no prompts", hint="one prompt per line; blank lines are skipped")
    return prompts


def _prompt_lines(handle, where: str, run: Path | None) -> list[bytes]:
    """The prompt file's lines, read no further than the run's context can use (its block size in config.json)."""
    from tfcli.limits import BYTES_PER_TOKEN, read_prompt_lines

    block = None
    if run is not None:
        from tfcli.errors import TfcliError
        from tfcli.rundir import read_run_config

        try:
            block = read_run_config(run).model.block_size
        except (TfcliError, AttributeError):
            block = None  # loading the run says what is wrong with it
    context = f"the context ({block:,} tokens)" if block else "a context of 8,192 tokens"
    return read_prompt_lines(handle, where, (block or 8192) * BYTES_PER_TOKEN, context)


Prompt = Annotated[Optional[str], typer.Option("--prompt", "-p", help="The text to continue (encoder-decoder: the source).", show_default=False)]
PromptFile = Annotated[
    Optional[Path], typer.Option("--prompt-file", help="One prompt per line (blank lines skipped), decoded in batches; - reads stdin.", show_default=False)
]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", "-n", help="New tokens per completion, at most.")]
Strategy = Annotated[
    Optional[str],
    typer.Option(
        help="greedy | sample | beam. Default: beam with --num-beams > 1, sample with any sampling option or --seed, else greedy.", show_default=False
    ),
]
Temperature = Annotated[Optional[float], typer.Option(help="Sampling: divide the logits by this (0 = greedy). Default 1.", show_default=False)]
TopK = Annotated[
    Optional[int], typer.Option(help="Sampling: keep the K most likely tokens (0: all). --fill-mask: fillers to list (default 5).", show_default=False)
]
TopP = Annotated[Optional[float], typer.Option(help="Sampling: nucleus, keep the most likely tokens up to probability P, in (0, 1].", show_default=False)]
MinP = Annotated[Optional[float], typer.Option(help="Sampling: drop tokens less likely than P x the most likely one.", show_default=False)]
RepetitionPenalty = Annotated[float, typer.Option(help="> 1 makes tokens already in the text less likely (1 = off).")]
NumBeams = Annotated[int, typer.Option(help="Beam search: hypotheses kept per prompt.")]
LengthPenalty = Annotated[float, typer.Option(help="Beam search: score = sum of log-probabilities / length ** this (> 1 favours longer texts).")]
EarlyStopping = Annotated[
    bool,
    typer.Option(
        "--early-stopping/--no-early-stopping",
        help="Beam search: stop when --num-beams hypotheses are finished, or go on while a running beam could still beat them.",
    ),
]
NumSamples = Annotated[int, typer.Option(help="Completions per prompt (beam search: the best N hypotheses).")]
Seed = Annotated[Optional[int], typer.Option(help="Seed the sampling draws, for the same text every time (the seed used is in --json).", show_default=False)]
Stop = Annotated[
    Optional[list[str]], typer.Option("--stop", help="Stop when the text contains this string, which is not kept (repeatable).", show_default=False)
]
IgnoreEos = Annotated[
    bool, typer.Option("--ignore-eos", help="Go on past the end-of-text token (it shows in the text as itself), up to --max-new-tokens or a --stop string.")
]
NoStream = Annotated[bool, typer.Option("--no-stream", help="Print the text when it is finished instead of token by token.")]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Re-run the whole context for every token instead of using the KV cache (slow; for comparison).")]
BatchSize = Annotated[int, typer.Option(help="Sequences decoded together (prompts x samples, or x beams).")]
FillMask = Annotated[
    Optional[str], typer.Option("--fill-mask", help="Encoder runs: list the likeliest tokens for each [MASK] in this text.", show_default=False)
]
Classify = Annotated[
    Optional[str], typer.Option("--classify", help="Runs with a classification head: the label probabilities of this text.", show_default=False)
]
Interactive = Annotated[
    bool,
    typer.Option(
        "--interactive",
        "-i",
        help="A conversation on stdin: each line is added to the context and answered; a reply ends at a newline unless --stop says otherwise (/reset, /quit).",
    ),
]
Chat = Annotated[
    bool,
    typer.Option(
        "--chat",
        help="A chat with a run that has a chat template (tfcli train finetune --task chat): answers --prompt once, else each line typed on stdin; the oldest exchanges leave the context when it is full.",
    ),
]
System = Annotated[Optional[str], typer.Option("--system", help="--chat: the system message the conversation starts with.", show_default=False)]
Steer = Annotated[
    Optional[list[str]],
    typer.Option(
        "--steer", help="SAE:F:COEF: add COEF x feature F's decoder direction at the SAE's hook point while decoding (repeatable).", show_default=False
    ),
]


def generate(
    run: Run,
    prompt: Prompt = None,
    prompt_file: PromptFile = None,
    max_new_tokens: MaxNewTokens = 128,
    strategy: Strategy = None,
    temperature: Temperature = None,
    top_k: TopK = None,
    top_p: TopP = None,
    min_p: MinP = None,
    repetition_penalty: RepetitionPenalty = 1.0,
    num_beams: NumBeams = 1,
    length_penalty: LengthPenalty = 1.0,
    early_stopping: EarlyStopping = True,
    num_samples: NumSamples = 1,
    seed: Seed = None,
    stop: Stop = None,
    ignore_eos: IgnoreEos = False,
    no_stream: NoStream = False,
    no_cache: NoCache = False,
    batch_size: BatchSize = 16,
    fill_mask: FillMask = None,
    classify: Classify = None,
    interactive: Interactive = False,
    chat: Chat = False,
    system: System = None,
    steer: Steer = None,
    device: Device = "auto",
    threads: Threads = 0,
    json_output: JsonFlag = False,
) -> None:
    """Generate text from a run: continue a prompt, fill in masks, or classify.

    Decoders continue --prompt (or each line of --prompt-file), token by token over a KV cache, streaming
    the text as it is made. Encoder-decoders read --prompt as the source (encoded once) and write the
    target. Encoder runs fill in [MASK]s (--fill-mask); runs with a classification head take --classify.

    A prompt longer than the model's context keeps its last block-size tokens, with a warning (an
    encoder-decoder's source keeps its first ones, as in training). Past the context, decoding slides
    the window: the last 3/4 of the context is run again and decoding goes on. Text stops at the
    end-of-text token (unless --ignore-eos), a --stop string (not kept) or --max-new-tokens.

    --chat renders the conversation with the run's chat template and stops each reply at its end-of-turn
    token; with --prompt it answers once and exits.

    \b
    Example: tfcli generate runs/story --prompt "Once upon a time" --strategy sample --top-p 0.9 --seed 1
    Or chat: tfcli generate runs/chat --chat --system "Answer briefly." --prompt "What is the last word of: fox red tree?"
    """
    from tfcli.cli.chat import check_chat_options

    check_chat_options(chat, system, prompt_file, interactive, fill_mask, classify, json_output)
    modes = _modes(prompt, prompt_file, fill_mask, classify, interactive, chat)
    from tfcli.runtime import check_threads

    check_threads(threads)
    decoding = DecodingOptions.of(locals())
    if fill_mask is not None or classify is not None:  # no text is generated: decoding options would do nothing
        decoding.refuse_given(modes[0], fill_mask=fill_mask is not None)
    import torch

    threads_before = torch.get_num_threads()
    try:  # the thread count is this command's alone (tests run many commands in one process)
        if fill_mask is not None or classify is not None:
            _fill_mask_or_classify(run, fill_mask=fill_mask, classify=classify, top_k=top_k, device=device, threads=threads, json_output=json_output)
        else:
            _decode(
                run, decoding, prompt, prompt_file, interactive=interactive, chat=chat, system=system, device=device, threads=threads, json_output=json_output
            )
    finally:
        torch.set_num_threads(threads_before)


def _modes(prompt, prompt_file, fill_mask, classify, interactive: bool, chat: bool) -> list[str]:
    """The modes the options ask for: one, or --prompt with --prompt-file (refused later, by _read_prompts)."""
    from tfcli.errors import TfcliError

    modes = [
        name
        for name, on in (
            ("--prompt/--prompt-file", prompt is not None or prompt_file is not None),
            ("--fill-mask", fill_mask is not None),
            ("--classify", classify is not None),
            ("--interactive", interactive),
            ("--chat", chat and prompt is None),
        )
        if on
    ]
    if not modes:
        if sys.stdin is not None and not sys.stdin.closed and not sys.stdin.isatty():  # `echo TEXT | tfcli generate RUN`
            raise TfcliError(
                "nothing to do: stdin is not read without an option", hint="pass --prompt-file - (a prompt a line), --interactive or --chat to read it"
            )
        raise TfcliError("nothing to do", hint="pass --prompt TEXT, --prompt-file FILE, --interactive, --chat, --fill-mask TEXT or --classify TEXT")
    if len(modes) > 1 and modes != ["--prompt/--prompt-file"]:
        raise TfcliError(f"{modes[0]} and {modes[1]} do not go together", hint="pick one")
    return modes


def _fill_mask_or_classify(run: Path, *, fill_mask: str | None, classify: str | None, top_k: int | None, device: str, threads: int, json_output: bool) -> None:
    from tfcli.cli.masked import show_fillers, show_labels

    require_utf8(fill_mask if fill_mask is not None else classify, "--fill-mask's text" if fill_mask is not None else "--classify's text")
    checkpoint = _load(run, device, threads)
    if fill_mask is not None:
        show_fillers(run, checkpoint, fill_mask, top_k, json_output)
    else:
        assert classify is not None
        show_labels(run, checkpoint, classify, json_output)


def _decode(
    run: Path,
    decoding: DecodingOptions,
    prompt: str | None,
    prompt_file: Path | None,
    *,
    interactive: bool,
    chat: bool,
    system: str | None,
    device: str,
    threads: int,
    json_output: bool,
) -> None:
    """Continue the prompts, or hold a conversation (--interactive) or a chat (--chat) on stdin."""
    from tfcli.errors import TfcliError

    if interactive and json_output:
        raise TfcliError("--interactive prints a conversation, not JSON", hint="drop --json")
    settings = decoding.settings(interactive=interactive, json_output=json_output)
    prompts = None if interactive or chat else _read_prompts(prompt, prompt_file, run, empty_ok=True)
    if chat and prompt is not None:
        _read_prompts(prompt, None)  # the same checks: UTF-8, not empty
    checkpoint = _load(run, device, threads)
    from tfcli.sae.steer import steering

    with steering(checkpoint.model, decoding.steer or [], run):  # --steer: a hook on the model while it decodes
        _decode_loaded(checkpoint, run, decoding, settings, prompts, prompt, chat=chat, interactive=interactive, system=system, json_output=json_output)


def _decode_loaded(
    checkpoint, run: Path, decoding: DecodingOptions, settings, prompts, prompt, *, chat: bool, interactive: bool, system, json_output: bool
) -> None:
    from tfcli.generate.decoding import Generator

    generator = Generator(checkpoint.model, checkpoint.tokenizer, settings, batch_size=decoding.batch_size)
    if chat:
        from tfcli.cli.chat import run_chat

        run_chat(generator, run, system, prompt, stream=not decoding.no_stream)
        return
    if interactive:
        from tfcli.cli.chat import converse
        from tfcli.generate.conversation import Conversation

        converse(generator, Conversation(generator))
        return
    assert prompts is not None
    _render(generator, prompts, stream=not decoding.no_stream, json_output=json_output, run=run)


def _load(run: Path, device: str, threads: int = 0):
    from tfcli.loader import load_run

    return load_run(run, "decode", device, threads)


def _render(generator, prompts: list[str], *, stream: bool, json_output: bool, run: Path) -> None:
    from rich.text import Text

    from tfcli.generate.events import Chunk, Done, Finished, Notice

    settings = generator.settings
    errors = stderr_console()
    out = TextWriter()
    n_completions = len(prompts) * settings.num_samples
    single = n_completions == 1 and settings.strategy != "beam"
    streaming = stream and single and not json_output
    if streaming and out.terminal:
        write_stdout(terminal_safe(prompts[0]) if generator.model.config.arch == "decoder" else "")
    finished: dict[int, object] = {}
    next_to_print = 0
    done = None
    for event in generator.run(prompts):
        if isinstance(event, Notice):
            errors.print(Text(f"{event.level}: {event.message}", style="yellow"), soft_wrap=True)
        elif isinstance(event, Chunk):
            if streaming:
                out.write(event.text)
        elif isinstance(event, Finished):
            finished[event.completion] = event.result
            if not json_output and not streaming:
                while next_to_print in finished:  # in input order, each as soon as those before it are done
                    _print_completion(out, finished[next_to_print], n_completions, settings)
                    next_to_print += 1
        elif isinstance(event, Done):
            done = event
    assert done is not None
    if not json_output and not streaming:  # beam search may return fewer hypotheses than asked for
        for index in sorted(i for i in finished if i >= next_to_print):
            _print_completion(out, finished[index], n_completions, settings)
    if json_output:
        print_json(
            {
                "run": str(run),
                "settings": settings.to_json() | {"seed": done.seed},
                "completions": [
                    {
                        "prompt_index": c.prompt_index,
                        "sample_index": c.sample_index,
                        "prompt": c.prompt,
                        "prompt_tokens": c.prompt_tokens,
                        "text": c.text,
                        "tokens": c.tokens,
                        "token_texts": c.token_texts,
                        "logprobs": [round(lp, 6) for lp in c.logprobs] if c.logprobs is not None else None,
                        "finish_reason": c.finish_reason,
                        **({"score": round(c.score, 6)} if c.score is not None else {}),
                    }
                    for c in done.completions
                ],
                "timing": done.timing.to_json(),
            }
        )
        return
    if streaming:
        out.write("\n")
    timing = done.timing
    reasons = ", ".join(sorted({c.finish_reason for c in done.completions}))
    seed = f", seed {done.seed}" if done.seed is not None else ""
    errors.print(
        Text(
            f"{timing.new_tokens:,} tokens in {timing.total_seconds:.2f} s ({timing.tokens_per_second:,.1f} tokens/s), stopped by {reasons}{seed}", style="dim"
        ),
        soft_wrap=True,
    )


def _print_completion(out: TextWriter, completion, n_completions: int, settings) -> None:
    if n_completions > 1:  # a header line before each completion: which prompt (and sample) it answers
        sample = f", sample {completion.sample_index + 1}" if settings.num_samples > 1 else ""
        out.write(f"[prompt {completion.prompt_index + 1}{sample}] {completion.prompt}\n")
    out.write(completion.text + "\n")
