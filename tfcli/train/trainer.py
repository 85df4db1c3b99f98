"""One training run's state and what it does with it: `step` (one optimizer update), `after_step` (evaluate,
log and save at their intervals), `finish` (what the last step has not had yet). `loop.py` drives it.

Each step: the learning rate from the schedule, dropout seeded from (seed, step, rank), the global batch's
micro-batches (rank r takes its slice), the summed loss divided by the global target count (so any number
of processes and micro-steps computes the same mean), gradient clipping whose returned norm is checked for
NaN and infinity before the update.

One class on purpose (a little over 400 lines): the step, the evaluation, the records and the saving read
and change the same state (step, the metrics window, the best loss), which is what the issue asked to gather
from closures into one object; what needs none of it already lives beside it (state.py, saving.py, evaluate.py).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from tfcli.errors import TfcliError
from tfcli.train.data import Slot, derived_seed
from tfcli.train.distributed import World, agree, all_sum
from tfcli.train.events import Finished, Logged, Note, Saved, Started, StepDone
from tfcli.train.job import TrainingJob
from tfcli.train.saving import best_saved_val_loss, lowest, save_best, save_run
from tfcli.train.setup import build_source, check_token_ids, freeze, initial_model, pick_device, token_byte_lengths, use_bf16
from tfcli.train.state import (
    METRICS_FILE,
    OPTIMIZER_FILE,
    TRAINER_FORMAT,
    MetricsWriter,
    TrainerState,
    find_trainer_state,
    read_optimizer_tensors,
    strict_json,
    truncate_metrics,
)
from tfcli.train.tracking import open_trackers


class Trainer:
    def __init__(self, job: TrainingJob, world: World) -> None:
        from tfcli.accel import accelerate
        from tfcli.train import sharding
        from tfcli.train.flops import peak_matmul_flops, training_flops_per_token
        from tfcli.train.optim import load_optimizer_tensors, make_optimizer

        cfg = self.cfg = job.config
        self.job, self.world = job, world
        if cfg.fsdp and not world.enabled:
            raise TfcliError(
                "--fsdp shards the model across the processes torchrun starts; this is one process",
                hint="launch with torchrun --nproc-per-node N -m tfcli train ... --fsdp, or drop --fsdp",
            )
        self.device = pick_device(cfg.device, world)
        self.bf16 = use_bf16(cfg.precision, self.device)
        self.source = build_source(job, world)  # data problems surface before anything is written
        self.start_step, self.tokens_seen, self.elapsed_before, self.best_val = 0, 0, 0.0, None
        saved, trainer_folder = self._resume_state()

        self.model = initial_model(job)
        freeze(self.model, cfg.freeze, cfg.task)
        accelerate(self.model.to(self.device).train())
        self.fsdp = cfg.fsdp
        if self.fsdp:
            sharding.shard_model(self.model, self.device, world)
        self.names = {id(p): n for n, p in self.model.named_parameters()}
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.model, cfg, self.device)
        if trainer_folder is not None:
            saved_tensors = read_optimizer_tensors(trainer_folder / OPTIMIZER_FILE)
            if self.fsdp:
                sharding.load_full_optimizer_tensors(self.model, self.optimizer, saved_tensors)
            else:
                load_optimizer_tensors(self.optimizer, saved_tensors, self.names)
        # Under FSDP every rank evaluates (the forward pass is a collective); the results agree, so every
        # rank takes the same save decisions.
        self.evaluates = world.is_main or self.fsdp
        self.ddp, self.runner = self._wrapped()
        self.compile_checked = not cfg.compile

        self.tokens_per_step = cfg.batch_size * world.size * cfg.grad_accum * self.source.tokens_per_row
        self.peak = peak_matmul_flops(self.device, torch.bfloat16 if self.bf16 else torch.float32) if world.is_main else 0.0
        self.flops_per_step = training_flops_per_token(job.model_config, self.source.tokens_per_row) * self.tokens_per_step
        self.metrics_path = job.run_dir / METRICS_FILE
        self.writer = self._metrics_writer()
        # the same validation set for any world size
        self.val_batches = self.source.validation(cfg.eval_batches, cfg.batch_size * world.size) if self.evaluates else []
        for batch in self.val_batches:
            check_token_ids(batch, cfg.task, job.model_config.vocab_size, job.data)
        self.byte_lengths = token_byte_lengths(job.tokenizer, job.model_config.vocab_size) if cfg.task == "lm" and self.evaluates else None

        self.step = self.start_step
        self.lr = cfg.lr
        self.elapsed = self.elapsed_before
        self.grad_norm = float("nan")
        self.window_loss = torch.zeros((), device=self.device)
        self.window_count = 0
        if saved is not None and world.is_main:  # the metrics window the checkpoint was in the middle of
            self.window_loss = torch.tensor(saved.window_loss, dtype=torch.float32, device=self.device)
            self.window_count = saved.window_count
        self.window_start = self.run_start = time.perf_counter()
        self.window_tokens = 0
        self.last_record: dict[str, Any] = {}
        self.logged_step = self.saved_step = self.evaluated_step = -1

    # ---- setting up ---------------------------------------------------------------------------------

    def _resume_state(self):
        """On --resume: the saved trainer state and its folder, checked against this run's data, tokenizer
        and world size; the counters start where it stopped."""
        job, world = self.job, self.world
        if not job.resume:
            return None, None
        trainer_folder, saved = find_trainer_state(job.run_dir)
        val = f" and {job.val_data}" if job.val_data is not None else ""
        for before, now, problem in (
            (saved.world_size, world.size, f"the world size was {saved.world_size}, now {world.size}"),
            (saved.data_fingerprint, job.data_fingerprint, f"{job.data}{val} is not the data the run was trained on (its contents differ)"),
            (saved.tokenizer_sha256, job.tokenizer.sha256, "the tokenizer is not the one the run was trained with"),
        ):
            if before != now:
                raise TfcliError(f"cannot resume: {problem}", hint="resume with the data, tokenizer and process count the run was started with")
        self.start_step, self.tokens_seen, self.elapsed_before = saved.step, saved.tokens_seen, saved.elapsed_seconds
        self.best_val = lowest(saved.best_val_loss, best_saved_val_loss(job.run_dir))  # best/ may be newer than the checkpoint
        return saved, trainer_folder

    def _wrapped(self):
        """(the DDP wrapper or None, what the forward pass runs: DDP, torch.compile of it, or the model)."""
        runner, ddp = self.model, None
        if self.world.enabled and not self.fsdp:
            import inspect

            from torch.nn.parallel import DistributedDataParallel

            unused = self.cfg.task == "classify" or self.model.config.n_classes > 0
            # the buffers (position tables) are the same on every rank: no syncing before each forward
            no_sync = (
                {"forward_sync_buffers": False}
                if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                else {"broadcast_buffers": False}
            )  # the older name
            ddp = runner = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None, find_unused_parameters=unused, **no_sync
            )
        if self.cfg.compile:
            runner = torch.compile(runner)
        return ddp, runner

    def _metrics_writer(self) -> MetricsWriter | None:
        if not self.world.is_main:
            return None
        if self.job.resume:
            truncate_metrics(self.metrics_path, self.start_step)
        elif self.metrics_path.exists():
            self.metrics_path.unlink()
        trackers = open_trackers(self.job.log_to, self.job.run_dir, self.cfg.to_json(), self.start_step)
        return MetricsWriter(self.metrics_path, trackers)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()

    # ---- what the loop sees -------------------------------------------------------------------------

    def started(self) -> Started:
        cfg = self.cfg
        budget = cfg.time_budget
        return Started(
            self.start_step,
            None if budget else cfg.max_steps,
            budget,
            sum(p.numel() for p in self.model.parameters()),
            sum(p.numel() for p in self.trainable),
            str(self.device),
            "bf16" if self.bf16 else "fp32",
            self.world.size,
            self.tokens_per_step,
            self.peak,
            self.job.run_dir,
        )

    def notes_at_start(self) -> Iterator[Note]:
        cfg = self.cfg
        if cfg.time_budget is None and self.start_step >= cfg.max_steps:
            yield Note(f"the run is already at step {self.start_step} of {cfg.max_steps}; raise --max-steps to train further")
        if self.world.is_main:
            yield from (Note(note) for note in self.job.notes)
        if self.world.is_main and not self.val_batches:
            yield Note("the validation split is empty: nothing is validated and no best/ checkpoint is kept")

    def begin(self) -> None:
        """Start the clocks: the first step begins now."""
        self.window_start = self.run_start = time.perf_counter()

    def stop_reason(self, signal_received: bool) -> str | None:
        """ "interrupted", "steps" or "budget" when the run should stop before another step, else None.
        Every rank agrees (a collective)."""
        cfg = self.cfg
        interrupted, self.elapsed = agree(self.world, signal_received, self.elapsed_before + time.perf_counter() - self.run_start, self.device)
        if interrupted:
            return "interrupted"
        if cfg.time_budget is None and self.step >= cfg.max_steps:
            return "steps"
        if cfg.time_budget is not None and self.elapsed >= cfg.time_budget:
            return "budget"
        return None

    # ---- one step -----------------------------------------------------------------------------------

    def step_once(self) -> Iterator[Note]:
        """One optimizer update over the global batch; yields a Note if torch.compile has to be dropped."""
        from tfcli.train import sharding
        from tfcli.train.optim import lr_factor

        cfg, world, job = self.cfg, self.world, self.job
        fraction = self.elapsed / cfg.time_budget if cfg.time_budget else None
        self.lr = cfg.lr * lr_factor(cfg, self.step, fraction)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        torch.manual_seed(derived_seed(cfg.seed, "dropout", self.step, world.rank))
        batches = [self.source.batch(Slot(self.step, m, world.rank, world.size)) for m in range(cfg.grad_accum)]
        for batch in batches:
            check_token_ids(batch, cfg.task, job.model_config.vocab_size, job.data)
        local_count = sum(b.count for b in batches)
        global_count = int(all_sum(world, torch.tensor(float(local_count), device=self.device)).item())
        scale = world.size / max(global_count, 1)
        for m, batch in enumerate(batches):
            last = m == len(batches) - 1
            sync = self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext()
            if self.fsdp:
                sharding.set_gradient_sync(self.model, last)
            with sync:
                yield from self._backward(batch.to(self.device), scale)
        self.window_count += local_count  # this rank's; _log sums over ranks
        norm = torch.nn.utils.clip_grad_norm_(self.trainable, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        self.grad_norm = float(sharding.local_value(norm))
        if not math.isfinite(self.grad_norm):
            kept = (
                f"the last good checkpoint (step {self.saved_step if self.saved_step >= 0 else self.start_step}) is kept"
                if self.saved_step >= 0 or job.resume
                else "no checkpoint was written"
            )
            raise TfcliError(
                f"step {self.step + 1}: the loss or the gradient norm is not finite ({self.grad_norm}); {kept}",
                hint="lower --lr, raise warm-up (--set warmup_steps=N) or check the data",
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        self.window_tokens += self.tokens_per_step
        self.elapsed = self.elapsed_before + time.perf_counter() - self.run_start

    def _backward(self, batch, scale: float) -> Iterator[Note]:
        from tfcli.train.objectives import loss_sum

        def loss_of_batch() -> torch.Tensor:
            with self.autocast():
                return loss_sum(self.runner, batch, self.cfg.task, self.cfg.label_smoothing)

        try:
            loss = loss_of_batch()
            (loss * scale).backward()
        except Exception as exc:
            if self.compile_checked:
                raise
            yield Note(f"torch.compile does not work here ({type(exc).__name__}); training without it")
            self.runner = self.ddp if self.ddp is not None else self.model
            self.optimizer.zero_grad(set_to_none=True)
            loss = loss_of_batch()
            (loss * scale).backward()
        self.compile_checked = True
        self.window_loss += loss.detach().float()

    def after_step(self) -> Iterator[Any]:
        """Evaluate, log and save where the step falls on their intervals; then report the step."""
        cfg, step = self.cfg, self.step
        at_eval = bool(cfg.eval_every) and step % cfg.eval_every == 0
        # the same steps on every rank: logging sums over them
        yield from self._record(evaluate=at_eval, log=at_eval or step % cfg.log_every == 0, amend=False)
        if cfg.save_every and step % cfg.save_every == 0:
            yield from self._save(sync_metrics=True)
        if cfg.keep_every and step % cfg.keep_every == 0:
            yield from self._keep()
        yield self._progress()

    def finish(self, reason: str) -> Iterator[Any]:
        """At the end (or an interruption): evaluate, log and save what the last step has not had. An
        interruption keeps its metrics window (saved in the trainer state) and is not evaluated."""
        finishing = self.step > self.start_step and reason != "interrupted"
        yield from self._record(evaluate=finishing and self.evaluated_step != self.step, log=finishing and self.logged_step != self.step, amend=True)
        if self.saved_step != self.step and (self.step > self.start_step or not self.job.resume):
            yield from self._save(sync_metrics=False)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def finished(self, reason: str, plot) -> Finished:
        return Finished(self.step, reason, self.job.run_dir, self.best_val, self.last_record or {"step": self.step}, self.elapsed, plot)

    # ---- evaluating, logging, saving ----------------------------------------------------------------

    def _record(self, *, evaluate: bool, log: bool, amend: bool) -> Iterator[Any]:
        """Evaluate (if asked), then log a metrics record (or amend the step's record with the evaluation),
        then keep best/ if the validation loss improved."""
        from tfcli.train.objectives import evaluate as evaluate_model

        extra: dict[str, Any] = {}
        if evaluate:
            self.evaluated_step = self.step
            if self.evaluates:
                extra = evaluate_model(self.model, self.val_batches, self.cfg.task, self.device, self.autocast, self.byte_lengths)
        if log:
            self.last_record = self._log(extra)
            yield Logged(self.last_record)
        elif amend and extra and self.writer is not None:  # this step was logged before it was evaluated
            self.last_record = self.writer.amend(extra)
            yield Logged(self.last_record)
        if extra.get("val_loss") is not None and (self.best_val is None or extra["val_loss"] < self.best_val):
            self.best_val = extra["val_loss"]
            to_save, _ = self._snapshot(with_optimizer=False)
            if self.world.is_main:
                yield Saved(self.step, save_best(self.job, to_save, self.step, self.best_val), True)

    def _save(self, *, sync_metrics: bool) -> Iterator[Saved]:
        totals = self._window_totals()
        if self.world.is_main or self.fsdp:
            to_save, tensors = self._snapshot()
        if self.world.is_main:
            yield Saved(self.step, save_run(self.job, to_save, tensors, self._trainer_state(totals)), False)
            if sync_metrics:
                self.writer.sync()
        self.saved_step = self.step

    def _keep(self) -> Iterator[Saved]:
        """--keep-checkpoints: this step's weights under RUN/checkpoints/ (every rank joins an FSDP gather)."""
        from tfcli.train.saving import save_kept

        to_save, _ = self._snapshot(with_optimizer=False)
        if self.world.is_main:
            yield Saved(self.step, save_kept(self.job, to_save, self.step), False)

    def _snapshot(self, with_optimizer: bool = True):
        """(the model to write, its optimizer tensors) on rank 0; under FSDP a collective that gathers the
        shards (every rank calls it; the others get (None, {}))."""
        from tfcli.train import sharding
        from tfcli.train.optim import optimizer_tensors

        if not self.fsdp:
            return self.model, (optimizer_tensors(self.optimizer, self.names) if with_optimizer else {})
        from tfcli.checkpoint import model_from_tensors

        weights = sharding.full_weights(self.model)
        tensors = sharding.full_optimizer_tensors(self.model, self.optimizer) if with_optimizer else {}
        return (model_from_tensors(self.model.config, weights) if self.world.is_main else None), tensors

    def _window_totals(self) -> torch.Tensor:
        """The window's loss and target count summed over the ranks (a collective)."""
        return all_sum(self.world, torch.stack([self.window_loss.float(), torch.tensor(float(self.window_count), device=self.device)]))

    def _trainer_state(self, totals: torch.Tensor) -> TrainerState:
        job = self.job
        return TrainerState(
            TRAINER_FORMAT,
            self.step,
            self.tokens_seen,
            self.elapsed,
            self.world.size,
            job.data_fingerprint,
            job.tokenizer.sha256,
            best_val_loss=self.best_val,
            window_loss=float(totals[0].item()),
            window_count=int(totals[1].item()),
        )

    def _utilisation(self, rate: float) -> float:
        """MFU at `rate` tokens/s. The peak was timed once on this machine, maybe while it was busy; then it
        reads low, and what training reaches is the better bound."""
        achieved = rate / max(self.tokens_per_step, 1) * self.flops_per_step
        if self.peak:
            self.peak = max(self.peak, achieved)
        return achieved / self.peak if self.peak else 0.0

    def _log(self, extra: dict[str, Any]) -> dict[str, Any]:
        totals = self._window_totals()
        now = time.perf_counter()
        rate = self.window_tokens / max(now - self.window_start, 1e-9)
        record: dict[str, Any] = {"step": self.step}
        if totals[1].item() > 0:
            record["loss"] = totals[0].item() / totals[1].item()
        record.update(
            {
                "lr": self.lr,
                "grad_norm": self.grad_norm,
                "tokens": self.tokens_seen,
                "tokens_per_sec": rate,
                "mfu": self._utilisation(rate),
                "elapsed": self.elapsed,
            }
        )
        record.update(extra)
        record = strict_json({k: (round(v, 4) if k in ("tokens_per_sec", "mfu", "elapsed") else v) for k, v in record.items()})
        if self.writer is not None:
            self.writer.write(record)
        self.window_loss = torch.zeros((), device=self.device)
        self.window_count, self.window_start, self.window_tokens, self.logged_step = 0, now, 0, self.step
        return record

    def _progress(self) -> StepDone:
        cfg, budget = self.cfg, self.cfg.time_budget
        if budget is None:
            done = self.step / cfg.max_steps
            remaining = (self.elapsed - self.elapsed_before) / max(self.step - self.start_step, 1) * (cfg.max_steps - self.step)
        else:
            done, remaining = min(self.elapsed / budget, 1.0), max(budget - self.elapsed, 0.0)
        if self.window_tokens:
            rate = self.window_tokens / max(time.perf_counter() - self.window_start, 1e-9)
        else:
            rate = self.last_record.get("tokens_per_sec", 0.0)
        return StepDone(self.step, self.lr, self.tokens_seen, rate, self._utilisation(rate), self.elapsed, remaining, done)
