"""The one training loop behind `train pretrain` and `train finetune`. It yields events and never prints;
the CLI renders them.

Each step: the learning rate from the schedule, dropout seeded from (seed, step, rank), the global batch's
micro-batches (rank r takes its slice), the summed loss divided by the global target count (so any number
of processes and micro-steps computes the same mean), gradient clipping whose returned norm is checked for
NaN and infinity before the update, then logging, evaluation and checkpoints at their intervals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from tfcli.errors import Interrupted, TfcliError
from tfcli.fsutil import describe_write_error, exclusive_lock
from tfcli.runtime import keep_freed_memory, resolve_device
from tfcli.train.data import Slot, derived_seed
from tfcli.train.distributed import World, agree, join_world, leave_world
from tfcli.train.job import TrainingJob, refuse_existing_run
from tfcli.train.state import (
    BEST_DIR,
    LOSS_PLOT,
    METRICS_FILE,
    OPTIMIZER_FILE,
    TRAINER_FORMAT,
    MetricsWriter,
    TrainerState,
    commit_trainer_state,
    find_trainer_state,
    read_metrics,
    stage_trainer_state,
    strict_json,
    truncate_metrics,
)

WRITE_ERRORS = (OSError, SafetensorError)  # what a save can meet: a full disk, a read-only folder


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
    reason: str  # steps | budget
    run_dir: Path
    best_val_loss: float | None
    last: dict[str, Any]
    elapsed: float
    plot: Path | None


def pick_device(name: str, world: World | None = None) -> torch.device:
    """The device `resolve_device` checks; plain cuda means the local rank's GPU under torchrun."""
    name = resolve_device(name)
    if name == "cuda":
        index = world.local_rank if world is not None and world.enabled else torch.cuda.current_device()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(name)


def use_bf16(precision: str, device: torch.device) -> bool:
    if precision == "bf16":
        return True
    return precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()


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


def _freeze(model, how: str, task: str) -> None:
    if how == "embeddings":
        for module in (model.tok_emb, getattr(model, "pos_emb", None)):
            if module is not None:
                module.weight.requires_grad_(False)
    elif how == "body":
        if task != "classify":
            raise TfcliError("--freeze body leaves only the classification head to train; it needs --task classify")
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith("classifier."))


def _initial_model(job: TrainingJob):
    """A fresh model, the parent's weights (finetune; a new head where the task needs one), or the
    checkpoint's (resume)."""
    from tfcli.checkpoint import load_checkpoint
    from tfcli.model.transformer import Transformer

    torch.manual_seed(derived_seed(job.config.seed, "init"))
    if job.resume:
        return load_checkpoint(job.run_dir).model
    model = Transformer(job.model_config)
    if job.init_from is not None:
        parent = load_checkpoint(job.init_from).model
        weights = parent.state_dict()
        if job.config.task == "classify":
            weights = {k: v for k, v in weights.items() if not k.startswith("classifier.")}
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not unexpected and all(k.startswith("classifier.") for k in missing), (missing, unexpected)
    return model


def _save(job: TrainingJob, model, tensors: dict[str, torch.Tensor], state: TrainerState) -> Path:
    """Write the run directory (weights, config, tokenizer) with its trainer state (the optimizer's
    `tensors`), atomically."""
    from tfcli.checkpoint import save_checkpoint

    try:
        save_checkpoint(job.run_dir, model, job.tokenizer, training=job.training_record(state.step),
                        before_commit=lambda weights: stage_trainer_state(job.run_dir, state, tensors, weights))
        commit_trainer_state(job.run_dir)
    except WRITE_ERRORS as exc:
        raise TfcliError(f"cannot write the checkpoint in {job.run_dir}: {describe_write_error(exc)}",
                         hint="free some space or fix the folder's permissions; the previous checkpoint is intact") from exc
    return job.run_dir


def _save_best(job: TrainingJob, model, step: int, val_loss: float) -> Path:
    from tfcli.checkpoint import save_checkpoint

    try:
        save_checkpoint(job.run_dir / BEST_DIR, model, job.tokenizer, training={**job.training_record(step), "val_loss": val_loss})
    except WRITE_ERRORS as exc:
        raise TfcliError(f"cannot write the best checkpoint in {job.run_dir / BEST_DIR}: {describe_write_error(exc)}",
                         hint="free some space or fix the folder's permissions; the previous best checkpoint is intact") from exc
    return job.run_dir / BEST_DIR


def _check_token_ids(batch, task: str, vocab_size: int, data: Path) -> None:
    """Ids past the vocabulary would fail deep inside the embedding; shards that hold them are damaged."""
    keys = ("ids", "decoder_ids") if task == "classify" else ("ids", "decoder_ids", "labels")
    for key in keys:
        tensor = batch.tensors.get(key)
        if tensor is not None and tensor.numel() and int(tensor.max()) >= vocab_size:
            raise TfcliError(f"{data} holds the token id {int(tensor.max())}, outside the model's vocabulary of {vocab_size:,}",
                             hint="the data is damaged or from another tokenizer; encode it again with `tfcli tokenize encode`")


def _best_saved_val_loss(run_dir: Path) -> float | None:
    """The validation loss best/ was saved with (None when there is none, or it predates the record)."""
    from tfcli.checkpoint import CONFIG_FILE, read_run_config

    if not (run_dir / BEST_DIR / CONFIG_FILE).is_file():
        return None
    try:
        value = (read_run_config(run_dir / BEST_DIR).training or {}).get("val_loss")
    except TfcliError:
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _lowest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def build_source(job: TrainingJob, world: World):
    from tfcli.data.shards import open_shard
    from tfcli.train import data as d

    cfg, tok = job.config, job.tokenizer
    per_rank, block = cfg.batch_size, job.block_size
    if cfg.task in ("classify", "seq2seq"):
        train_set, val_set = job.labeled
        return d.LabeledSource(cfg.task, train_set, val_set, per_rank, cfg.seed, pad_id=tok.require("pad"),
                               eos_id=tok.special_ids.get("eos", 0), accum=cfg.grad_accum)
    train, val = open_shard(job.data, "train"), open_shard(job.data, "val")
    if cfg.task == "lm":
        return d.LMSource(train, val, block, per_rank, cfg.seed)
    if cfg.task == "mlm":
        return d.MLMSource(train, val, block, per_rank, cfg.seed, cls_id=tok.require("cls"), mask_id=tok.require("mask"),
                           vocab=tok.vocab_size, prob=cfg.mask_prob)
    return d.DenoiseSource(train, val, block, per_rank, cfg.seed, pad_id=tok.require("pad"), mask_id=tok.require("mask"),
                           eos_id=tok.require("eos"), density=cfg.noise_density, mean_span=cfg.mean_span)


def token_byte_lengths(job: TrainingJob) -> torch.Tensor:
    """Bytes each token id stands for (special tokens count 0), for bits per byte."""
    lengths = torch.zeros(job.model_config.vocab_size, dtype=torch.long)
    specials = set(job.tokenizer.special_ids.values())
    for i in range(job.tokenizer.vocab_size):
        if i not in specials:
            lengths[i] = len(job.tokenizer.token_bytes(i))
    return lengths


def train(job: TrainingJob) -> Iterator[Any]:
    """Run the job; yields Started, StepDone, Logged, Saved, Note and finally Finished. Raises Interrupted
    (after saving) on SIGINT / SIGTERM and TfcliError on a non-finite loss (keeping the last checkpoint)."""
    device_kind = "cuda" if job.config.device == "cuda" or (job.config.device == "auto" and torch.cuda.is_available()) else "cpu"
    world = join_world(device_kind)
    together = False  # every rank got here: they agree when to stop, also on an interrupt
    try:
        with exclusive_lock(job.run_dir, "training into") if world.is_main else contextlib.nullcontext():
            if world.is_main and not job.resume:
                refuse_existing_run(job.run_dir)  # again, under the lock: another process may have made one since
            yield from _train(job, world)
        together = True
    except Interrupted:
        together = True
        raise
    finally:
        # FSDP leaves reference cycles (its parameters, DTensors, hooks): free them now, while the process
        # group is alive, not at interpreter exit, where a gloo rank once aborted ("terminate called
        # without an active exception").
        gc.collect()
        leave_world(world, together=together)


def _train(job: TrainingJob, world: World) -> Iterator[Any]:
    from tfcli.accel import accelerate
    from tfcli.train.distributed import all_sum
    from tfcli.train.flops import measure_matmul_flops, training_flops_per_token
    from tfcli.train.objectives import evaluate, loss_sum
    from tfcli.checkpoint import model_from_tensors
    from tfcli.train import sharding
    from tfcli.train.optim import load_optimizer_tensors, lr_factor, make_optimizer, optimizer_tensors

    cfg = job.config
    if cfg.fsdp and not world.enabled:
        raise TfcliError("--fsdp shards the model across the processes torchrun starts; this is one process",
                         hint="launch with torchrun --nproc-per-node N -m tfcli train ... --fsdp, or drop --fsdp")
    device = pick_device(cfg.device, world)
    bf16 = use_bf16(cfg.precision, device)
    if device.type == "cpu":
        keep_freed_memory()
    source = build_source(job, world)  # data problems surface before anything is written

    start_step, tokens_seen, elapsed_before, best_val = 0, 0, 0.0, None
    trainer_folder = None
    if job.resume:
        trainer_folder, saved = find_trainer_state(job.run_dir)
        val = f" and {job.val_data}" if job.val_data is not None else ""
        for before, now, problem in (
                (saved.world_size, world.size, f"the world size was {saved.world_size}, now {world.size}"),
                (saved.data_fingerprint, job.data_fingerprint, f"{job.data}{val} is not the data the run was trained on (its contents differ)"),
                (saved.tokenizer_sha256, job.tokenizer.sha256, "the tokenizer is not the one the run was trained with")):
            if before != now:
                raise TfcliError(f"cannot resume: {problem}",
                                 hint="resume with the data, tokenizer and process count the run was started with")
        start_step, tokens_seen, elapsed_before, best_val = saved.step, saved.tokens_seen, saved.elapsed_seconds, saved.best_val_loss
        best_val = _lowest(best_val, _best_saved_val_loss(job.run_dir))  # best/ may be newer than the checkpoint

    model = _initial_model(job)
    _freeze(model, cfg.freeze, cfg.task)
    accelerate(model.to(device).train())
    fsdp = cfg.fsdp
    if fsdp:
        sharding.shard_model(model, device, world)
    names = {id(p): n for n, p in model.named_parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(model, cfg, device)
    if trainer_folder is not None:
        from safetensors.torch import load_file

        saved_tensors = load_file(str(trainer_folder / OPTIMIZER_FILE))
        if fsdp:
            sharding.load_full_optimizer_tensors(model, optimizer, saved_tensors)
        else:
            load_optimizer_tensors(optimizer, saved_tensors, names)

    def snapshot(with_optimizer: bool = True):
        """(the model to write, its optimizer tensors) on rank 0; under FSDP a collective that gathers
        the shards (every rank calls it; the others get (None, {}))."""
        if not fsdp:
            return model, (optimizer_tensors(optimizer, names) if with_optimizer else {})
        weights = sharding.full_weights(model)
        tensors = sharding.full_optimizer_tensors(model, optimizer) if with_optimizer else {}
        return (model_from_tensors(model.config, weights) if world.is_main else None), tensors

    # Under FSDP every rank evaluates (the forward pass is a collective); the results agree, so every rank
    # takes the same save decisions.
    evaluates = world.is_main or fsdp

    runner = model
    ddp = None
    if world.enabled and not fsdp:
        from torch.nn.parallel import DistributedDataParallel

        unused = cfg.task == "classify" or model.config.n_classes > 0
        import inspect

        # the buffers (position tables) are the same on every rank: no syncing before each forward
        no_sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters \
            else {"broadcast_buffers": False}  # the older name
        ddp = runner = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                               find_unused_parameters=unused, **no_sync)
    if cfg.compile:
        runner = torch.compile(runner)

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    rows_per_step = cfg.batch_size * world.size * cfg.grad_accum
    tokens_per_step = rows_per_step * source.tokens_per_row
    peak = measure_matmul_flops(device, torch.bfloat16 if bf16 else torch.float32) if world.is_main else 0.0
    flops_per_step = training_flops_per_token(job.model_config, source.tokens_per_row) * tokens_per_step
    budget = cfg.time_budget
    metrics_path = job.run_dir / METRICS_FILE
    writer = None
    if world.is_main:
        if job.resume:
            truncate_metrics(metrics_path, start_step)
        elif metrics_path.exists():
            metrics_path.unlink()
        writer = MetricsWriter(metrics_path)
    val_batches = source.validation(cfg.eval_batches, cfg.batch_size * world.size) if evaluates else []  # the same set for any world size
    for batch in val_batches:
        _check_token_ids(batch, cfg.task, job.model_config.vocab_size, job.data)
    byte_lengths = token_byte_lengths(job) if cfg.task == "lm" and evaluates else None

    yield Started(start_step, None if budget else cfg.max_steps, budget, sum(p.numel() for p in model.parameters()),
                  sum(p.numel() for p in trainable), str(device), "bf16" if bf16 else "fp32", world.size, tokens_per_step, peak, job.run_dir)
    if budget is None and start_step >= cfg.max_steps:
        yield Note(f"the run is already at step {start_step} of {cfg.max_steps}; raise --max-steps to train further")
    if world.is_main and not val_batches:
        yield Note("the validation split is empty: nothing is validated and no best/ checkpoint is kept")

    step = start_step
    window_loss = torch.zeros((), device=device)
    window_count = 0
    window_start, window_tokens = time.perf_counter(), 0
    run_start = time.perf_counter()
    last_record: dict[str, Any] = {}
    logged_step = saved_step = evaluated_step = -1
    reason = "steps"
    grad_norm = float("nan")
    compile_checked = not cfg.compile

    if job.resume and world.is_main:  # the metrics window the checkpoint was in the middle of
        window_loss = torch.tensor(saved.window_loss, dtype=torch.float32, device=device)
        window_count = saved.window_count

    def utilisation(rate: float) -> float:
        """MFU at `rate` tokens/s. The peak was probed for a moment at the start; on a busy machine that can
        read low, and then what training reaches is the better bound."""
        nonlocal peak
        achieved = rate / max(tokens_per_step, 1) * flops_per_step
        if peak:
            peak = max(peak, achieved)
        return achieved / peak if peak else 0.0

    def window_totals() -> torch.Tensor:
        """The window's loss and target count summed over the ranks (a collective)."""
        return all_sum(world, torch.stack([window_loss.float(), torch.tensor(float(window_count), device=device)]))

    def trainer_state(totals: torch.Tensor) -> TrainerState:
        return TrainerState(TRAINER_FORMAT, step, tokens_seen, elapsed, world.size, job.data_fingerprint, job.tokenizer.sha256,
                            best_val_loss=best_val, window_loss=float(totals[0].item()), window_count=int(totals[1].item()))

    def log(extra: dict[str, Any]) -> dict[str, Any]:
        nonlocal window_loss, window_count, window_start, window_tokens, logged_step
        totals = window_totals()
        now = time.perf_counter()
        rate = window_tokens / max(now - window_start, 1e-9)
        record = {"step": step}
        if totals[1].item() > 0:
            record["loss"] = totals[0].item() / totals[1].item()
        record.update({"lr": lr, "grad_norm": grad_norm, "tokens": tokens_seen, "tokens_per_sec": rate,
                       "mfu": utilisation(rate),
                       "elapsed": elapsed})
        record.update(extra)
        record = strict_json({k: (round(v, 4) if k in ("tokens_per_sec", "mfu", "elapsed") else v) for k, v in record.items()})
        if writer is not None:
            writer.write(record)
        window_loss = torch.zeros((), device=device)
        window_count, window_start, window_tokens, logged_step = 0, now, 0, step
        return record

    lr = cfg.lr
    elapsed = elapsed_before
    with _SignalFlag() as signals:
        try:
            while True:
                interrupted, elapsed = agree(world, signals.received is not None, elapsed_before + time.perf_counter() - run_start, device)
                if interrupted:
                    reason = "interrupted"
                    break
                if budget is None and step >= cfg.max_steps:
                    break
                if budget is not None and elapsed >= budget:
                    reason = "budget"
                    break
                fraction = elapsed / budget if budget else None
                lr = cfg.lr * lr_factor(cfg, step, fraction)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                torch.manual_seed(derived_seed(cfg.seed, "dropout", step, world.rank))
                batches = [source.batch(Slot(step, m, world.rank, world.size)) for m in range(cfg.grad_accum)]
                for batch in batches:
                    _check_token_ids(batch, cfg.task, job.model_config.vocab_size, job.data)
                local_count = sum(b.count for b in batches)
                global_count = int(all_sum(world, torch.tensor(float(local_count), device=device)).item())
                scale = world.size / max(global_count, 1)
                for m, batch in enumerate(batches):
                    batch = batch.to(device)
                    sync = ddp.no_sync() if ddp is not None and m < len(batches) - 1 else contextlib.nullcontext()
                    if fsdp:
                        sharding.set_gradient_sync(model, m == len(batches) - 1)
                    with sync:
                        try:
                            with autocast():
                                loss = loss_sum(runner, batch, cfg.task, cfg.label_smoothing)
                            (loss * scale).backward()
                        except Exception as exc:
                            if compile_checked:
                                raise
                            yield Note(f"torch.compile does not work here ({type(exc).__name__}); training without it")
                            runner = ddp if ddp is not None else model
                            optimizer.zero_grad(set_to_none=True)
                            with autocast():
                                loss = loss_sum(runner, batch, cfg.task, cfg.label_smoothing)
                            (loss * scale).backward()
                        compile_checked = True
                    window_loss += loss.detach().float()
                window_count += local_count  # this rank's; log() sums over ranks
                norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
                grad_norm = float(sharding.local_value(norm))
                if not math.isfinite(grad_norm):
                    kept = f"the last good checkpoint (step {saved_step if saved_step >= 0 else start_step}) is kept" \
                        if saved_step >= 0 or job.resume else "no checkpoint was written"
                    raise TfcliError(f"step {step + 1}: the loss or the gradient norm is not finite ({grad_norm}); {kept}",
                                     hint="lower --lr, raise warm-up (--set warmup_steps=N) or check the data")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                tokens_seen += tokens_per_step
                window_tokens += tokens_per_step
                elapsed = elapsed_before + time.perf_counter() - run_start

                extra: dict[str, Any] = {}
                at_eval = bool(cfg.eval_every) and step % cfg.eval_every == 0
                if at_eval:
                    evaluated_step = step
                    if evaluates:
                        extra = evaluate(model, val_batches, cfg.task, device, autocast, byte_lengths)
                if at_eval or step % cfg.log_every == 0:  # the same steps on every rank: log() is a collective
                    last_record = log(extra)
                    yield Logged(last_record)
                if extra.get("val_loss") is not None and (best_val is None or extra["val_loss"] < best_val):
                    best_val = extra["val_loss"]
                    to_save, _ = snapshot(with_optimizer=False)
                    if world.is_main:
                        yield Saved(step, _save_best(job, to_save, step, best_val), True)
                if cfg.save_every and step % cfg.save_every == 0:
                    totals = window_totals()
                    if world.is_main or fsdp:
                        to_save, tensors = snapshot()
                    if world.is_main:
                        yield Saved(step, _save(job, to_save, tensors, trainer_state(totals)), False)
                        writer.sync()
                    saved_step = step
                if budget is None:
                    done = step / cfg.max_steps
                    remaining = (elapsed - elapsed_before) / max(step - start_step, 1) * (cfg.max_steps - step)
                else:
                    done, remaining = min(elapsed / budget, 1.0), max(budget - elapsed, 0.0)
                rate = window_tokens / max(time.perf_counter() - window_start, 1e-9) if window_tokens else last_record.get("tokens_per_sec", 0.0)
                yield StepDone(step, lr, tokens_seen, rate, utilisation(rate),
                               elapsed, remaining, done)

            # The end (or an interruption): evaluate, log, save what this step has not already.
            extra = {}
            if evaluated_step != step and evaluates and step > start_step and reason != "interrupted":
                extra = evaluate(model, val_batches, cfg.task, device, autocast, byte_lengths)
            if logged_step != step and step > start_step and reason != "interrupted":  # an interruption keeps its window
                last_record = log(extra)
                yield Logged(last_record)
            elif extra and writer is not None:  # this step was logged before it was evaluated
                last_record = writer.amend(extra)
                yield Logged(last_record)
            if extra.get("val_loss") is not None and (best_val is None or extra["val_loss"] < best_val):
                best_val = extra["val_loss"]
                to_save, _ = snapshot(with_optimizer=False)
                if world.is_main:
                    yield Saved(step, _save_best(job, to_save, step, best_val), True)
            totals = window_totals()
            if saved_step != step and (world.is_main or fsdp) and (step > start_step or not job.resume):
                to_save, tensors = snapshot()
                if world.is_main:
                    yield Saved(step, _save(job, to_save, tensors, trainer_state(totals)), False)
        finally:
            if writer is not None:
                writer.close()
    plot = None
    if world.is_main:
        from tfcli.train.plot import plot_loss_curve

        title = f"{job.run_dir.name}: {cfg.task}, {job.model_config.arch}, step {step}"
        if plot_loss_curve(read_metrics(metrics_path), job.run_dir / LOSS_PLOT, title):
            plot = job.run_dir / LOSS_PLOT
    if reason == "interrupted":
        signum = signals.received or signal.SIGINT
        raise Interrupted(f"stopped at step {step}; the checkpoint is saved in {job.run_dir}; continue with the same command and --resume",
                          128 + int(signum))
    if not last_record:
        last_record = {"step": step}
    yield Finished(step, reason, job.run_dir, best_val, last_record, elapsed, plot)
