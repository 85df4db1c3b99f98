"""Experiment trackers (`--log-to tensorboard|wandb|trackio`): each gets the records metrics.jsonl gets, as
scalars at their step. Optional extras, imported only when asked for; each works with no network (TensorBoard
writes event files in RUN/tensorboard/, wandb runs offline in RUN/wandb/ unless WANDB_MODE says otherwise, trackio
writes its local store). A resumed run continues its tracker's run rather than starting another."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import secrets
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_write_text, describe_write_error

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}  # name: the package it needs
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"  # wandb makes its own wandb/ under the dir it is given: RUN/wandb/
WANDB_ID_FILE = "tfcli-run-id"  # in RUN/wandb/: the wandb run a resumed training continues
WANDB_ID = re.compile(r"[a-z0-9]{8,64}")
TRACKIO_NAME_FILE = "trackio-run"  # in RUN: the trackio run a resumed training continues
TRACKIO_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,128}")
MAX_ERROR_CHARS = 300  # of a tracker's own error, in our one line


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
    a resumed run drops the events past its checkpoint (purge_step), as metrics.jsonl drops its records.

    The folder is made and tried before the writer starts (a file in its place, a read-only folder: one line,
    before any step). A write that fails later, in the writer's thread, reaches the next `log` as one
    TfcliError; the thread itself prints nothing (Python would print it again there, as a traceback)."""

    def __init__(self, run_dir: Path, settings: dict[str, Any], start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = run_dir / TENSORBOARD_DIR
        self.failed = False
        check_log_folder(self.folder, "tensorboard")
        self.quiet = _QuietWriterThreads()
        try:
            self.writer = SummaryWriter(log_dir=str(self.folder), purge_step=start_step + 1 if start_step else None)
            if not start_step:
                self.writer.add_text("settings", "\n".join(f"    {key} = {value!r}" for key, value in sorted(settings.items())), 0)
        except OSError as exc:
            self.quiet.restore()
            raise self._cannot_write(exc) from exc

    def log(self, record: dict[str, Any]) -> None:
        try:
            for key, value in scalars(record).items():
                self.writer.add_scalar(key, value, record["step"])
            self.writer.flush()
        except OSError as exc:
            self.failed = True
            raise self._cannot_write(exc) from exc

    def close(self) -> None:
        try:
            self.writer.close()
        except OSError as exc:
            if not self.failed:  # a failure already said is not said twice
                raise self._cannot_write(exc) from exc
        finally:
            self.quiet.restore()

    def _cannot_write(self, exc: OSError) -> TfcliError:
        return TfcliError(
            f"cannot write --log-to tensorboard's event files in {self.folder}: {describe_write_error(exc)}",
            hint="free some space or fix the folder's permissions, then continue with --resume (the last checkpoint is intact)",
        )


def check_log_folder(folder: Path, tracker: str) -> None:
    """Make FOLDER for a tracker's files and make sure a file can be made in it, or one line saying why not.
    The trial file has no name (O_TMPFILE where the file system has it) and is gone once closed."""
    if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
        raise TfcliError(f"--log-to {tracker} writes its files in {folder}, which is not a folder", hint=f"move it away, or drop --log-to {tracker}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise TfcliError(
            f"cannot write --log-to {tracker}'s files in {folder}: {describe_write_error(exc)}",
            hint=f"make the folder writable (or a link to one), or drop --log-to {tracker}",
        ) from exc


class _QuietWriterThreads:
    """While a TensorBoard writer is open, an OSError that ends one of tensorboard's threads is not printed by
    Python's thread hook: the thread keeps it for the writer's next call, which raises it in the training loop
    (where it becomes one line). Every other thread's exception goes to the hook as before."""

    def __init__(self) -> None:
        self.previous = threading.excepthook
        threading.excepthook = self._hook

    def _hook(self, args: Any) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__module__.startswith("tensorboard."):
            return
        self.previous(args)

    def restore(self) -> None:
        if threading.excepthook == self._hook:  # not if another hook was put on top since
            threading.excepthook = self.previous


class WandbTracker:
    """A wandb run in RUN/wandb/ (offline unless WANDB_MODE says otherwise). Its id is kept in
    RUN/wandb/tfcli-run-id, so a resumed training (after a crash or kill -9 too) logs to the same wandb run;
    steps it logs again past the checkpoint are the ones wandb already holds (a resume is exact), and wandb
    keeps the first."""

    def __init__(self, run_dir: Path, settings: dict[str, Any], start_step: int) -> None:
        import wandb

        folder = run_dir / WANDB_DIR
        made = not (folder.exists() or folder.is_symlink())
        check_log_folder(folder, "wandb")  # else wandb writes to a temporary folder instead, and says so only in its log
        run_id = wandb_run_id(folder, resuming=start_step > 0)
        mode = os.environ.get("WANDB_MODE", "offline")
        project = os.environ.get("WANDB_PROJECT", "tfcli")
        try:
            self.run = wandb.init(project=project, name=run_dir.name, id=run_id, dir=str(run_dir), config=settings, mode=mode, resume="allow")
        except Exception as exc:  # wandb's own errors (not logged in, a bad WANDB_* setting) vary by version
            if made:  # a folder of a start that failed would make the run folder unusable for the next try
                shutil.rmtree(folder, ignore_errors=True)
            said = " ".join(str(exc).split())[:MAX_ERROR_CHARS]
            raise TfcliError(
                f"--log-to wandb could not start its run ({type(exc).__name__}: {said})",
                hint="run `wandb login` or set WANDB_MODE=offline, or drop --log-to wandb",
            ) from exc
        atomic_write_text(folder / WANDB_ID_FILE, run_id + "\n")

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()


def wandb_run_id(folder: Path, *, resuming: bool) -> str:
    """The wandb run id of the training whose wandb folder is FOLDER: the kept one when resuming (a run first
    trained without wandb gets a new one), else a new one (the tracker keeps it once its run has started)."""
    path = folder / WANDB_ID_FILE
    if resuming and path.is_file():
        kept = path.read_text(encoding="utf-8", errors="replace").strip()
        if not WANDB_ID.fullmatch(kept):
            raise TfcliError(f"{path} does not hold a wandb run id (8 to 64 of a-z, 0-9)", hint="delete it to log to a new wandb run")
        return kept
    return secrets.token_hex(8)


class TrackioTracker:
    """A run in trackio's local store (TRACKIO_DIR, else HF_HOME/trackio; `trackio show` reads it), in project
    TRACKIO_PROJECT (default tfcli). trackio knows a run by its name, so each training gets its own (the run
    folder's name and a random suffix: many runs are called `model`), kept in RUN/trackio-run so that a resumed
    training logs to the same trackio run. Steps logged again past the checkpoint hold the values trackio already
    has (a resume is exact)."""

    def __init__(self, run_dir: Path, settings: dict[str, Any], start_step: int) -> None:
        import trackio
        from trackio.utils import TRACKIO_DIR

        check_log_folder(Path(TRACKIO_DIR), "trackio")  # else trackio only warns, at the end, that nothing was kept
        kept = run_dir / TRACKIO_NAME_FILE
        name = trackio_run_name(kept, run_dir.name, resuming=start_step > 0)
        project = os.environ.get("TRACKIO_PROJECT", "tfcli")
        self.trackio = trackio
        try:
            self.run = trackio.init(project=project, name=name, config=settings, resume="allow")
        except Exception as exc:  # trackio's own errors (a bad TRACKIO_* setting) vary by version
            said = " ".join(str(exc).split())[:MAX_ERROR_CHARS]
            raise TfcliError(
                f"--log-to trackio could not start its run ({type(exc).__name__}: {said})", hint="check the TRACKIO_* settings, or drop --log-to trackio"
            ) from exc
        atomic_write_text(kept, name + "\n")

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.trackio.finish()


def trackio_run_name(path: Path, folder_name: str, *, resuming: bool) -> str:
    """The trackio run of the training kept in PATH when resuming (a run first trained without trackio gets a new
    one), else a new one: FOLDER_NAME and 6 random hex digits."""
    if resuming and path.is_file():
        kept = path.read_text(encoding="utf-8", errors="replace").strip()
        if not TRACKIO_NAME.fullmatch(kept):
            raise TfcliError(f"{path} does not hold a trackio run name (1 to 128 printable characters)", hint="delete it to log to a new trackio run")
        return kept
    return f"{folder_name}-{secrets.token_hex(3)}"


KINDS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "trackio": TrackioTracker}


def open_trackers(names: list[str], run_dir: Path, settings: dict[str, Any], start_step: int) -> list[Any]:
    return [KINDS[name](run_dir, settings, start_step) for name in names]
