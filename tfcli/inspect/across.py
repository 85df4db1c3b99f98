"""`tfcli inspect-attention RUN --checkpoints`: the head detector scores (previous-token, first-token,
duplicate, induction) of every checkpoint a run kept (`train ... --keep-checkpoints N`), step by step, and
one head's pattern at each of them, so an induction head can be watched forming. Each checkpoint is
captured as `inspect-attention --summary` would; one head's view is an `Inspection` with a capture per
checkpoint, drawn by the single-run renderers (terminal grid, PNG grid, the HTML page, the JSON document)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table
from rich.text import Text

from tfcli.errors import TfcliError
from tfcli.inspect import png
from tfcli.inspect.capture import AttentionCapture, capture_attention, summarize_capture
from tfcli.inspect.html import render_page
from tfcli.inspect.labels import kind_label
from tfcli.inspect.session import Inspection, attention_document
from tfcli.inspect.stats import PATTERNS
from tfcli.inspect.terminal import LEGEND, grid
from tfcli.jsontext import loads_json
from tfcli.limits import read_text_capped
from tfcli.loader import load_run

if TYPE_CHECKING:
    from rich.console import RenderableType


ACROSS_FORMAT = "tfcli-attention-across"
ACROSS_VERSION = 1
KEPT_DIR = "checkpoints"  # as tfcli.train.saving.KEPT_DIR


def _step(run: Path) -> int | None:
    try:
        training = loads_json(read_text_capped(run / "config.json")).get("training") or {}
    except (OSError, ValueError):
        return None
    step = training.get("step")
    return step if isinstance(step, int) else None


def kept_runs(run: Path) -> list[tuple[int, Path]]:
    """The checkpoints RUN kept, oldest first, then RUN itself (unless it is the last one kept).

    Example: runs/x with checkpoints/step-0000100 and step-0000200, trained to 300 -> [(100, ...), (200, ...), (300, runs/x)]
    """
    folder = Path(run) / KEPT_DIR
    kept = []
    if folder.is_dir():
        for child in folder.iterdir():
            if child.is_dir() and child.name.startswith("step-") and child.name[5:].isdigit() and (child / "config.json").is_file():
                kept.append((int(child.name[5:]), child))
    if not kept:
        raise TfcliError(f"{run} kept no checkpoints (no {KEPT_DIR}/step-N folders)", hint="train with --keep-checkpoints N to keep every N-th step's weights")
    kept.sort()
    final = _step(Path(run))  # None while the run is still training (no config.json yet): the kept ones only
    if final is not None and final > kept[-1][0]:
        kept.append((final, Path(run)))
    return kept


@dataclasses.dataclass
class Across:
    run: str
    text: str
    steps: list[int]
    paths: list[str]
    n_layers: int
    n_heads: int
    scores: dict[str, np.ndarray]  # pattern -> (checkpoints, L, H)
    captures: list[AttentionCapture] | None = None  # one per checkpoint, when asked for (one head's view)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": ACROSS_FORMAT,
            "version": ACROSS_VERSION,
            "run": self.run,
            "text": self.text,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "checkpoints": [
                {"step": s, "path": p, "scores": {k: np.round(v[i].astype(np.float64), 4).tolist() for k, v in self.scores.items()}}
                for i, (s, p) in enumerate(zip(self.steps, self.paths))
            ],
        }


def across_checkpoints(run: Path, text: str, *, kind: str | None = None, device: str = "auto", keep_weights: bool = False) -> Across:
    """The detector scores of every head at every kept checkpoint of `run`, on `text` (previous-token,
    first-token) and on a repeated random sequence (duplicate, induction); with `keep_weights`, each
    checkpoint's capture of `text` too."""
    if not text.strip():
        raise TfcliError("the text is empty", hint="pass --text TEXT")
    entries = kept_runs(run)
    steps: list[int] = []
    paths: list[str] = []
    shape = None
    scores: dict[str, list[np.ndarray]] = {name: [] for name in PATTERNS}
    captures: list[AttentionCapture] = []
    for step, path in entries:
        checkpoint = load_run(path, "inspect", device)
        capture = capture_attention(checkpoint, text, kind=kind)
        if keep_weights:
            captures.append(capture)
        if shape is None:
            shape = (capture.n_layers, capture.n_heads)
        elif shape != (capture.n_layers, capture.n_heads):
            raise TfcliError(f"{path} has another shape than the checkpoints before it", hint="keep checkpoints of one run only")
        summaries = summarize_capture(checkpoint, capture)
        for name in PATTERNS:
            grid = np.full(shape, np.nan, dtype=np.float32)
            for s in summaries:
                value = s.scores.get(name)
                grid[s.layer, s.head] = np.nan if value is None else value
            scores[name].append(grid)
        steps.append(step)
        paths.append(str(path))
    return Across(
        run=str(run),
        text=text,
        steps=steps,
        paths=paths,
        n_layers=shape[0],
        n_heads=shape[1],
        scores={name: np.stack(grids) for name, grids in scores.items()},
        captures=captures if keep_weights else None,
    )


def best_head(across: Across, pattern: str) -> tuple[int, int]:
    """The head that scores highest on `pattern` at the last checkpoint (layer 0, head 0 if none scored).

    Example: induction scores at the last step [[0.02, 0.01], [0.03, 0.91]] -> (1, 1)
    """
    last = across.scores[pattern][-1]
    if np.all(np.isnan(last)):
        return 0, 0
    layer, head = np.unravel_index(int(np.nanargmax(last)), last.shape)
    return int(layer), int(head)


def head_scores(across: Across, layer: int, head: int) -> list[dict[str, float | None]]:
    """Per checkpoint, each pattern's score of one head (None where it was not scored)."""
    out = []
    for index in range(len(across.steps)):
        values = {name: float(grid[index, layer, head]) for name, grid in across.scores.items()}
        out.append({name: None if np.isnan(v) else round(v, 4) for name, v in values.items()})
    return out


def head_inspection(across: Across, layer: int, head: int) -> Inspection:
    """One head at every kept checkpoint, as the single-run view's `Inspection`: a capture per step."""
    assert across.captures is not None, "across_checkpoints(..., keep_weights=True) keeps the captures"
    return Inspection(captures=across.captures, titles=[f"step {s}" for s in across.steps], layers=[layer], heads=[head])


def head_document(across: Across, layer: int, head: int) -> dict[str, Any]:
    """The single-run JSON document of one head (a capture per checkpoint, titled by its step), with each
    checkpoint's step, path and detector scores of that head."""
    document = attention_document(head_inspection(across, layer, head))
    document["checkpoints"] = [{"step": s, "path": p, "scores": v} for s, p, v in zip(across.steps, across.paths, head_scores(across, layer, head))]
    return document


def head_view(across: Across, layer: int, head: int, *, width: int = 80) -> list[RenderableType]:
    """The terminal view of one head across checkpoints: a small map per step (as `--head all` draws
    heads) and the head's detector scores at each step."""
    captures = across.captures or []
    first = captures[0]
    columns = min(len(captures), 4)
    bins = max(8, min(len(first.queries), 24, (width + 2) // columns - 2))  # up to four maps a row, 24 cells each
    maps = [(f"step {s}", c.weights[layer, head]) for s, c in zip(across.steps, captures)]
    drawing, note = grid(maps, width=width, bins=bins)
    header = f"{kind_label(first)} · layer {layer}, head {head} at {len(captures)} checkpoints · {len(first.queries)} tokens"
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("step", "prev", "first", "dup", "induct"):
        table.add_column(name, justify="right")
    for step, scores in zip(across.steps, head_scores(across, layer, head)):
        table.add_row(str(step), *("-" if scores[name] is None else f"{scores[name]:.2f}" for name in PATTERNS))
    notes = [note, LEGEND, "scores: previous-token and first-token on the text, duplicate and induction on a repeated random sequence"]
    notes.append("--format html shows each step's map in full, with its tokens; --head L.H picks another head")
    return [Text(header, style="bold"), drawing, table, *(Text(n, style="dim") for n in notes if n)]


def head_png(across: Across, layer: int, head: int, pattern: str) -> bytes:
    """One small map per checkpoint, titled by its step and the head's `pattern` score there."""
    captures = across.captures or []
    maps = []
    for step, capture, scores in zip(across.steps, captures, head_scores(across, layer, head)):
        score = scores[pattern]
        maps.append((f"step {step} · {pattern} {'-' if score is None else f'{score:.2f}'}", capture.weights[layer, head]))
    title = f"{kind_label(captures[0])} · layer {layer}, head {head} across checkpoints of {across.run}"
    return png.grid_png(maps, min(len(maps), 4), suptitle=title)


def head_page(across: Across, layer: int, head: int) -> str:
    """The single-run attention page with a panel per checkpoint (the layer/head picker still picks any
    head) and a table of the chosen head's scores at each step."""
    inspection = head_inspection(across, layer, head)
    rows = [[str(s), *("-" if v[name] is None else f"{v[name]:.3f}" for name in PATTERNS)] for s, v in zip(across.steps, head_scores(across, layer, head))]
    table = {"title": f"layer {layer}, head {head}: detector scores at each step (click to show)", "columns": ["step", *PATTERNS], "rows": rows}
    about = [f"{len(across.steps)} checkpoints kept by {across.run}: steps {', '.join(str(s) for s in across.steps)}"]
    return render_page(
        inspection.captures, inspection.titles, layer=layer, head=head, heading=f"attention across the checkpoints of {across.run}", about=about, table=table
    )
