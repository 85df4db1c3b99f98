"""What `tfcli inspect-attention` does, as a plain function: load the run(s), capture the weights of one
or two texts, pick layers and heads, and add a head summary, a focus token or a run comparison. The
writers (JSON, HTML, PNG) turn the result into files; the terminal renderer lives in `terminal.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import IO, Any

import numpy as np

from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_open, atomic_write_bytes, atomic_write_text
from tfcli.inspect import png
from tfcli.inspect.capture import (
    AttentionCapture,
    capture_attention,
    check_comparable,
    check_layer_and_head,
    find_token,
    parse_index,
    parse_layers_and_heads,
    summarize_capture,
)
from tfcli.inspect.html import neuron_data, neuron_heads, render_page
from tfcli.inspect.labels import excerpts, kind_label
from tfcli.inspect.neuron import capture_query_keys, neuron_view
from tfcli.inspect.stats import HeadChange, HeadSummary, head_changes
from tfcli.jsontext import dumps_json
from tfcli.loader import load_run

FORMATS: tuple[str, ...] = ("terminal", "html", "png", "json")
SUFFIXES = {".html": "html", ".htm": "html", ".png": "png", ".json": "json"}
JSON_FORMAT = "tfcli-attention"
JSON_VERSION = 1


@dataclasses.dataclass
class InspectRequest:
    run: Path
    text: str
    target: str | None = None  # encoder-decoder: the decoder's text (`text` is the source)
    attention: str | None = None  # encoder | decoder | cross (default: the model's own; cross for encoder-decoder)
    layer: str | None = None  # a number, "all", or None for the view's default
    head: str | None = None  # a number, "all", LAYER.HEAD (which names the layer too), or None
    token: str | None = None
    occurrence: int = 1
    summary: bool = False
    compare: str | None = None  # a second text (a second source, for an encoder-decoder)
    compare_run: Path | None = None
    crop: bool = False
    device: str = "auto"
    select_all_by_default: bool = False  # the JSON export: every layer and head unless told
    neuron: str | None = None  # "LAYER.HEAD": the neuron view of that head (with `query`)
    query: int | None = None  # the neuron view's query position (default: the --token's, else the last)


@dataclasses.dataclass
class Inspection:
    captures: list[AttentionCapture]  # one, or two side by side (--compare, --compare-run)
    titles: list[str]
    layers: list[int]  # the layers and heads to show or export
    heads: list[int]
    focus: list[int] | None = None  # --token: the query position, per capture
    focus_note: str = ""
    summaries: list[list[HeadSummary]] | None = None  # per capture, for the selected heads
    changes: list[HeadChange] | None = None  # --compare-run: every head, most changed first
    checkpoint: Any = None  # the first run, loaded: the page's head labels and q and k read it again
    neuron: tuple[int, int] | None = None  # --neuron LAYER.HEAD
    query: int | None = None  # the neuron view's query position

    @property
    def first(self) -> AttentionCapture:
        return self.captures[0]

    @property
    def notes(self) -> list[str]:
        seen: list[str] = []
        for capture, title in zip(self.captures, self.titles):
            for note in capture.notes:
                line = f"{title}: {note}" if len(self.captures) > 1 else note
                if line not in seen:
                    seen.append(line)
        return seen


def inspect_attention(request: InspectRequest) -> Inspection:
    """Load, capture and select; every user mistake is a TfcliError before anything is written."""
    if request.compare is not None and request.compare_run is not None:
        raise TfcliError("--compare and --compare-run cannot be used together", hint="compare two texts or two runs, one at a time")
    if not request.text.strip():
        raise TfcliError("the text is empty", hint="pass --text TEXT or --text-file FILE")
    if request.compare is not None and not request.compare.strip():
        raise TfcliError("the --compare text is empty", hint="pass a second text")
    if request.occurrence < 1:
        raise TfcliError(f"--occurrence must be 1 or more, not {request.occurrence}")
    check_layer_and_head(request.layer, request.head)
    checkpoint = load_run(request.run, "inspect", request.device)
    first = capture_attention(checkpoint, request.text, target=request.target, kind=request.attention, crop=request.crop)
    text = first.text  # as far as --crop kept it: a title of a whole long text would split every word of it
    title = excerpts([text])[0] if request.target is None else f"{excerpts([text], 30)[0]} → {excerpts([request.target], 24)[0]}"
    captures, titles = [first], [title]
    other_checkpoint = None
    if request.compare is not None:
        captures.append(capture_attention(checkpoint, request.compare, target=request.target, kind=first.kind, crop=request.crop))
        titles = [f"{n}: {excerpt}" for n, excerpt in enumerate(excerpts([text, captures[1].text]), 1)]  # never alike
    if request.compare_run is not None:
        other_checkpoint = load_run(request.compare_run, "inspect", request.device)
        check_comparable(checkpoint, other_checkpoint)
        captures.append(capture_attention(other_checkpoint, request.text, target=request.target, kind=first.kind, crop=request.crop))
        titles = excerpts([str(request.run), str(request.compare_run)], 60)

    changes = head_changes(captures[0].weights, captures[1].weights) if request.compare_run is not None else None
    many = request.select_all_by_default or request.summary
    default_layer = None if many else 0
    default_head = None if many or request.token is not None else 0
    if changes and not many and request.layer is None and request.head is None:
        default_layer, default_head = changes[0].layer, changes[0].head  # show the head that changed most
    layers, heads = parse_layers_and_heads(request.layer, request.head, first.n_layers, first.n_heads, default_layer, default_head)

    inspection = Inspection(captures=captures, titles=titles, layers=layers, heads=heads, changes=changes, checkpoint=checkpoint)
    if request.neuron is not None:
        inspection.neuron = parse_neuron(request.neuron, first.n_layers, first.n_heads)
    elif request.query is not None:
        raise TfcliError("--query picks the neuron view's query token", hint="pass --neuron LAYER.HEAD with it")
    if request.token is not None:
        position, inspection.focus_note = find_token(first.queries, request.token, request.occurrence, first.queries_from)
        inspection.focus = [position]
        for capture, title in zip(captures[1:], titles[1:]):
            try:
                inspection.focus.append(find_token(capture.queries, request.token, request.occurrence, capture.queries_from)[0])
            except TfcliError as exc:
                raise TfcliError(
                    f"--token {request.token!r} (occurrence {request.occurrence}) is not in the second text ({title})", hint="pick a word both texts have"
                ) from exc
    if request.query is not None:
        if not 0 <= request.query < len(first.queries):
            last = len(first.queries) - 1
            raise TfcliError(
                f"--query {request.query} is out of range: the text has {len(first.queries)} tokens (0 to {last})", hint=f"pick one from 0 to {last}"
            )
        inspection.query = request.query
    elif inspection.neuron is not None:
        inspection.query = inspection.focus[0] if inspection.focus else len(first.queries) - 1
    if request.summary:
        inspection.summaries = []
        for capture, checkpoint_used in zip(captures, [checkpoint, other_checkpoint or checkpoint]):
            summaries = summarize_capture(checkpoint_used, capture)
            inspection.summaries.append([s for s in summaries if s.layer in layers and s.head in heads])
    return inspection


def parse_neuron(spec: str, n_layers: int, n_heads: int) -> tuple[int, int]:
    """--neuron LAYER.HEAD -> (layer, head); negative numbers count from the end. Example: "1.0" -> (1, 0)"""
    layer, dot, head = spec.partition(".")
    if not dot or not layer.strip().lstrip("-").isdigit() or not head.strip().lstrip("-").isdigit():
        raise TfcliError(f"--neuron {spec!r} is not LAYER.HEAD", hint="write 1.0 for layer 1, head 0")
    written = f"--neuron {spec}"  # named as the user wrote it: --neuron 1.9, not --head 9
    return parse_index(layer.strip(), n_layers, "layer", written=written)[0], parse_index(head.strip(), n_heads, "head", written=written)[0]


def neuron_document(inspection: Inspection) -> dict[str, Any]:
    """--neuron L.H --format json: the numbers behind one head's weights for one query (`neuron.NeuronView`)."""
    first = inspection.first
    qk = capture_query_keys(inspection.checkpoint.model, first)
    view = neuron_view(first, qk, *inspection.neuron, inspection.query)
    return {"run": first.run, "attention": first.kind, "text": first.text, **view.to_json()}


# ---- output files ------------------------------------------------------------------------------------


def resolve_format(fmt: str | None, output: Path | None) -> str:
    """--format, or the one -o's suffix implies; terminal when neither says."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise TfcliError(f"unknown format {fmt!r}", hint=f"use one of {', '.join(FORMATS)}")
        if fmt == "terminal" and output is not None:
            raise TfcliError("the terminal format prints to the screen; -o is for html, png and json", hint="drop -o, or pass --format html|png|json")
        if fmt in ("html", "png") and output is None:
            raise TfcliError(f"--format {fmt} writes a file", hint=f"pass -o FILE.{fmt}")
        implied = SUFFIXES.get(output.suffix.lower()) if output is not None else None
        if implied is not None and implied != fmt:
            raise TfcliError(f"--format {fmt} but -o {output} ends in {output.suffix}", hint=f"name the file .{fmt}, or drop --format")
        return fmt
    if output is None:
        return "terminal"
    if output.suffix.lower() in SUFFIXES:
        return SUFFIXES[output.suffix.lower()]
    raise TfcliError(f"cannot tell the format from {output}", hint="end it in .html, .png or .json, or pass --format")


def check_output(path: Path) -> None:
    """Before any work: the file's folder exists and is writable, and the path is not a folder."""
    if path.is_dir():
        raise TfcliError(f"output {path} is a folder", hint="pass a file name with -o")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise TfcliError(f"the folder of {path} does not exist", hint=f"create {parent} first or pick another path with -o")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TfcliError(f"cannot write to the folder of {path}", hint="pick another path with -o or fix its permissions")
    if path.exists() and not os.access(path, os.W_OK):
        raise TfcliError(f"{path} exists and is not writable", hint="pick another path with -o")


def write_output(path: Path, data: bytes | str) -> None:
    """Atomically: a temp file beside it, fsynced, renamed; a failure leaves nothing behind."""
    try:
        if isinstance(data, bytes):
            atomic_write_bytes(path, data)
        else:
            atomic_write_text(path, data)
    except OSError as exc:
        raise TfcliError(f"cannot write {path}: {exc.strerror or exc}", hint="pick another path with -o") from exc


def _views(views) -> list[dict[str, Any]]:
    return [v.to_json() for v in views]


def attention_document(inspection: Inspection, *, weights: bool = True) -> dict[str, Any]:
    """The JSON form: tokens, the selected layers and heads, their weights [layer][head][query][key]
    (rounded to 6 decimals; written by `write_document`), and the summary, focus token and run
    comparison when asked for."""
    first = inspection.first
    doc: dict[str, Any] = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "attention": first.kind,
        "self_attention": first.self_attention,
        "causal": first.causal,
        "n_layers": first.n_layers,
        "n_heads": first.n_heads,
        "layers": inspection.layers,
        "heads": inspection.heads,
        "captures": [],
    }
    sub = np.ix_(inspection.layers, inspection.heads)
    for index, (capture, title) in enumerate(zip(inspection.captures, inspection.titles)):
        entry: dict[str, Any] = {
            "title": title,
            "run": capture.run,
            "text": capture.text,
            "target": capture.target,
            "queries": _views(capture.queries),
            "notes": capture.notes,
        }
        if not capture.self_attention:
            entry["keys"] = _views(capture.keys)
        selected = capture.weights[sub]  # (layers, heads, T, S)
        if weights:
            entry["weights"] = StreamedArray(selected)
        if inspection.focus is not None:
            position = inspection.focus[index]
            entry["focus"] = {
                "position": position,
                "text": capture.queries[position].text,
                "weights": np.round(selected[:, :, position, :].astype(np.float64), 6).tolist(),
            }
        if inspection.summaries is not None:
            entry["summary"] = [s.to_json() for s in inspection.summaries[index]]
        doc["captures"].append(entry)
    if inspection.changes is not None:
        doc["changes"] = [c.to_json() for c in inspection.changes]
    return doc


@dataclasses.dataclass(frozen=True)
class StreamedArray:
    """An array in a document that `write_document` streams into the file where it stands, one 2-D slice
    at a time, each number rounded to `decimals`: it never exists as one Python list or string.

    Example: StreamedArray(np.array([[[0.1234567, 1.0]], [[0.5, 0.5]]])) -> '[[[0.123457, 1.0]],\n[[0.5, 0.5]]]'
    """

    array: np.ndarray
    decimals: int = 6

    def write(self, handle: IO[str]) -> None:
        _write_slices(handle, self.array, self.decimals)


def _write_slices(handle: IO[str], array: np.ndarray, decimals: int) -> None:
    if array.ndim <= 2:
        handle.write(json.dumps(np.round(array.astype(np.float64), decimals).tolist(), allow_nan=False))
        return
    handle.write("[")
    for index in range(array.shape[0]):
        if index:
            handle.write(",\n")
        _write_slices(handle, array[index], decimals)
    handle.write("]")


JSON_INDENT = 1


def write_document(handle: IO[str], document: dict[str, Any]) -> None:
    """Write the document as JSON text, streaming each `StreamedArray` in place and laying out the rest as
    `json.dumps(document, indent=1, ensure_ascii=False)` would: a big export (all 144 heads of a 512-token
    gpt2-small capture are 37.7M numbers) never exists as one Python list or string. The arrays are found
    by their type as the document is walked, so no text in it (a user's, a token's, a path) can stand for one."""
    _write_value(handle, document, level=0)
    handle.write("\n")


def _write_value(handle: IO[str], value: Any, level: int) -> None:
    if isinstance(value, StreamedArray):
        value.write(handle)
    elif isinstance(value, dict) and value:
        _write_items(handle, "{", "}", [(_json_key(key) + ": ", item) for key, item in value.items()], level)
    elif isinstance(value, (list, tuple)) and value:
        _write_items(handle, "[", "]", [("", item) for item in value], level)
    else:
        handle.write(_json_scalar(value))


def _write_items(handle: IO[str], opening: str, closing: str, items: list[tuple[str, Any]], level: int) -> None:
    inner = "\n" + " " * (JSON_INDENT * (level + 1))
    handle.write(opening)
    for index, (prefix, item) in enumerate(items):
        handle.write(("," if index else "") + inner + prefix)
        _write_value(handle, item, level + 1)
    handle.write("\n" + " " * (JSON_INDENT * level) + closing)


def _json_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"document keys must be str, not {type(key).__name__} ({key!r})")
    return _json_scalar(key)


def _json_scalar(value: Any) -> str:
    """A string, number, bool or None (or an empty list or dict) as JSON; anything else is a TypeError."""
    return dumps_json(value)


def save_document(path: Path, document: dict[str, Any]) -> None:
    """`write_document` into `path` atomically."""
    try:
        with atomic_open(path, "w", encoding="utf-8", newline="\n") as handle:
            write_document(handle, document)
    except OSError as exc:
        raise TfcliError(f"cannot write {path}: {exc.strerror or exc}", hint="pick another path with -o") from exc


def html_page(inspection: Inspection) -> str:
    """The page, with every head's pattern label on the model view and q and k for the neuron view."""
    summary = inspection.summaries[0] if inspection.summaries else None
    return render_page(inspection.captures, inspection.titles, **page_options(inspection), summary=summary, changes=inspection.changes)


def page_options(inspection: Inspection) -> dict[str, Any]:
    """What the page shows first (layer, head, focus) and what the model and neuron views read."""
    first = inspection.first
    layer, head = inspection.neuron or (inspection.layers[0], inspection.heads[0])
    focus = inspection.focus
    if inspection.query is not None:
        focus = [inspection.query] * len(inspection.captures)
    options: dict[str, Any] = {"layer": layer, "head": head, "focus": focus, "labels": None, "neuron": None}
    if inspection.checkpoint is not None:
        options["labels"] = summarize_capture(inspection.checkpoint, first)
        qk = capture_query_keys(inspection.checkpoint.model, first)
        options["neuron"] = neuron_data(qk, neuron_heads(qk, (layer, head)))
    return options


def png_image(inspection: Inspection) -> bytes:
    """A heatmap for one head, a grid for several, or the focus token's attention per head."""
    first = inspection.first
    kind = kind_label(first)
    pairs = [(layer, head) for layer in inspection.layers for head in inspection.heads]
    if inspection.focus is not None:
        items = []
        for capture, title, position in zip(inspection.captures, inspection.titles, inspection.focus):
            rows = np.stack([capture.weights[layer, head, position] for layer, head in pairs])  # (pairs, S)
            label = capture.queries[position].label
            items.append(
                (
                    f"{title}: where '{label.strip() or '␣'}' (position {position}) looks",
                    rows,
                    [f"L{layer} H{head}" for layer, head in pairs],
                    [v.label for v in capture.keys],
                )
            )
        return png.token_png(items, suptitle=kind)
    if len(pairs) == 1:
        layer, head = pairs[0]
        items = [
            (f"{title} · layer {layer}, head {head}", capture.weights[layer, head], [v.label for v in capture.queries], [v.label for v in capture.keys])
            for capture, title in zip(inspection.captures, inspection.titles)
        ]
        return png.heatmaps_png(items, suptitle=kind)
    maps = []
    for layer, head in pairs:
        for index, capture in enumerate(inspection.captures):
            prefix = f"{index + 1}: " if len(inspection.captures) > 1 else ""
            maps.append((f"{prefix}L{layer} H{head}", capture.weights[layer, head]))
    per_layer = len(inspection.heads) * len(inspection.captures)
    columns = per_layer if len(inspection.layers) > 1 and per_layer <= 16 else min(len(maps), 6 if len(inspection.captures) > 1 else 4)
    titles = inspection.titles[0]
    if len(inspection.captures) > 1:  # --compare's titles are numbered already, --compare-run's are the runs
        titles = "  |  ".join(t if t.startswith(f"{n}: ") else f"{n}: {t}" for n, t in enumerate(inspection.titles, 1))
    return png.grid_png(maps, columns, suptitle=f"{kind} · {titles}")
