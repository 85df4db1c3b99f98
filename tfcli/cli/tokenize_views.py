"""`tfcli tokenize show` and `tfcli tokenize trace`: how a tokenizer cuts a text, and BPE or WordPiece merges replayed
step by step, as a lecture does. Renders what tfcli.tokenizer.show and tfcli.tokenizer.trace compute."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import counted, print_json, stdout_console
from tfcli.cli.options import JsonFlag

TokenizerFile = Annotated[Path, typer.Option("--tokenizer", "-t", help="A tokenizer.json, or the folder holding it.", show_default=False)]


def show(
    text: Annotated[str, typer.Argument(help="The text to tokenize.", show_default=False)],
    tokenizer: TokenizerFile,
    json_output: JsonFlag = False,
) -> None:
    """Show how a tokenizer cuts a text: each token coloured, its id beneath.

    A space at either end of a token shows as ␣, a newline as ↵, other control characters escaped (\\t, \\x1b);
    special-token text in <text> stays ordinary text. --json gives each token's text unmarked.
    A WordPiece token that continues a word is marked with a dim ## in front.

    \b
    Example: tfcli tokenize show "The cat sat on the mat." -t runs/quickstart/tokenizer
    """
    from tfcli.tokenizer.core import TextTokenizer
    from tfcli.tokenizer.show import token_views

    loaded = TextTokenizer.load(tokenizer)
    views = token_views(loaded, text)
    if json_output:
        print_json({"text": text, "count": len(views), "tokens": [v.to_json() for v in views]})
        return
    console = stdout_console()
    _render_tokens(console, views)
    console.print(f"{len(views)} tokens, {len(text)} characters, {len(text.encode('utf-8', 'replace'))} bytes", style="dim")


def _render_tokens(console, views) -> None:
    """Rows of tokens on alternating backgrounds, each id printed under its token, wrapped to the width."""
    from rich.cells import cell_len
    from rich.text import Text

    colours = ("on dark_blue", "on dark_green", "on dark_magenta", "on dark_red")
    width = max(console.width, 20)
    top, bottom, used = Text(), Text(), 0
    for i, view in enumerate(views):
        mark = "##" if view.continuation else ""  # a WordPiece piece that continues the word before it
        shown = cell_len(mark) + cell_len(view.readable)
        cell = max(shown, len(str(view.id)))
        if used and used + cell + 1 > width:
            console.print(top, soft_wrap=True)
            console.print(bottom, soft_wrap=True)
            top, bottom, used = Text(), Text(), 0
        if mark:
            top.append(mark, style="dim")
        top.append(view.readable, style=colours[i % len(colours)])
        top.append(" " * (cell - shown + 1))
        bottom.append(str(view.id).ljust(cell + 1), style="dim")
        used += cell + 1
    if used:
        console.print(top, soft_wrap=True)
        console.print(bottom, soft_wrap=True)


def trace(
    text: Annotated[str, typer.Argument(help="A short text. Underscores count as spaces, so the blackboard form works too.", show_default=False)],
    merges: Annotated[Optional[int], typer.Option(help="Stop after this many merges (default: until no pair is left).", show_default=False)] = None,
    min_count: Annotated[int, typer.Option(help="Merge only pairs that occur at least this often (2: stop when every pair is unique).")] = 1,
    model: Annotated[str, typer.Option("--model", "-m", help="bpe (merge the most frequent pair) or wordpiece (the pair with the best score).")] = "bpe",
    json_output: JsonFlag = False,
) -> None:
    """Replay byte-pair or WordPiece merges on a small text, step by step, as a lecture does.

    bpe: whitespace is shown as _ and attached to the end of the word before it; a pair whose first
    token ends in _ is never merged. Each step merges the most frequent pair; a tie goes to the pair of
    older tokens (characters in code-point order, each merged token after all tokens before it).

    wordpiece: words are cut at spaces and punctuation as BERT does, a character that continues a word
    is written ##c, and each step merges the pair with the best score count(ab) / (count(a) * count(b));
    ties as for bpe. The end also shows the text encoded as WordPiece encodes, longest match first.

    The same text with --model wordpiece puts both algorithms side by side.

    \b
    Example: tfcli tokenize trace "a sailor went to sea sea sea " --merges 5
    """
    from tfcli.errors import TfcliError
    from tfcli.tokenizer.trace import bpe_trace, wordpiece_trace

    if model not in ("bpe", "wordpiece"):
        raise TfcliError(
            f"trace replays merges of --model bpe or wordpiece, not {model!r}",
            hint="unigram prunes a large vocabulary and char has nothing to merge; use --model bpe or --model wordpiece",
        )
    if merges is not None and merges < 0:
        raise TfcliError(f"--merges must be 0 or more, not {merges}")
    if min_count < 1:
        raise TfcliError(f"--min-count must be at least 1, not {min_count}")
    if len(text) > 20_000:
        raise TfcliError(f"the text has {len(text):,} characters; trace is for small texts", hint="pass at most 20,000 characters")
    result = (bpe_trace if model == "bpe" else wordpiece_trace)(text, max_merges=merges, min_count=min_count)
    if json_output:
        print_json(result.to_json())
        return
    from rich.text import Text

    from tfcli.tokenizer.show import on_a_base, visible
    from tfcli.tokenizer.trace import CONTINUATION

    console = stdout_console()

    def shown(token: str) -> str:
        return on_a_base(visible(token), CONTINUATION)

    def table_line(table) -> Text:
        return Text(", ".join(f"{shown(token)} {count}" for token, count in table))

    console.print(Text("text: ", style="bold") + Text(visible(result.text)), soft_wrap=True)
    console.print(Text(f"start ({counted(sum(c for _, c in result.initial_table), 'token')}): ", style="bold") + table_line(result.initial_table))
    for step in result.steps:
        head = Text(f"merge {step.number}: ", style="bold")
        head.append(f"{shown(step.left)} + {shown(step.right)} -> {shown(step.token)}", style="cyan")
        if step.score is None:
            head.append(f" ({step.count}x)")
        else:
            head.append(f" ({step.count}x; score {step.count}/({step.left_count}*{step.right_count}) = {float(step.score):.4g})")
        console.print(head)
        console.print(Text("  ") + table_line(step.table))
    console.print(
        Text(f"end ({counted(len(result.tokens), 'token')}, {counted(len(result.steps), 'merge')}): ", style="bold")
        + Text(" ".join(shown(t) for t in result.tokens))
    )
    if result.encoded is not None and result.encoded != result.tokens:
        console.print(
            Text(f"encoded, longest match first ({counted(len(result.encoded), 'token')}): ", style="bold") + Text(" ".join(shown(t) for t in result.encoded))
        )
