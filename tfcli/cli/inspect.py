"""`tfcli inspect-attention RUN --text TEXT`: what every layer and head attends to, in the terminal, an
HTML page, a PNG or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import PIPED_WIDTH, JsonFlag, human_bytes, require_utf8, stderr_console, stdout_console


def _read_text(value: str | None, file: Path | None, what: str, flag: str) -> str | None:
    from tfcli.errors import TfcliError

    if value is not None and file is not None:
        raise TfcliError(f"pass {flag} or {flag}-file, not both")
    if file is None:
        require_utf8(value, f"the {what}", f"{flag}-file")
        return value
    if file.is_dir():
        raise TfcliError(f"{what} file {file} is a folder", hint=f"pass a text file to {flag}-file")
    if not file.is_file():
        raise TfcliError(f"{what} file {file} does not exist", hint="check the path")
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise TfcliError(f"cannot read {file}: {exc.strerror or exc}") from exc
    from tfcli.corpus.reader import binary_file_error, looks_binary

    if looks_binary(raw):  # as `tokenize` and `eval` refuse it
        raise binary_file_error(file)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        from rich.text import Text

        stderr_console().print(Text(f"warning: {file} is not valid UTF-8 (byte {exc.start}); bad bytes read as U+FFFD", style="yellow"), soft_wrap=True)
        return raw.decode("utf-8", errors="replace")


def inspect_attention(
    run: Annotated[Path, typer.Argument(help="A run directory (config.json, model.safetensors, tokenizer.json).", show_default=False)],
    text: Annotated[Optional[str], typer.Option("--text", help="The text to look at (for an encoder-decoder: the source).", show_default=False)] = None,
    text_file: Annotated[Optional[Path], typer.Option("--text-file", help="Read the text from a UTF-8 file instead.", show_default=False)] = None,
    target: Annotated[
        Optional[str], typer.Option("--target", help="Encoder-decoder only: the target text the decoder reads (after its start token).", show_default=False)
    ] = None,
    target_file: Annotated[Optional[Path], typer.Option("--target-file", help="Read the target from a UTF-8 file instead.", show_default=False)] = None,
    attention: Annotated[
        Optional[str],
        typer.Option(
            "--attention", help="encoder, decoder or cross: which attention of an encoder-decoder (default: cross; other models have one).", show_default=False
        ),
    ] = None,
    layer: Annotated[
        Optional[str],
        typer.Option(
            "--layer", "-l", help="A layer number (negative counts from the end) or 'all'. Default 0; all for --summary and a JSON file.", show_default=False
        ),
    ] = None,
    head: Annotated[
        Optional[str],
        typer.Option(
            "--head", help="A head number or 'all' (a grid of small maps). Default 0; all with --token, --summary and a JSON file.", show_default=False
        ),
    ] = None,
    token: Annotated[Optional[str], typer.Option("--token", help="Show where this word of the text looks: a bar per head.", show_default=False)] = None,
    occurrence: Annotated[int, typer.Option("--occurrence", help="With --token: which occurrence of the word (1 = the first).")] = 1,
    summary: Annotated[
        bool, typer.Option("--summary", help="Per head: mean entropy, mean attended distance, and the known pattern it matches best, with scores.")
    ] = False,
    compare: Annotated[Optional[str], typer.Option("--compare", help="A second text: the same head on both, side by side.", show_default=False)] = None,
    compare_run: Annotated[
        Optional[Path],
        typer.Option(
            "--compare-run", help="A second run of the same shape and tokenizer: the same text through both, and which heads changed most.", show_default=False
        ),
    ] = None,
    output_format: Annotated[
        Optional[str], typer.Option("--format", "-f", help="terminal, html, png or json (default: from -o's suffix, else terminal).", show_default=False)
    ] = None,
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="The file to write (html, png; json prints to stdout without it).", show_default=False)
    ] = None,
    start: Annotated[int, typer.Option("--start", help="Terminal heatmap of a long text: the first token of the window shown.")] = 0,
    key_start: Annotated[
        int, typer.Option("--key-start", help="Terminal cross-attention heatmap of a long source: the first source token of the columns shown.")
    ] = 0,
    crop: Annotated[
        bool, typer.Option("--crop", help="Keep the first block-size tokens of a text longer than the model's context (default: an error).")
    ] = False,
    device: Annotated[str, typer.Option("--device", help="auto (a GPU if there is one), cpu, cuda, cuda:N or mps.")] = "auto",
    checkpoints: Annotated[
        bool, typer.Option("--checkpoints", help="Across the checkpoints the run kept (train --keep-checkpoints N): each head's detector score, step by step.")
    ] = False,
    pattern: Annotated[str, typer.Option("--pattern", help="With --checkpoints: previous-token, first-token, duplicate or induction.")] = "induction",
    json_output: JsonFlag = False,
) -> None:
    """See what every layer and head of a model attends to, for any text.

    The terminal shows one head as a heatmap (queries down, keys across), --head all / --layer all a grid
    of small maps, --token WORD a bar per head of where that word looks, --summary a table of head
    patterns (previous-token, first-token, duplicate, induction). --format html writes one self-contained
    page with a layer/head picker where hovering a token shows what it attends to and what attends to it.
    A text longer than the model's block size is an error unless --crop.

    \b
    Example: tfcli inspect-attention runs/gpt2 --text "The animal didn't cross the street because it was too tired" --token it

    More: --head all; --summary; --compare "...because it was too wide"; --compare-run runs/child;
    --format html -o attention.html; --format png -o head.png; --format json -o weights.json;
    encoder-decoder: --text SOURCE --target TARGET --attention cross; --checkpoints --pattern induction
    (a table of steps x heads: watch an induction head form).
    """
    import time

    from tfcli.errors import TfcliError
    from tfcli.inspect.session import (
        InspectRequest,
        attention_document,
        check_output,
        html_page,
        png_image,
        resolve_format,
        save_document,
        write_document,
        write_output,
    )
    from tfcli.inspect.session import (
        inspect_attention as run_inspection,
    )

    began = time.perf_counter()
    if checkpoints:
        _across(run, text, text_file, attention, layer, head, pattern, output_format, output, device, json_output)
        return
    if json_output:
        if output_format not in (None, "json", "terminal"):
            raise TfcliError(f"--json prints JSON; it cannot be combined with --format {output_format}", hint="drop one of them")
        if output is not None:
            raise TfcliError("--json prints to stdout", hint="use --format json -o FILE to write a file")
    fmt = "json" if json_output else resolve_format(output_format, output)
    if output is not None:
        check_output(output)
    for name, value in (("--start", start), ("--key-start", key_start)):
        if value < 0:
            raise TfcliError(f"{name} must be 0 or more, not {value}")
        if value and fmt != "terminal":
            raise TfcliError(f"{name} moves the terminal heatmap's window", hint=f"html, png and json show the whole text; drop {name}")
    if summary and fmt == "png":
        raise TfcliError("--summary is a table", hint="use it in the terminal, with --json, or in an html page")
    source = _read_text(text, text_file, "text", "--text")
    if source is None:
        raise TfcliError("no text given", hint="pass --text TEXT or --text-file FILE")
    target_text = _read_text(target, target_file, "target", "--target")
    require_utf8(compare, "--compare's text")
    require_utf8(token, "--token's word")
    request = InspectRequest(
        run=run,
        text=source,
        target=target_text,
        attention=attention,
        layer=layer,
        head=head,
        token=token,
        occurrence=occurrence,
        summary=summary,
        compare=compare,
        compare_run=compare_run,
        crop=crop,
        device=device,
        select_all_by_default=fmt == "json" and not json_output,
    )
    console = stderr_console()
    with console.status("capturing attention"):
        inspection = run_inspection(request)
    captured = time.perf_counter()

    if fmt == "terminal":
        from tfcli.inspect.terminal import render_inspection

        out = stdout_console()
        width = out.width if out.width != PIPED_WIDTH else 80  # a map is drawn for a screen, also in a file
        for renderable in render_inspection(inspection, width=width, start=start, key_start=key_start):
            out.print(renderable, soft_wrap=False, crop=True)
        return
    if fmt == "json":
        # --json: the data of what the terminal shows (summary, changes or a token's rows need no full maps)
        weights = not json_output or (not summary and compare_run is None and token is None)
        document = attention_document(inspection, weights=weights)
        if output is None:
            import sys

            write_document(sys.stdout, document)
            sys.stdout.flush()
            return
        save_document(output, document)
    elif fmt == "html":
        write_output(output, html_page(inspection))
    else:
        write_output(output, png_image(inspection))
    done = time.perf_counter()
    from rich.text import Text

    for note in inspection.notes:
        console.print(Text(note, style="dim"))
    console.print(
        Text(
            f"wrote {output} ({human_bytes(output.stat().st_size)}) in {done - began:.1f} s "
            f"(loading and capture {captured - began:.1f} s, writing {done - captured:.1f} s)"
        )
    )


def _across(run, text, text_file, attention, layer, head, pattern, output_format, output, device, json_output) -> None:
    """inspect-attention --checkpoints: the detector scores of every kept checkpoint (terminal or JSON)."""
    from tfcli.errors import TfcliError
    from tfcli.inspect.across import across_checkpoints
    from tfcli.inspect.capture import parse_index
    from tfcli.inspect.session import check_output, save_document
    from tfcli.inspect.stats import PATTERNS

    if pattern not in PATTERNS:
        raise TfcliError(f"unknown --pattern {pattern!r}", hint=f"use one of {', '.join(PATTERNS)}")
    fmt = "json" if json_output or output_format == "json" or (output is not None and output.suffix.lower() == ".json") else output_format or "terminal"
    if fmt not in ("terminal", "json"):
        raise TfcliError("--checkpoints shows a table: terminal or json", hint="drop --format, or pass --format json")
    if output is not None:
        if json_output or output.suffix.lower() != ".json":
            raise TfcliError("--checkpoints writes only .json files with -o", hint="name the file .json, or drop -o")
        check_output(output)
    source = _read_text(text, text_file, "text", "--text")
    if source is None:
        raise TfcliError("no text given", hint="pass --text TEXT or --text-file FILE")
    with stderr_console().status("capturing every checkpoint"):
        across = across_checkpoints(run, source, kind=attention, device=device)
    if fmt == "json":
        if output is None:
            from tfcli.cli.common import print_json

            print_json(across.to_json())
        else:
            save_document(output, across.to_json())
        return
    from tfcli.cli.common import print_table
    from tfcli.inspect.tables import across_view

    layers = parse_index(layer, across.n_layers, "layer", None)
    heads = parse_index(head, across.n_heads, "head", None)
    out = stdout_console()
    width = out.width if out.width != PIPED_WIDTH else 80
    for renderable in across_view(across, pattern, layers, heads, width=width):
        print_table(out, renderable)
