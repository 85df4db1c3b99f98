"""`tfcli inspect-logits`, `inspect-ablate` and `inspect-patch`: what each layer predicts, which heads
matter, and where the information for an answer flows. Thin commands over `tfcli.inspect.lens`,
`ablation` and `patching`; torch is imported inside the command bodies."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from tfcli.cli.common import (
    PIPED_WIDTH,
    human_bytes,
    require_utf8,
    stderr_console,
    stdout_console,
)
from tfcli.cli.inspect import _read_text
from tfcli.cli.options import Device, InspectFormat, InspectOutput, InspectStart, InspectTarget, InspectText, InspectTextFile, JsonFlag, Run

TopOption = Annotated[int, typer.Option("--top-k", help="How many of the most likely tokens to keep per cell.")]
FORMATS = ("terminal", "json", "html", "png")
SUFFIXES = {".json": "json", ".html": "html", ".htm": "html", ".png": "png"}


def _format(output_format: str | None, output: Path | None, json_output: bool) -> str:
    from tfcli.errors import TfcliError
    from tfcli.inspect.session import check_output

    if json_output:
        if output_format not in (None, "json", "terminal"):
            raise TfcliError(f"--json prints JSON; it cannot be combined with --format {output_format}", hint="drop one of them")
        if output is not None:
            raise TfcliError("--json prints to stdout", hint="use --format json -o FILE to write a file")
        return "json"
    if output_format is not None and output_format not in FORMATS:
        hint = f"use one of {', '.join(FORMATS)}"
        raise TfcliError(f"unknown format {output_format!r} for this command", hint=hint)
    if output_format in ("png", "html") and output is None:
        raise TfcliError(f"--format {output_format} writes a file", hint=f"pass -o FILE.{output_format}")
    if output is not None:
        implied = SUFFIXES.get(output.suffix.lower())
        if implied is None:
            raise TfcliError(f"cannot write {output}: this command writes .json, .html and .png files", hint="end the file name in .json, .html or .png")
        if output_format == "terminal":
            raise TfcliError("the terminal format prints to the screen; -o is for json, html and png", hint="drop -o, or pass --format json|html|png")
        if output_format is not None and output_format != implied:
            raise TfcliError(f"--format {output_format} but -o {output} ends in {output.suffix}", hint=f"name the file .{output_format}, or drop --format")
        check_output(output)
        return implied
    return output_format or "terminal"


def _emit(
    fmt: str,
    output: Path | None,
    document: dict[str, Any],
    views: Callable[[int], list],
    seconds: float,
    image: Callable[[], bytes] | None = None,
    page: Callable[[], str] | None = None,
) -> None:
    if fmt in ("png", "html"):
        from rich.text import Text

        from tfcli.inspect.session import write_output

        write_output(output, image() if fmt == "png" else page())
        stderr_console().print(Text(f"wrote {output} ({human_bytes(output.stat().st_size)}) in {seconds:.1f} s"))
        return
    if fmt == "terminal":
        out = stdout_console()
        width = out.width if out.width != PIPED_WIDTH else 80
        from tfcli.cli.common import print_table

        for renderable in views(width):
            print_table(out, renderable)
        return
    if output is None:
        from tfcli.cli.common import print_json

        print_json(document)
        return

    from rich.text import Text

    from tfcli.inspect.session import write_output
    from tfcli.jsontext import dumps_json

    write_output(output, dumps_json(document, indent=1) + "\n")
    stderr_console().print(Text(f"wrote {output} ({human_bytes(output.stat().st_size)}) in {seconds:.1f} s"))


def _text(text: str | None, text_file: Path | None) -> str:
    from tfcli.errors import TfcliError

    value = _read_text(text, text_file, "text", "--text")
    if value is None:
        raise TfcliError("no text given", hint="pass --text TEXT or --text-file FILE")
    return value


def inspect_logits(
    run: Run,
    text: InspectText = None,
    text_file: InspectTextFile = None,
    target: InspectTarget = None,
    top_k: TopOption = 5,
    output_format: InspectFormat = None,
    output: InspectOutput = None,
    start: InspectStart = 0,
    device: Device = "auto",
    json_output: JsonFlag = False,
) -> None:
    """The logit lens: what each layer already predicts.

    The residual stream after the embeddings and after each block goes through the model's own final norm
    and vocabulary head. The terminal shows a layers x positions table of each layer's top-1 token coloured
    by its probability (underlined where it is the right next token), the actual next tokens, and each
    layer's loss on the text. --json and -o FILE.json give the top-k tokens with probabilities and the rank
    and probability of the actual next token, per layer and position.

    Supports decoder runs (trained or imported GPT-2), encoder runs, read at each [MASK] of the text, and
    encoder-decoder runs on the decoder's side: --text SOURCE --target TARGET, the decoder reading its
    start token and the target.

    \b
    Example: tfcli inspect-logits runs/quickstart/model --text "Once upon a time, a little fox found a red ball."
    """
    import time

    from tfcli.inspect.lens import logit_lens, token_text
    from tfcli.inspect.tables import lens_html, lens_png, lens_view
    from tfcli.loader import load_run

    began = time.perf_counter()
    fmt = _format(output_format, output, json_output)
    source = _text(text, text_file)
    checkpoint = load_run(run, "inspect", device)
    with stderr_console().status("reading every layer"):
        lens = logit_lens(checkpoint, source, target=target, top_k=top_k)
    document = lens.to_json(lambda i: token_text(checkpoint.tokenizer, i)) if fmt == "json" else {}
    _emit(
        fmt,
        output,
        document,
        lambda width: lens_view(lens, width=width, start=start),
        time.perf_counter() - began,
        lambda: lens_png(lens),
        lambda: lens_html(lens),
    )


def inspect_ablate(
    run: Run,
    text: InspectText = None,
    text_file: InspectTextFile = None,
    heads: Annotated[
        Optional[str],
        typer.Option(
            "--heads",
            help="Heads to knock out together, as LAYER.HEAD: 1.0,2.3 (1.* for a whole layer). Default: every head, one at a time.",
            show_default=False,
        ),
    ] = None,
    mode: Annotated[
        str, typer.Option("--mode", help="zero (the head's output set to 0) or mean (its mean output over the text, or --reference-text).")
    ] = "zero",
    reference_text: Annotated[
        Optional[str], typer.Option("--reference-text", help="With --mode mean: take each head's mean output over this text instead.", show_default=False)
    ] = None,
    position: Annotated[
        Optional[int],
        typer.Option(
            "--position", help="Where to compare the next-token distribution (default: the last position; negative counts from the end).", show_default=False
        ),
    ] = None,
    top_k: TopOption = 5,
    output_format: InspectFormat = None,
    output: InspectOutput = None,
    device: Device = "auto",
    json_output: JsonFlag = False,
) -> None:
    """Which heads matter: knock out attention heads and measure the change.

    A head is knocked out before its attention's output projection: zeroed, or (--mode mean) replaced by
    its mean output over the text. Reported: the change in the loss on the text (mean cross-entropy of
    each next token) and in the next-token distribution at --position (KL divergence, top tokens before
    and after). Without --heads, every head one at a time (run together as rows of one batch): a layers x
    heads table of the loss change, where the heads that matter light up.

    Supports decoder runs (trained or imported GPT-2); encoder and encoder-decoder runs are refused (one
    line, exit code 2).

    \b
    Example: tfcli inspect-ablate runs/quickstart/model --text "The fox was happy, so it played with the ball all day."
    """
    import time

    from tfcli.inspect.ablation import ablate
    from tfcli.inspect.tables import ablation_html, ablation_png, ablation_view
    from tfcli.loader import load_run

    began = time.perf_counter()
    fmt = _format(output_format, output, json_output)
    if fmt == "png" and heads is not None:
        from tfcli.errors import TfcliError

        raise TfcliError("the png shows every head's loss change", hint="drop --heads, or use the terminal or --json for chosen heads")
    source = _text(text, text_file)
    require_utf8(reference_text, "--reference-text")
    checkpoint = load_run(run, "inspect", device)
    with stderr_console().status("ablating heads"):
        ablation = ablate(checkpoint, source, heads=heads, mode=mode, reference_text=reference_text, position=position, top_k=top_k)
    document = ablation.to_json() if fmt == "json" else {}
    _emit(
        fmt,
        output,
        document,
        lambda width: ablation_view(ablation),
        time.perf_counter() - began,
        lambda: ablation_png(ablation),
        lambda: ablation_html(ablation),
    )


def inspect_patch(
    run: Run,
    clean: Annotated[str, typer.Option("--clean", help="The text the model gets right.", show_default=False)],
    corrupt: Annotated[str, typer.Option("--corrupt", help="The same text with a change (as many tokens) that changes the answer.", show_default=False)],
    answer: Annotated[
        str, typer.Option("--answer", help="The clean text's next token (one token; byte-level words carry their leading space: ' Mary').", show_default=False)
    ],
    wrong: Annotated[
        Optional[str],
        typer.Option(
            "--wrong", help="The token the corrupted text leads to (default: the corrupted run's most likely token other than --answer).", show_default=False
        ),
    ] = None,
    per_head: Annotated[bool, typer.Option("--per-head", help="Also patch each head's output (at every position), one head at a time.")] = False,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="exact (one patched run per cell) or attribution (every cell estimated to first order from one backward pass: seconds, not minutes).",
        ),
    ] = "exact",
    verify: Annotated[
        Optional[int],
        typer.Option("--verify", help="With --method attribution: re-check the N largest estimates of each map by exact patching.", show_default=False),
    ] = None,
    output_format: InspectFormat = None,
    output: InspectOutput = None,
    start: InspectStart = 0,
    device: Device = "auto",
    json_output: JsonFlag = False,
) -> None:
    """Where the information for an answer flows: activation patching.

    Runs the corrupted text and puts the clean run's residual stream back at one (layer, position) at a
    time (before each block), and with --per-head each head's clean output; reports the fraction of the
    logit difference answer - wrong (at the last position) that comes back: 1 restores the clean answer,
    0 changes nothing. The two texts must have the same number of tokens. --method attribution estimates
    every cell at once from the gradient of the corrupted run (Nanda's attribution patching), --verify N
    re-checks the N largest exactly; every output says which method produced its numbers.

    Supports decoder runs (trained or imported GPT-2); encoder and encoder-decoder runs are refused (one
    line, exit code 2).

    \b
    Example: tfcli inspect-patch runs/gpt2 --clean "When Mary and John went to the store, John gave a drink to" --corrupt "When Mary and John went to the store, Mary gave a drink to" --answer " Mary" --wrong " John"
    The whole map in a second: the same command line with --method attribution --verify 20.
    """
    import time

    from tfcli.inspect.patching import check_method, patch
    from tfcli.inspect.tables import patching_html, patching_png, patching_view
    from tfcli.loader import load_run

    began = time.perf_counter()
    fmt = _format(output_format, output, json_output)
    check_method(method, verify)
    for value, what in ((clean, "--clean's text"), (corrupt, "--corrupt's text"), (answer, "--answer"), (wrong, "--wrong")):
        require_utf8(value, what)
    checkpoint = load_run(run, "inspect", device)
    with stderr_console().status("patching"):
        patching = patch(checkpoint, clean, corrupt, answer, wrong, per_head=per_head, method=method, verify=verify)
    document = patching.to_json() if fmt == "json" else {}
    _emit(
        fmt,
        output,
        document,
        lambda width: patching_view(patching, width=width, start=start),
        time.perf_counter() - began,
        lambda: patching_png(patching),
        lambda: patching_html(patching),
    )
