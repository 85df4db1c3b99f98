"""The one training loop behind `train pretrain` and `train finetune`: it drives a `Trainer` (a transformer's) or
a `Word2VecTrainer` (`train pretrain --objective word2vec`) step by step,
yields events (`events.py`) and never prints; the CLI renders them. SIGINT and SIGTERM stop it after the
step in hand, with the checkpoint saved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import signal
import threading
from collections.abc import Iterator
from typing import Any

import torch

from tfcli.errors import Interrupted
from tfcli.fsutil import exclusive_lock, remove_stale_temp_files, removed_note
from tfcli.train.distributed import World, join_world, leave_world
from tfcli.train.job import TrainingJob
from tfcli.train.plot import plot_loss_curve
from tfcli.train.run_checks import refuse_existing_run
from tfcli.train.state import LOSS_PLOT, read_metrics
from tfcli.train.trainer import Trainer
from tfcli.train.word2vec import Word2VecJob, Word2VecTrainer


class _SignalFlag:
    """SIGINT and SIGTERM set a flag the loop reads after each step; a second Ctrl-C stops at once."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def __enter__(self) -> _SignalFlag:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def train(job: TrainingJob | Word2VecJob) -> Iterator[Any]:
    """Run the job; yields Started, StepDone, Logged, Saved, Note and finally Finished. Raises Interrupted
    (after saving) on SIGINT / SIGTERM and TfcliError on a non-finite loss (keeping the last checkpoint)."""
    device = job.config.device if isinstance(job, TrainingJob) else "cpu"  # word2vec trains on the CPU
    device_kind = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"
    world = join_world(device_kind)
    together = False  # every rank got here: they agree when to stop, also on an interrupt
    try:
        with exclusive_lock(job.run_dir, "training into") if world.is_main else contextlib.nullcontext():
            if world.is_main and not job.resume:
                refuse_existing_run(job.run_dir)  # again, under the lock: another process may have made one since
            if world.is_main:
                job = dataclasses.replace(job, notes=(*job.notes, *_clean_crash_leftovers(job)))
            yield from _train(job, world)
        together = True
    except Interrupted:
        together = True
        raise
    finally:
        # FSDP leaves reference cycles (its parameters, DTensors, hooks): free them now, while the process
        # group is alive, not at interpreter exit, where a gloo rank once aborted ("terminate called
        # without an active exception"). One process has no group to outlive (and a full collection in a
        # big process, a test session's, costs most of a second).
        if world.enabled:
            gc.collect()
        leave_world(world, together=together)


RUN_FILES = (
    "config.json",
    "model.safetensors",
    "adapter_model.safetensors",
    "adapter_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "metrics.jsonl",
    "loss.png",
    "state.json",
)


def _clean_crash_leftovers(job: TrainingJob | Word2VecJob) -> list[str]:
    """Under the run's lock no other writer is at work: every temp file of a save's naming is a killed save's
    (a whole model's copy each), in the run folder, trainer/, best/ and the kept checkpoints. Returns the notes
    that say so."""
    folders = [job.run_dir, job.run_dir / "trainer", job.run_dir / "best"]
    if (job.run_dir / "checkpoints").is_dir():
        folders += sorted(p for p in (job.run_dir / "checkpoints").iterdir() if p.is_dir())
    notes = []
    for folder in folders:
        removed = remove_stale_temp_files(folder, RUN_FILES, locked=True)
        if removed:
            notes.append(removed_note(removed))
    return notes


def _train(job: TrainingJob | Word2VecJob, world: World) -> Iterator[Any]:
    trainer = Word2VecTrainer(job, world) if isinstance(job, Word2VecJob) else Trainer(job, world)
    yield trainer.started()
    yield from trainer.notes_at_start()
    trainer.begin()
    with _SignalFlag() as signals:
        try:
            while (reason := trainer.stop_reason(signals.received is not None)) is None:
                yield from trainer.step_once()
                yield from trainer.after_step()
            yield from trainer.finish(reason)
        finally:
            trainer.close()
    plot = None
    if world.is_main:
        title = f"{job.run_dir.name}: {job.title}, step {trainer.step}"
        if plot_loss_curve(read_metrics(trainer.metrics_path), job.run_dir / LOSS_PLOT, title):
            plot = job.run_dir / LOSS_PLOT
    if reason == "interrupted":
        signum = signals.received or signal.SIGINT
        raise Interrupted(
            f"stopped at step {trainer.step}; the checkpoint is saved in {job.run_dir}; continue with the same command and --resume", 128 + int(signum)
        )
    yield trainer.finished(reason, plot)
