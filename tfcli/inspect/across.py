"""`tfcli inspect-attention RUN --checkpoints`: the head detector scores (previous-token, first-token,
duplicate, induction) of every checkpoint a run kept (`train ... --keep-checkpoints N`), step by step, so an
induction head can be watched forming. Each checkpoint is captured as `inspect-attention --summary` would."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from tfcli.errors import TfcliError
from tfcli.inspect.stats import PATTERNS
from tfcli.jsontext import loads_json

ACROSS_FORMAT = "tfcli-attention-across"
ACROSS_VERSION = 1
KEPT_DIR = "checkpoints"  # as tfcli.train.saving.KEPT_DIR


def _step(run: Path) -> int | None:
    try:
        training = loads_json((run / "config.json").read_text(encoding="utf-8")).get("training") or {}
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
    final = _step(Path(run))
    if final is None or final > kept[-1][0]:
        kept.append((final if final is not None else kept[-1][0] + 1, Path(run)))
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


def across_checkpoints(run: Path, text: str, *, kind: str | None = None, device: str = "auto") -> Across:
    """The detector scores of every head at every kept checkpoint of `run`, on `text` (previous-token,
    first-token) and on a repeated random sequence (duplicate, induction)."""
    from tfcli.inspect.capture import capture_attention, load_run, probe
    from tfcli.inspect.stats import summarize_heads

    if not text.strip():
        raise TfcliError("the text is empty", hint="pass --text TEXT")
    entries = kept_runs(run)
    steps: list[int] = []
    paths: list[str] = []
    shape = None
    scores: dict[str, list[np.ndarray]] = {name: [] for name in PATTERNS}
    for step, path in entries:
        checkpoint = load_run(path, device)
        capture = capture_attention(checkpoint, text, kind=kind)
        if shape is None:
            shape = (capture.n_layers, capture.n_heads)
        elif shape != (capture.n_layers, capture.n_heads):
            raise TfcliError(f"{path} has another shape than the checkpoints before it", hint="keep checkpoints of one run only")
        probed = probe(checkpoint, capture)
        summaries = summarize_heads(
            capture.weights,
            capture.query_ids if capture.self_attention else None,
            causal=capture.causal,
            probe_weights=None if probed is None else probed[0],
            probe_ids=None if probed is None else probed[1],
        )
        for name in PATTERNS:
            grid = np.full(shape, np.nan, dtype=np.float32)
            for s in summaries:
                value = s.scores.get(name)
                grid[s.layer, s.head] = np.nan if value is None else value
            scores[name].append(grid)
        steps.append(step)
        paths.append(str(path))
    return Across(
        run=str(run), text=text, steps=steps, paths=paths, n_layers=shape[0], n_heads=shape[1], scores={name: np.stack(grids) for name, grids in scores.items()}
    )
