"""One training run's state and what it does with it: `step` (one optimizer update), `after_step` (evaluate,
log and save at their intervals), `finish` (what the last step has not had yet). `loop.py` drives it.

Each step: the learning rate from the schedule, dropout seeded from (seed, step, rank), the global batch's
micro-batches (rank r takes its slice), the summed loss divided by the global target count (so any number
of processes and micro-steps computes the same mean), gradient clipping whose returned norm is checked for
NaN and infinity before the update. After each evaluation: best/ where the validation loss is the lowest yet,
and --early-stop's count of evaluations without one (kept in the trainer state, so a resumed run stops where an
uninterrupted one would).

One class on purpose (some 350 lines): the step, the evaluation, the records and the saving read
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

from tfcli.checkpoint import model_from_tensors
from tfcli.errors import TfcliError
from tfcli.loader import prepare
from tfcli.quant.linear import held_values
from tfcli.train import objectives, sharding
from tfcli.train.data import Slot, derived_seed
from tfcli.train.distributed import World, agree, all_sum
from tfcli.train.events import Finished, Logged, Note, Saved, Started, StepDone
from tfcli.train.job import TrainingJob
from tfcli.train.objectives import evaluate as evaluate_model
from tfcli.train.optim import lr_factor, optimizer_tensors, set_lr_factor
from tfcli.train.saving import save_best, save_kept, save_run
from tfcli.train.setup import (
    MetricsWindow,
    build_source,
    check_token_ids,
    check_world,
    freeze,
    initial_model,
    optimizer_for,
    pick_device,
    resume_point,
    throughput,
    token_byte_lengths,
    use_bf16,
    wrapped,
)
from tfcli.train.state import (
    METRICS_FILE,
    TRAINER_FORMAT,
    MetricsWriter,
    TrainerState,
    strict_json,
    truncate_metrics,
)
from tfcli.train.tracking import open_trackers

BATCH_TOO_LARGE = "use a smaller --batch-size (--set grad_accum=N keeps the tokens per step)"
MODEL_TOO_LARGE = "the weights and AdamW's state (twice the weights) must fit: a smaller model (--preset, --set d_model=N), --lora-rank N to finetune, or --fsdp under torchrun to shard it"


class Trainer:
    """A transformer's run: its parts are made in setup.py (the device, the data source, where it resumes, the
    model, the optimizer and its wrappers, the throughput); the counters and the metrics window change each step."""

    def __init__(self, job: TrainingJob, world: World) -> None:
        cfg = self.cfg = job.config
        self.job, self.world = job, world
        check_world(cfg, world)
        self.device = pick_device(cfg.device, world)
        self.bf16 = use_bf16(cfg.precision, self.device)
        self.source = build_source(job, world)  # data problems surface before anything is written
        self.start = resume_point(job, world)

        self.step, self.saved_step = self.start.step, -1  # what an out-of-memory message says is kept
        self.model = initial_model(job, self.device)
        freeze(self.model, cfg.freeze, cfg.task)
        self.fsdp = cfg.fsdp
        with self._out_of_memory_as_error(f"moving the model to {self._device_words()}", hint=MODEL_TOO_LARGE):
            prepare(self.model, "train", self.device)
            if self.fsdp:
                sharding.shard_model(self.model, self.device, world)
        self.names = {id(p): n for n, p in self.model.named_parameters()}
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        with self._out_of_memory_as_error("building the optimizer", hint=MODEL_TOO_LARGE):
            self.optimizer = optimizer_for(self.model, cfg, self.device, self.names, self.start, self.fsdp)
            self.ddp, self.runner = wrapped(self.model, cfg, world, self.device, self.fsdp)
        self.compile_checked = not cfg.compile

        self.speed = throughput(job, world, self.device, self.bf16, self.source.tokens_per_row)
        self.metrics_path = job.run_dir / METRICS_FILE
        self.writer = self._metrics_writer()
        # Under FSDP every rank evaluates (the forward pass is a collective); the results agree, so every
        # rank takes the same save decisions.
        self.evaluates = world.is_main or self.fsdp
        # the same validation set for any world size
        self.val_batches = self.source.validation(cfg.eval_batches, cfg.batch_size * world.size) if self.evaluates else []
        for batch in self.val_batches:
            check_token_ids(batch, cfg.task, job.model_config.vocab_size, job.data)
        self.byte_lengths = token_byte_lengths(job.tokenizer, job.model_config.vocab_size) if cfg.task == "lm" and self.evaluates else None

        # the counters, from where the run starts; the metrics window the checkpoint was in the middle of
        self.step, self.tokens_seen, self.elapsed = self.start.step, self.start.tokens_seen, self.start.elapsed
        # the lowest validation loss so far, its step, the evaluations since (early stopping); what best/ holds
        self.best_val, self.best_step, self.evals_since_best = self.start.best_val, self.start.best_step, self.start.evals_since_best
        self.best_saved = self.start.best_saved
        self.stopping_early = self._patience_ran_out()
        self.lr, self.grad_norm = cfg.lr, float("nan")
        self.window = MetricsWindow.opened(self.device, self.start if job.resume and world.is_main else None)
        self.last_window = MetricsWindow.opened(self.device)  # the window last logged: the live rate spans it too
        self.run_start = time.perf_counter()
        self.last_record: dict[str, Any] = {}
        self.logged_step = self.evaluated_step = -1

    # ---- setting up ---------------------------------------------------------------------------------

    def _metrics_writer(self) -> MetricsWriter | None:
        if not self.world.is_main:
            return None
        if self.job.resume:
            truncate_metrics(self.metrics_path, self.start.step)
        elif self.metrics_path.exists():
            self.metrics_path.unlink()
        trackers = open_trackers(self.job.log_to, self.job.run_dir, self.cfg.to_json(), self.start.step)
        return MetricsWriter(self.metrics_path, trackers)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()

    # ---- what the loop sees -------------------------------------------------------------------------

    def started(self) -> Started:
        cfg = self.cfg
        budget = cfg.time_budget
        return Started(
            self.start.step,
            None if budget else cfg.max_steps,
            budget,
            sum(p.numel() for p in self.model.parameters()) + held_values(self.model),  # a QLoRA base's weights are blocks, not parameters
            sum(p.numel() for p in self.trainable),
            str(self.device),
            "bf16" if self.bf16 else "fp32",
            self.world.size,
            self.speed.tokens_per_step,
            self.speed.peak,
            self.job.run_dir,
        )

    def notes_at_start(self) -> Iterator[Note]:
        cfg = self.cfg
        if cfg.time_budget is None and self.start.step >= cfg.max_steps:
            yield Note(f"the run is already at step {self.start.step} of {cfg.max_steps}; raise --max-steps to train further")
        elif self.stopping_early:
            yield Note(f"the run stopped early at step {self.start.step}: {self.early_stop_reason()}; pass a larger --early-stop, or 0, to train further")
        if self.world.is_main:
            yield from (Note(note) for note in self.job.notes)
        if self.world.is_main and not self.val_batches:
            stop = ", and --early-stop has no validation loss to watch: the run will not stop early" if cfg.patience else ""
            yield Note(f"the validation split is empty: nothing is validated and no best/ checkpoint is kept{stop}")
        elif self.world.is_main and cfg.early_stop and not cfg.eval_every:
            yield Note("--early-stop counts evaluations, and --eval-every 0 evaluates only at the end: the run will not stop early")

    def begin(self) -> None:
        """Start the clocks: the first step begins now."""
        self.run_start = time.perf_counter()

    def stop_reason(self, signal_received: bool) -> str | None:
        """ "interrupted", "early_stop", "steps" or "budget" when the run should stop before another step, else
        None. Every rank agrees (a collective)."""
        cfg = self.cfg
        interrupted, self.elapsed = agree(self.world, signal_received, self.start.elapsed + time.perf_counter() - self.run_start, self.device)
        if interrupted:
            return "interrupted"
        if cfg.time_budget is None and self.step >= cfg.max_steps:
            return "steps"
        if cfg.time_budget is not None and self.elapsed >= cfg.time_budget:
            return "budget"
        if self.stopping_early:
            return "early_stop"
        return None

    # ---- one step -----------------------------------------------------------------------------------

    def step_once(self) -> Iterator[Note]:
        """One optimizer update over the global batch; yields a Note if torch.compile has to be dropped."""
        cfg, world, job = self.cfg, self.world, self.job
        began = time.perf_counter()
        fraction = self.elapsed / cfg.time_budget if cfg.time_budget else None
        factor = lr_factor(cfg, self.step, fraction)
        self.lr = cfg.lr * factor  # AdamW's rate, as the records show it; Muon's is muon_lr * factor
        set_lr_factor(self.optimizer, factor)
        torch.manual_seed(derived_seed(cfg.seed, "dropout", self.step, world.rank))
        batches = [self.source.batch(Slot(self.step, m, world.rank, world.size)) for m in range(cfg.grad_accum)]
        for batch in batches:
            check_token_ids(batch, cfg.task, job.model_config.vocab_size, job.data)
        local_count = sum(b.count for b in batches)
        # one process knows the count already: no trip to the device and back (a synchronization) each step
        global_count = int(all_sum(world, torch.tensor(float(local_count), device=self.device)).item()) if world.enabled else local_count
        scale = world.size / max(global_count, 1)
        for m, batch in enumerate(batches):
            last = m == len(batches) - 1
            sync = self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext()
            if self.fsdp:
                sharding.set_gradient_sync(self.model, last)
            with sync, self._out_of_memory_as_error():
                yield from self._backward(batch.to(self.device), scale)
        self.window.count += local_count  # this rank's; _log sums over ranks
        norm = torch.nn.utils.clip_grad_norm_(self.trainable, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        # read before the update (a synchronization): a non-finite norm must stop the run before the weights take it
        self.grad_norm = float(sharding.local_value(norm))
        if not math.isfinite(self.grad_norm):
            raise TfcliError(
                f"step {self.step + 1}: the loss or the gradient norm is not finite ({self.grad_norm}); {self._what_is_kept()}",
                hint="lower --lr, raise warm-up (--set warmup_steps=N) or check the data",
            )
        with self._out_of_memory_as_error():
            self.optimizer.step()  # the first step makes AdamW's state: as large again as the weights, twice
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += self.speed.tokens_per_step
        self.window.tokens += self.speed.tokens_per_step
        now = time.perf_counter()
        self.window.seconds += now - began  # the steps' own time: evaluating, logging and saving are not training
        self.elapsed = self.start.elapsed + now - self.run_start

    def _what_is_kept(self) -> str:
        """What a run that fails now leaves on disk (nothing is written after the failure)."""
        if self.saved_step >= 0 or self.job.resume:
            return f"the last good checkpoint (step {self.saved_step if self.saved_step >= 0 else self.start.step}) is kept"
        return "no checkpoint was written"

    def _device_words(self) -> str:
        return "the GPU" if self.device.type == "cuda" else f"the {self.device.type} device"

    @contextlib.contextmanager
    def _out_of_memory_as_error(self, doing: str = "", hint: str = BATCH_TOO_LARGE) -> Iterator[None]:
        """The device running out of memory (torch.OutOfMemoryError, CUDA's) as one line that says what to change.
        doing: what ran out, as the message starts (default: the step under way)."""
        try:
            yield
        except torch.OutOfMemoryError as exc:
            first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
            said = ". ".join(first_line.split(". ")[:2]).rstrip(".")  # CUDA's: "CUDA out of memory. Tried to allocate 2.00 GiB", then a paragraph
            raise TfcliError(
                f"{doing or f'step {self.step + 1}'}: {self._device_words()} ran out of memory ({said}); {self._what_is_kept()}", hint=hint
            ) from None

    def _backward(self, batch, scale: float) -> Iterator[Note]:
        def loss_of_batch() -> torch.Tensor:
            with self.autocast():
                return objectives.loss_sum(self.runner, batch, self.cfg.task, self.cfg.label_smoothing)

        try:
            loss = loss_of_batch()
            (loss * scale).backward()
        except Exception as exc:
            if self.compile_checked or isinstance(exc, torch.OutOfMemoryError):  # out of memory: the batch, not the compiler
                raise
            yield Note(f"torch.compile does not work here ({type(exc).__name__}); training without it")
            self.runner = self.ddp if self.ddp is not None else self.model
            self.optimizer.zero_grad(set_to_none=True)
            loss = loss_of_batch()
            (loss * scale).backward()
        self.compile_checked = True
        self.window.loss += loss.detach().float()

    def after_step(self) -> Iterator[Any]:
        """Evaluate, log and save where the step falls on their intervals; then report the step."""
        cfg, step = self.cfg, self.step
        at_eval = bool(cfg.eval_every) and step % cfg.eval_every == 0
        # the same steps on every rank: logging sums over them
        yield from self._record(evaluate=at_eval, log=at_eval or step % cfg.log_every == 0, amend=False)
        if at_eval and cfg.patience:
            self.stopping_early = self._patience_ran_out(agreed=True)
        if cfg.save_every and step % cfg.save_every == 0:
            yield from self._save(sync_metrics=True)
        if cfg.keep_every and step % cfg.keep_every == 0:
            yield from self._keep()
        yield self._progress()

    def finish(self, reason: str) -> Iterator[Any]:
        """At the end (or an interruption): evaluate, log and save what the last step has not had. An
        interruption keeps its metrics window (saved in the trainer state) and is not evaluated."""
        finishing = self.step > self.start.step and reason != "interrupted"
        yield from self._record(evaluate=finishing and self.evaluated_step != self.step, log=finishing and self.logged_step != self.step, amend=True)
        if self.saved_step != self.step and (self.step > self.start.step or not self.job.resume):
            yield from self._save(sync_metrics=False)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def finished(self, reason: str, plot) -> Finished:
        why = {"steps": f"reached step {self.cfg.max_steps}", "budget": f"the time budget of {self.cfg.time_budget or 0:g} s is spent"}.get(reason, "")
        if reason == "early_stop":
            why = self.early_stop_reason()
        return Finished(self.step, reason, self.job.run_dir, self.best_saved, self.last_record or {"step": self.step}, self.elapsed, plot, why)

    # ---- early stopping -----------------------------------------------------------------------------

    def _patience_ran_out(self, agreed: bool = False) -> bool:
        """--early-stop: the last `patience` evaluations found no lower validation loss. Only the ranks that
        evaluate know; with `agreed` every rank learns it (a collective, so every rank calls it on the same steps)."""
        patience = self.cfg.patience
        ran_out = bool(patience) and self.evals_since_best >= patience
        if agreed and self.world.enabled:
            ran_out = bool(all_sum(self.world, torch.tensor(float(ran_out), device=self.device)).item())
        return ran_out

    def early_stop_reason(self) -> str:
        """Example: "the validation loss did not improve for 3 evaluations (best 1.234 at step 300)"."""
        best = f"best {self.best_val:.4g}" if self.best_val is not None else "no best"
        at = f" at step {self.best_step}" if self.best_step is not None else ""
        count = self.evals_since_best
        return f"the validation loss did not improve for {count} evaluation{'s' if count != 1 else ''} ({best}{at})"

    # ---- evaluating, logging, saving ----------------------------------------------------------------

    def _record(self, *, evaluate: bool, log: bool, amend: bool) -> Iterator[Any]:
        """Evaluate (if asked), then log a metrics record (or amend the step's record with the evaluation),
        then keep best/ if the validation loss improved."""
        extra: dict[str, Any] = {}
        if evaluate:
            self.evaluated_step = self.step
            if self.evaluates:
                with self._out_of_memory_as_error(f"evaluating at step {self.step}"):
                    extra = evaluate_model(self.model, self.val_batches, self.cfg.task, self.device, self.autocast, self.byte_lengths)
        if log:
            self.last_record = self._log(extra)
            yield Logged(self.last_record)
        elif amend and extra and self.writer is not None:  # this step was logged before it was evaluated
            self.last_record = self.writer.amend(extra)
            yield Logged(self.last_record)
        val_loss = extra.get("val_loss")
        if val_loss is None:
            return
        if self.best_val is not None and val_loss >= self.best_val:
            self.evals_since_best += 1
            return
        self.best_val, self.best_step, self.evals_since_best = val_loss, self.step, 0
        # best/ may already hold a lower loss: saved after the checkpoint this run resumed from
        if self.best_saved is None or val_loss < self.best_saved:
            self.best_saved = val_loss
            to_save, _ = self._snapshot(with_optimizer=False)
            if self.world.is_main:
                yield Saved(self.step, save_best(self.job, to_save, self.step, val_loss), True)

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
        to_save, _ = self._snapshot(with_optimizer=False)
        if self.world.is_main:
            yield Saved(self.step, save_kept(self.job, to_save, self.step), False)

    def _snapshot(self, with_optimizer: bool = True):
        """(the model to write, its optimizer tensors) on rank 0; under FSDP a collective that gathers the
        shards (every rank calls it; the others get (None, {}))."""
        if not self.fsdp:
            return self.model, (optimizer_tensors(self.optimizer, self.names) if with_optimizer else {})

        weights = sharding.full_weights(self.model)
        tensors = sharding.full_optimizer_tensors(self.model, self.optimizer) if with_optimizer else {}
        return (model_from_tensors(self.model.config, weights) if self.world.is_main else None), tensors

    def _window_totals(self) -> torch.Tensor:
        """The window's loss and target count summed over the ranks (a collective)."""
        return all_sum(self.world, torch.stack([self.window.loss.float(), torch.tensor(float(self.window.count), device=self.device)]))

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
            best_step=self.best_step,
            evals_since_best=self.evals_since_best,
            window_loss=float(totals[0].item()),
            window_count=int(totals[1].item()),
        )

    def _log(self, extra: dict[str, Any]) -> dict[str, Any]:
        totals = self._window_totals()
        rate = self.window.rate()
        record: dict[str, Any] = {"step": self.step}
        if totals[1].item() > 0:
            record["loss"] = totals[0].item() / totals[1].item()
        record.update(
            {
                "lr": self.lr,
                "grad_norm": self.grad_norm,
                "tokens": self.tokens_seen,
                "tokens_per_sec": rate,
                "mfu": self.speed.utilisation(rate),
                "elapsed": self.elapsed,
            }
        )
        record.update(extra)
        record = strict_json({k: (round(v, 4) if k in ("tokens_per_sec", "mfu", "elapsed") else v) for k, v in record.items()})
        if self.writer is not None:
            self.writer.write(record)
        self.last_window, self.window = self.window, MetricsWindow.opened(self.device)
        self.logged_step = self.step
        return record

    def _progress(self) -> StepDone:
        cfg, budget = self.cfg, self.cfg.time_budget
        if budget is None:
            done = self.step / cfg.max_steps
            remaining = (self.elapsed - self.start.elapsed) / max(self.step - self.start.step, 1) * (cfg.max_steps - self.step)
        else:
            done, remaining = min(self.elapsed / budget, 1.0), max(budget - self.elapsed, 0.0)
        rate = self.window.rate(since=self.last_window)  # a few steps' time, not one's
        return StepDone(self.step, self.lr, self.tokens_seen, rate, self.speed.utilisation(rate), self.elapsed, remaining, done)
