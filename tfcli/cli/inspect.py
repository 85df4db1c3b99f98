"""`tfcli inspect-attention RUN --text TEXT`: what every layer and head attends to, in the terminal, an
HTML page, a PNG or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import PIPED_WIDTH, human_bytes, require_utf8, stderr_console, stdout_console
from tfcli.cli.options import Device, InspectFormat, InspectOutput, InspectStart, InspectTarget, InspectText, InspectTextFile, JsonFlag, Run


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
    from tfcli.limits import PROMPT_FILE, read_file_capped

    try:
        raw = read_file_capped(file, PROMPT_FILE)  # as inspect-features --data reads a text file
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


TargetFileOption = Annotated[Optional[Path], typer.Option("--target-file", help="Read the target from a UTF-8 file instead.", show_default=False)]
AttentionOption = Annotated[
    Optional[str],
    typer.Option(
        "--attention", help="encoder, decoder or cross: which attention of an encoder-decoder (default: cross; other models have one).", show_default=False
    ),
]
LayerOption = Annotated[
    Optional[str],
    typer.Option(
        "--layer", "-l", help="A layer number (negative counts from the end) or 'all'. Default 0; all for --summary and a JSON file.", show_default=False
    ),
]
HeadOption = Annotated[
    Optional[str],
    typer.Option(
        "--head",
        help="A head number or 'all' (a grid of small maps), or LAYER.HEAD (1.0: layer 1, head 0). Default 0; all with --token, --summary and a JSON file.",
        show_default=False,
    ),
]
TokenOption = Annotated[Optional[str], typer.Option("--token", help="Show where this word of the text looks: a bar per head.", show_default=False)]
OccurrenceOption = Annotated[int, typer.Option("--occurrence", help="With --token: which occurrence of the word (1 = the first).")]
SummaryOption = Annotated[
    bool, typer.Option("--summary", help="Per head: mean entropy, mean attended distance, and the known pattern it matches best, with scores.")
]
CompareOption = Annotated[Optional[str], typer.Option("--compare", help="A second text: the same head on both, side by side.", show_default=False)]
CompareRunOption = Annotated[
    Optional[Path],
    typer.Option(
        "--compare-run", help="A second run of the same shape and tokenizer: the same text through both, and which heads changed most.", show_default=False
    ),
]
KeyStartOption = Annotated[
    int, typer.Option("--key-start", help="Terminal cross-attention heatmap of a long source: the first source token of the columns shown.")
]
CropOption = Annotated[bool, typer.Option("--crop", help="Keep the first block-size tokens of a text longer than the model's context (default: an error).")]
CheckpointsOption = Annotated[
    bool,
    typer.Option(
        "--checkpoints",
        help="Across the checkpoints the run kept (train --keep-checkpoints N): each head's detector scores step by step; "
        "with one head (--head L.H), its pattern at each step (terminal, html, png or json).",
    ),
]
NeuronOption = Annotated[
    Optional[str],
    typer.Option(
        "--neuron",
        help="LAYER.HEAD: the neuron view of that head: the query vector, each key vector, their products, q·k/√d and the softmax "
        "(terminal: the scores; json: every number; html: the page opens on it).",
        show_default=False,
    ),
]
QueryOption = Annotated[
    Optional[int], typer.Option("--query", help="With --neuron: the query token's position (default: the --token's, else the last).", show_default=False)
]
PatternOption = Annotated[
    str,
    typer.Option(
        "--pattern", help="With --checkpoints: previous-token, first-token, duplicate or induction (the score shown; png and html default to its best head)."
    ),
]


def inspect_attention(
    run: Run,
    text: InspectText = None,
    text_file: InspectTextFile = None,
    target: InspectTarget = None,
    target_file: TargetFileOption = None,
    attention: AttentionOption = None,
    layer: LayerOption = None,
    head: HeadOption = None,
    token: TokenOption = None,
    occurrence: OccurrenceOption = 1,
    summary: SummaryOption = False,
    compare: CompareOption = None,
    compare_run: CompareRunOption = None,
    output_format: InspectFormat = None,
    output: InspectOutput = None,
    start: InspectStart = 0,
    key_start: KeyStartOption = 0,
    crop: CropOption = False,
    device: Device = "auto",
    checkpoints: CheckpointsOption = False,
    pattern: PatternOption = "induction",
    neuron: NeuronOption = None,
    query: QueryOption = None,
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
    (a table of steps x heads: watch an induction head form); --checkpoints --head 1.2 (that head's
    pattern at every kept step; -o steps.html, -o steps.png or --json); --neuron 1.0 --query 5 --format json
    (q, each k, q·k/√d and the softmax of layer 1, head 0 for token 5).
    """
    from tfcli.errors import TfcliError
    from tfcli.inspect.session import InspectRequest

    if (neuron is not None or query is not None) and checkpoints:
        raise TfcliError("--neuron shows one run's head", hint="drop --checkpoints")
    if checkpoints:
        _across(run, _required_text(text, text_file), attention, layer, head, pattern, output_format, output, device, json_output)
        return
    fmt = _single_format(output_format, output, json_output, start, key_start, summary)
    if neuron is not None and fmt == "png":
        raise TfcliError("the neuron view is numbers", hint="use it in the terminal, with --format json, or in an html page")
    require_utf8(compare, "--compare's text")
    require_utf8(token, "--token's word")
    request = InspectRequest(
        run=run,
        text=_required_text(text, text_file),
        target=_read_text(target, target_file, "target", "--target"),
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
        neuron=neuron,
        query=query,
    )
    _single(request, fmt, output, start=start, key_start=key_start, json_output=json_output)


def _required_text(text: str | None, text_file: Path | None) -> str:
    from tfcli.errors import TfcliError

    source = _read_text(text, text_file, "text", "--text")
    if source is None:
        raise TfcliError("no text given", hint="pass --text TEXT or --text-file FILE")
    return source


def _single_format(output_format: str | None, output: Path | None, json_output: bool, start: int, key_start: int, summary: bool) -> str:
    """The single-run view's format, and every option that cannot go with it refused before any work."""
    from tfcli.errors import TfcliError
    from tfcli.inspect.session import check_output, resolve_format

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
    return fmt


def _single(request, fmt: str, output: Path | None, *, start: int, key_start: int, json_output: bool) -> None:
    """Capture one run (or two side by side) and show or write it in `fmt`."""
    import time

    from tfcli.inspect.session import attention_document, html_page, neuron_document, png_image, save_document, write_document, write_output
    from tfcli.inspect.session import inspect_attention as run_inspection

    began = time.perf_counter()
    console = stderr_console()
    with console.status("capturing attention"):
        inspection = run_inspection(request)
    captured = time.perf_counter()
    if fmt == "terminal":
        from tfcli.inspect.terminal import neuron_table, render_inspection

        out = stdout_console()
        width = out.width if out.width != PIPED_WIDTH else 80  # a map is drawn for a screen, also in a file
        shown = (
            [neuron_table(neuron_document(inspection))] if inspection.neuron else render_inspection(inspection, width=width, start=start, key_start=key_start)
        )
        for renderable in shown:
            out.print(renderable, soft_wrap=False, crop=True)
        return
    if fmt == "json" and inspection.neuron is not None:
        document = neuron_document(inspection)
        if output is None:
            from tfcli.cli.common import print_json

            print_json(document)
            return
        save_document(output, document)
    elif fmt == "json":
        # --json: the data of what the terminal shows (summary, changes or a token's rows need no full maps)
        weights = not json_output or (not request.summary and request.compare_run is None and request.token is None)
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
    from rich.text import Text

    for note in inspection.notes:
        console.print(Text(note, style="dim"))
    done = time.perf_counter()
    console.print(
        Text(
            f"wrote {output} ({human_bytes(output.stat().st_size)}) in {done - began:.1f} s "
            f"(loading and capture {captured - began:.1f} s, writing {done - captured:.1f} s)"
        )
    )


def _across_format(output_format: str | None, output: Path | None, json_output: bool) -> str:
    from tfcli.errors import TfcliError
    from tfcli.inspect.session import check_output, resolve_format

    if json_output:
        if output_format not in (None, "json", "terminal") or output is not None:
            raise TfcliError("--json prints JSON to stdout", hint="drop --format and -o, or use --format json -o FILE")
        return "json"
    fmt = resolve_format(output_format, output)
    if output is not None:
        check_output(output)
    return fmt


def _across(run, text, attention, layer, head, pattern, output_format, output, device, json_output) -> None:
    """inspect-attention --checkpoints: the detector scores of every kept checkpoint (a table, or JSON), or
    with one head chosen (or a png or html) that head's pattern at every step, drawn as the single-run view."""
    from tfcli.errors import TfcliError
    from tfcli.inspect import across as views
    from tfcli.inspect.capture import check_layer_and_head, parse_layers_and_heads, split_layer_head
    from tfcli.inspect.session import save_document, write_output
    from tfcli.inspect.stats import PATTERNS

    if pattern not in PATTERNS:
        raise TfcliError(f"unknown --pattern {pattern!r}", hint=f"use one of {', '.join(PATTERNS)}")
    fmt = _across_format(output_format, output, json_output)
    check_layer_and_head(layer, head)  # before any checkpoint is read; the ranges after
    layer_spec, head_spec = split_layer_head(layer, head)
    one_head = layer_spec is not None and head_spec is not None and "all" not in (layer_spec.strip().lower(), head_spec.strip().lower())
    if fmt in ("png", "html") and not one_head and (layer is not None or head is not None):
        raise TfcliError("--checkpoints draws one head's pattern in a png or html file", hint="pick it with --head LAYER.HEAD, or drop --layer and --head")
    with stderr_console().status("capturing every checkpoint"):
        across = views.across_checkpoints(run, text, kind=attention, device=device, keep_weights=one_head or fmt in ("png", "html"))
    chosen = None
    if one_head:
        layers, heads = parse_layers_and_heads(layer, head, across.n_layers, across.n_heads)
        chosen = (layers[0], heads[0])
    elif fmt in ("png", "html"):
        chosen = views.best_head(across, pattern)
        stderr_console().print(f"layer {chosen[0]}, head {chosen[1]}: the best {pattern} score at the last step (--head L.H picks another)", style="dim")
    out = stdout_console()
    width = out.width if out.width != PIPED_WIDTH else 80
    if fmt == "json":
        document = across.to_json() if chosen is None else views.head_document(across, *chosen)
        if output is None:
            import sys

            from tfcli.inspect.session import write_document

            write_document(sys.stdout, document)
            sys.stdout.flush()
        else:
            save_document(output, document)
    elif fmt == "png":
        write_output(output, views.head_png(across, *chosen, pattern))
    elif fmt == "html":
        write_output(output, views.head_page(across, *chosen))
    else:
        from rich.text import Text

        from tfcli.cli.common import print_table
        from tfcli.inspect.tables import across_view

        shown = views.head_view(across, *chosen, width=width) if chosen is not None else []
        if chosen is None:
            layers, heads = parse_layers_and_heads(layer, head, across.n_layers, across.n_heads, None, None)
            shown = across_view(across, pattern, layers, heads, width=width)
            best = views.best_head(across, pattern)
            shown.append(
                Text(f"--head L.H shows one head's pattern at each step (the best {pattern} score at the last step: --head {best[0]}.{best[1]})", style="dim")
            )
        for renderable in shown:
            print_table(out, renderable)
    if output is not None:
        stderr_console().print(f"wrote {output} ({human_bytes(output.stat().st_size)})", highlight=False)
