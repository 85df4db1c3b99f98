"""What the training loop yields: the CLI renders these; the loop never prints."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Started:
    step: int  # the first step (0, or the checkpoint's on --resume)
    max_steps: int | None  # None with a time budget
    time_budget: float | None
    parameters: int
    trainable: int
    device: str
    precision: str
    world_size: int
    tokens_per_step: int
    peak_flops: float
    run_dir: Path


@dataclasses.dataclass
class StepDone:
    step: int
    lr: float
    tokens_seen: int
    tokens_per_sec: float
    mfu: float
    elapsed: float
    remaining: float | None  # seconds, estimated
    fraction: float  # of the run done


@dataclasses.dataclass
class Logged:
    record: dict[str, Any]  # the metrics.jsonl record


@dataclasses.dataclass
class Saved:
    step: int
    path: Path
    best: bool


@dataclasses.dataclass
class Note:
    message: str


@dataclasses.dataclass
class Finished:
    step: int
    reason: str  # steps | budget | early_stop
    run_dir: Path
    best_val_loss: float | None  # what best/ holds
    last: dict[str, Any]
    elapsed: float
    plot: Path | None
    # the reason in words. Example: "the validation loss did not improve for 3 evaluations (best 1.234 at step 300)"
    why: str = ""
