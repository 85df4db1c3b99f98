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
import time
from collections.abc import Iterator
from typing import Any

import torch

from tfcli.errors import Interrupted
from tfcli.fsutil import exclusive_lock, remove_stale_temp_files, removed_note
from tfcli.train.distributed import World, join_world, leave_world, lost_a_peer, peer_lost
from tfcli.train.job import TrainingJob
from tfcli.train.plot import plot_loss_curve
from tfcli.train.run_checks import refuse_existing_run
from tfcli.train.state import LOSS_PLOT, read_metrics
from tfcli.train.trainer import Trainer
from tfcli.train.word2vec import Word2VecJob, Word2VecTrainer

TORCHRUN_ECHO_SECONDS = 2.0


class _SignalFlag:
    """SIGINT and SIGTERM set a flag the loop reads after each step; a second Ctrl-C stops at once. Under
    torchrun, a Ctrl-C reaches each rank twice (from the terminal, then forwarded by torchrun): a second one
    within TORCHRUN_ECHO_SECONDS is that echo, not the user's. A run that ends because a peer is gone keeps the
    flag's handlers on the way out: torchrun sends SIGTERM to every rank left, which would otherwise end this
    one before it says why."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.received: int | None = None
        self._first_at = 0.0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            if self.world.enabled and time.monotonic() - self._first_at < TORCHRUN_ECHO_SECONDS:
                return
            raise KeyboardInterrupt
        if self.received is None:
            self._first_at = time.monotonic()
        self.received = signum

    def __enter__(self) -> _SignalFlag:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc is not None and lost_a_peer(self.world, exc):
            return
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


def _what_is_saved(job: TrainingJob | Word2VecJob, world: World, trainer: Trainer | Word2VecTrainer | None) -> str:
    if not world.is_main:  # rank 0 writes, and may have died halfway through a save (which leaves the one before)
        return f"the last checkpoint rank 0 finished writing in {job.run_dir} is intact"
    if trainer is not None and trainer.saved_step >= 0:
        return f"the checkpoint of step {trainer.saved_step} in {job.run_dir} is intact"
    if job.resume:
        return f"the checkpoint it resumed from in {job.run_dir} is intact"
    return "no checkpoint was saved yet"


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
    trainer = None
    try:
        trainer = Word2VecTrainer(job, world) if isinstance(job, Word2VecJob) else Trainer(job, world)
        yield trainer.started()
        yield from trainer.notes_at_start()
        trainer.begin()
        with _SignalFlag(world) as signals:
            try:
                while (reason := trainer.stop_reason(signals.received is not None)) is None:
                    yield from trainer.step_once()
                    yield from trainer.after_step()
                yield from trainer.finish(reason)
            finally:
                trainer.close()
    except RuntimeError as exc:  # torch's collectives raise RuntimeError (gloo) or its DistError subclasses
        if not lost_a_peer(world, exc):
            raise
        raise peer_lost(world, exc, _what_is_saved(job, world, trainer)) from exc
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
