"""Experiment trackers (`--log-to tensorboard|wandb|trackio`): each gets the records metrics.jsonl gets, as
scalars at their step. Optional extras, imported only when asked for; each works with no network (TensorBoard
writes event files in RUN/tensorboard/, wandb runs offline unless WANDB_MODE says otherwise, trackio is local)."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import Any

from tfcli.errors import TfcliError

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}  # name: the package it needs
TENSORBOARD_DIR = "tensorboard"


def check_trackers(names: list[str]) -> list[str]:
    """The trackers asked for, each known and installed (checked before any work starts)."""
    chosen = []
    for item in names:
        for name in filter(None, (part.strip() for part in item.split(","))):
            if name not in TRACKERS:
                raise TfcliError(f"unknown tracker {name!r} for --log-to", hint=f"use {', '.join(TRACKERS)}")
            if importlib.util.find_spec(TRACKERS[name]) is None:
                raise TfcliError(f"--log-to {name} needs the {TRACKERS[name]} package", hint=f'pip install "tfcli[{name}]"')
            if name not in chosen:
                chosen.append(name)
    return chosen


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics record, without its step; None (a NaN written as null) left out.
    Example: {"step": 10, "loss": 2.5, "val_loss": None} -> {"loss": 2.5}"""
    return {
        key: float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }


class TensorBoardTracker:
    """Event files in RUN/tensorboard/, one scalar series per metric, written with torch's SummaryWriter;
    a resumed run drops the events past its checkpoint (purge_step), as metrics.jsonl drops its records."""

    def __init__(self, run_dir: Path, settings: dict[str, Any], start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=start_step + 1 if start_step else None)
        if not start_step:
            self.writer.add_text("settings", "\n".join(f"    {key} = {value!r}" for key, value in sorted(settings.items())), 0)

    def log(self, record: dict[str, Any]) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, record["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path, settings: dict[str, Any], start_step: int) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE", "offline")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "tfcli"), name=run_dir.name, dir=str(run_dir), config=settings, mode=mode, resume="allow")

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    def __init__(self, run_dir: Path, settings: dict[str, Any], start_step: int) -> None:
        import trackio

        self.trackio = trackio
        trackio.init(project=os.environ.get("TRACKIO_PROJECT", "tfcli"), name=run_dir.name, config=settings, resume="allow")

    def log(self, record: dict[str, Any]) -> None:
        self.trackio.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.trackio.finish()


KINDS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "trackio": TrackioTracker}


def open_trackers(names: list[str], run_dir: Path, settings: dict[str, Any], start_step: int) -> list[Any]:
    return [KINDS[name](run_dir, settings, start_step) for name in names]
