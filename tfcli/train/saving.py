"""Writing a run's checkpoint (weights, config, tokenizer and trainer state, atomically) and its best/
copy, with a write failure turned into one line that says what is kept."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import SafetensorError

from tfcli.checkpoint import save_checkpoint
from tfcli.errors import TfcliError
from tfcli.fsutil import describe_write_error
from tfcli.rundir import CONFIG_FILE, read_run_config
from tfcli.train.job import TrainingJob
from tfcli.train.state import BEST_DIR, TrainerState, commit_trainer_state, stage_trainer_state

WRITE_ERRORS = (OSError, SafetensorError)  # what a save can meet: a full disk, a read-only folder


def save_run(job: TrainingJob, model, tensors: dict[str, torch.Tensor], state: TrainerState) -> Path:
    """Write the run directory (weights, config, tokenizer) with its trainer state (the optimizer's
    `tensors`), atomically."""
    had_one = (job.run_dir / CONFIG_FILE).is_file()
    try:
        save_checkpoint(
            job.run_dir,
            model,
            job.tokenizer,
            training=job.training_record(state.step),
            before_commit=lambda weights: stage_trainer_state(job.run_dir, state, tensors, weights),
            after_commit=lambda: commit_trainer_state(job.run_dir),
        )
    except WRITE_ERRORS as exc:
        raise TfcliError(
            f"cannot write the checkpoint in {job.run_dir}: {describe_write_error(exc)}",
            hint="free some space or fix the folder's permissions; "
            + ("the previous checkpoint is intact" if had_one else "the run had saved no checkpoint yet, so none is kept"),
        ) from exc
    return job.run_dir


def save_best(job: TrainingJob, model, step: int, val_loss: float) -> Path:
    had_one = (job.run_dir / BEST_DIR / CONFIG_FILE).is_file()
    try:
        save_checkpoint(job.run_dir / BEST_DIR, model, job.tokenizer, training={**job.training_record(step), "val_loss": val_loss})
    except WRITE_ERRORS as exc:
        raise TfcliError(
            f"cannot write the best checkpoint in {job.run_dir / BEST_DIR}: {describe_write_error(exc)}",
            hint="free some space or fix the folder's permissions; "
            + ("the previous best checkpoint is intact" if had_one else "there was no best checkpoint before"),
        ) from exc
    return job.run_dir / BEST_DIR


KEPT_DIR = "checkpoints"


def kept_dir(run_dir: Path, step: int) -> Path:
    """Where `--keep-checkpoints` keeps the weights of `step`. Example: kept_dir(Path("runs/x"), 500) -> runs/x/checkpoints/step-0000500"""
    return Path(run_dir) / KEPT_DIR / f"step-{step:07d}"


def save_kept(job: TrainingJob, model, step: int) -> Path:
    """Keep this step's weights as a run directory of their own (config, safetensors, tokenizer; no
    optimizer state), so any command that reads a run reads it."""
    folder = kept_dir(job.run_dir, step)
    try:
        folder.parent.mkdir(exist_ok=True)
        save_checkpoint(folder, model, job.tokenizer, training=job.training_record(step))
    except WRITE_ERRORS as exc:
        raise TfcliError(f"cannot keep the checkpoint {folder}: {describe_write_error(exc)}", hint="free some space or fix the folder's permissions") from exc
    return folder


def best_saved_val_loss(run_dir: Path) -> float | None:
    """The validation loss best/ was saved with (None when there is none, or it predates the record)."""
    if not (run_dir / BEST_DIR / CONFIG_FILE).is_file():
        return None
    try:
        value = (read_run_config(run_dir / BEST_DIR).training or {}).get("val_loss")
    except TfcliError:
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def lowest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)
