"""What a run directory holds beyond the model: the trainer state that makes `--resume` exact, and
metrics.jsonl.

RUN/trainer/ holds optimizer.safetensors (AdamW's state as `NAME/KEY`, Muon's as `muon/NAME/KEY`) and
state.json (step, tokens seen, elapsed time, world size, the data's fingerprint, the checksum of the
model.safetensors it belongs to, the best validation loss and the evaluations since it). A save stages the new trainer
folder as RUN/trainer.next, writes the model, then swaps the folders; the old trainer state is deleted only
once the new checkpoint is complete. Resume takes whichever trainer folder matches the weights on disk, so
a crash at any point of a save leaves a consistent checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import safetensors.torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_write_text, describe_write_error, fsync_dir, fsync_file, set_default_mode, sha256_file
from tfcli.jsontext import loads_json
from tfcli.rundir import CONFIG_FILE, weights_path
from tfcli.schema import JsonRecord
from tfcli.tensorfile import safetensors_path

TRAINER_DIR = "trainer"
STAGED_TRAINER_DIR = "trainer.next"
OLD_TRAINER_DIR = "trainer.prev"
STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
METRICS_FILE = "metrics.jsonl"
BEST_DIR = "best"
LOSS_PLOT = "loss.png"
TRAINER_FORMAT = 1


@dataclasses.dataclass
class TrainerState(JsonRecord):
    """RUN/trainer/state.json. Random draws derive from (seed, step, rank), so the step is the data position
    and the random state both."""

    format_version: int
    step: int
    tokens_seen: int
    elapsed_seconds: float
    world_size: int
    data_fingerprint: str
    tokenizer_sha256: str
    model_sha256: str = ""
    best_val_loss: float | None = None
    best_step: int | None = None  # the step of best_val_loss
    evals_since_best: int = 0  # evaluations in a row without a lower validation loss (--early-stop counts them)
    # the loss summed since the last metrics record, and the targets it covers (all ranks), so a resumed
    # run writes the records an uninterrupted one would
    window_loss: float = 0.0
    window_count: int = 0


def stage_trainer_state(run_dir: Path, state: TrainerState, optimizer_tensors: dict[str, Any], weights: Path) -> None:
    """Write RUN/trainer.next/ for the weights staged at `weights` (called before they are renamed into place)."""
    staged = run_dir / STAGED_TRAINER_DIR
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    try:
        safetensors.torch.save_file(optimizer_tensors, str(staged / OPTIMIZER_FILE), metadata={"format": "pt"})
        set_default_mode(staged / OPTIMIZER_FILE)
        fsync_file(staged / OPTIMIZER_FILE)
        state = dataclasses.replace(state, model_sha256=sha256_file(weights))
        atomic_write_text(staged / STATE_FILE, json.dumps(state.to_json(), indent=2, allow_nan=False) + "\n")
        fsync_dir(staged)
    except BaseException:  # a full disk, a signal: no half-written state is left to be mistaken for one
        shutil.rmtree(staged, ignore_errors=True)
        raise


def read_optimizer_tensors(path: Path) -> dict[str, Any]:
    """RUN/trainer/optimizer.safetensors, or one line on what is wrong with it. safetensors checks the header
    against the file's size before it allocates anything, so a header that claims huge tensors costs nothing."""
    try:
        return load_file(safetensors_path(path))
    except (SafetensorError, OSError) as exc:
        raise TfcliError(
            f"{path} is not a valid safetensors file ({describe_write_error(exc)})",
            hint="the trainer state was damaged outside tfcli; start a new run, or restore the folder",
        ) from exc


def commit_trainer_state(run_dir: Path) -> None:
    """Swap RUN/trainer.next into RUN/trainer, then delete the old state."""
    current, staged, old = run_dir / TRAINER_DIR, run_dir / STAGED_TRAINER_DIR, run_dir / OLD_TRAINER_DIR
    shutil.rmtree(old, ignore_errors=True)
    if current.exists():
        os.replace(current, old)
    os.replace(staged, current)
    fsync_dir(run_dir)
    shutil.rmtree(old, ignore_errors=True)


STATE_MINIMUMS = {
    "step": 0,
    "tokens_seen": 0,
    "elapsed_seconds": 0,
    "world_size": 1,
    "best_val_loss": 0,
    "best_step": 0,
    "evals_since_best": 0,
    "window_loss": 0,
    "window_count": 0,
}


def check_state_ranges(path: Path, state: TrainerState) -> None:
    """Every number of state.json in its range (a negative step would train steps -3, -2, ... at a negative
    learning rate, which is gradient ascent); the file and the key in the message."""
    for name, minimum in STATE_MINIMUMS.items():
        value = getattr(state, name)
        if value is not None and value < minimum:
            raise TfcliError(
                f"{path}: {name} is {value}, less than {minimum}", hint="the file was edited or damaged; restore the run folder or start a new run"
            )


def find_trainer_state(run_dir: Path, weights: Path | None = None) -> tuple[Path, TrainerState]:
    """The trainer folder whose state belongs to `weights`: by default RUN/model.safetensors (an adapter run's
    adapter_model.safetensors)."""
    if weights is None:
        weights = weights_path(run_dir) if (run_dir / CONFIG_FILE).is_file() else run_dir / "model.safetensors"
    candidates = [run_dir / name for name in (TRAINER_DIR, STAGED_TRAINER_DIR, OLD_TRAINER_DIR)]
    if not weights.is_file() or not any((c / STATE_FILE).is_file() for c in candidates):
        raise TfcliError(
            f"{run_dir} holds no checkpoint to resume from",
            hint="start the run without --resume (a run saves its first checkpoint at --save-every or at the end)",
        )
    checksum = sha256_file(weights)
    for folder in candidates:
        if (folder / STATE_FILE).is_file() and (folder / OPTIMIZER_FILE).is_file():
            state = TrainerState.load(folder / STATE_FILE)
            if state.format_version != TRAINER_FORMAT:
                raise TfcliError(f"{folder / STATE_FILE} has trainer format {state.format_version}; this tfcli reads {TRAINER_FORMAT}")
            check_state_ranges(folder / STATE_FILE, state)
            if state.model_sha256 == checksum:
                return folder, state
    raise TfcliError(
        f"the trainer state in {run_dir} does not belong to its model.safetensors",
        hint="the checkpoint was damaged outside tfcli; start a new run or restore the folder",
    )


METRICS_LINE_BYTES = 1 << 20  # far more than any record; a longer "line" is damage (a crash's NUL bytes), not one


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of metrics.jsonl up to the first line that is not one (cut short by a crash, or damaged),
    read line by line: a damaged file of gigabytes costs no more than its good part."""
    records = []
    if path.is_file():
        with open(path, "rb") as handle:
            while line := handle.readline(METRICS_LINE_BYTES):
                if not line.endswith(b"\n") and len(line) == METRICS_LINE_BYTES:
                    break
                line = line.strip()
                if line:
                    try:
                        record = loads_json(line)
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        break  # a line cut short by a crash ends the usable history
                    if not isinstance(record, dict):
                        break
                    records.append(record)
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the records up to `step` (the checkpoint a resumed run continues from); drop the rest."""
    records = [r for r in read_metrics(path) if isinstance(r.get("step"), int) and r["step"] <= step]
    atomic_write_text(path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in records))


def strict_json(record: dict[str, Any]) -> dict[str, Any]:
    """The record with NaN and infinities as null: metrics files are strict JSON."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}


class MetricsWriter:
    """Appends one strict-JSON line per logged step to RUN/metrics.jsonl, and gives each record to the
    experiment trackers (`--log-to`, tfcli/train/tracking.py)."""

    def __init__(self, path: Path, trackers: list[Any] | None = None) -> None:
        self.path = path
        self.handle = open(path, "a", encoding="utf-8")
        self.trackers = trackers or []

    def write(self, record: dict[str, Any]) -> None:
        self._append(record)
        for tracker in self.trackers:
            tracker.log(self._last)

    def _append(self, record: dict[str, Any]) -> None:
        record = strict_json(record)
        self._last_start, self._last = self.handle.tell(), record
        self.handle.write(json.dumps(record, allow_nan=False) + "\n")
        self.handle.flush()

    def amend(self, extra: dict[str, Any]) -> dict[str, Any]:
        """Add `extra` to the record written last (the final evaluation of a step already logged); return it.
        The trackers get only `extra`, at the record's step."""
        self.handle.truncate(self._last_start)
        self.handle.seek(self._last_start)
        self._append({**self._last, **extra})
        for tracker in self.trackers:
            tracker.log(strict_json({"step": self._last["step"], **extra}))
        return self._last

    def sync(self) -> None:
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()
        for tracker in self.trackers:
            tracker.close()
