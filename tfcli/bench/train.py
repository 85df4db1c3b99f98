"""`tfcli bench train`: training throughput of tfcli's real loop beside a plain loop over transformers'
GPT2LMHeadModel of the same shape, batch and optimizer (AdamW, decay on matrices, clipping), each in its
own process, on the same random token shards. Reports tokens/s and MFU against the matmul rate measured
on the same device and, on a CUDA card whose datasheet tfcli knows (`tfcli.train.flops.datasheet_peak`), MFU
against that card's dense bf16 peak too. `batch="max"` first finds the largest batch that fits: one worker
doubles the batch from 1 through tfcli's real loop until the device reports out-of-memory (or the cap), and
the rounds are measured at the largest that ran.

`compile=True` runs both loops under torch.compile: tfcli's as `tfcli train --compile` does (the trainer compiles
what its forward pass runs), transformers' model compiled the same way. Compiling happens in the first steps,
which the warm-up absorbs: tokens/s counts only the timed steps, and the warm-up's time beyond that of as many
timed steps is reported apart, as the compile time. The batch search never compiles (a compile per batch tried).

Both loops run on one clock (`tfcli.bench.step_clock`): the same untimed warm-up steps, then wall and CPU
time over the same number of timed steps, whatever that number is.

Before the timed rounds an untimed tfcli run lets tfcli.accel measure its choices for these shapes on this
machine (kept in its decisions file), as the first run of any command here does: the rounds then time what
every later run does, and the first run's extra time and memory stay out of the table."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from tfcli.bench.common import peak_rss_mb, run_worker
from tfcli.bench.step_clock import StepTimes, time_steps
from tfcli.data.shards import SHARD_FORMAT_VERSION, ShardMeta, open_shard, shard_dtype_name
from tfcli.errors import TfcliError
from tfcli.hf import gpt2_config
from tfcli.model.config import preset
from tfcli.runtime import keep_freed_memory, physical_memory
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.families import build_untrained
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig
from tfcli.train.data import LMSource, Slot
from tfcli.train.events import Note, Started, StepDone
from tfcli.train.fingerprint import shard_fingerprint
from tfcli.train.flops import datasheet_peak, measure_matmul_flops, training_flops_per_token
from tfcli.train.job import ShardJob
from tfcli.train.loop import train
from tfcli.train.optim import make_optimizer
from tfcli.train.setup import pick_device, refuse_a_batch_memory_cannot_hold, use_bf16
from tfcli.training_config import TrainConfig


@dataclasses.dataclass
class TrainMeasurement:
    implementation: str
    preset: str
    tokens_per_sec: float
    mfu: float  # against peak_flops, the fastest matmul measured on the device
    peak_flops: float
    seconds_per_step: float
    peak_rss_mb: float
    parameters: int
    batch: int = 0
    device_name: str = ""  # torch.cuda.get_device_name() on a GPU, else the device type
    peak_device_mb: float = 0.0  # the most GPU memory its tensors held (0 on the CPU)
    card_mfu: float | None = None  # against the card's datasheet dense bf16 peak, where `CardYardstick` has one
    out_of_memory: str = ""  # the device's out-of-memory message where this implementation did not fit the batch
    bf16: bool = False  # trained under bf16 autocast
    device_type: str = "cpu"
    compiled: bool = False  # its forward and backward ran compiled by torch.compile
    compile_seconds: float = 0.0  # compiled: the warm-up steps' time beyond that of as many timed steps (compiling, mostly)
    note: str = ""  # why a loop asked to compile ran without it (torch.compile failed on its first step)
    cpu_seconds_per_step: float = 0.0  # the worker's CPU time over the same timed steps, all its threads


@dataclasses.dataclass
class CardYardstick:
    """The datasheet peak the rows' card_mfu is measured against, or why there is none (`note`)."""

    device_name: str
    card: str = ""
    bf16_peak_flops: float = 0.0
    note: str = ""


@dataclasses.dataclass
class BatchSearch:
    """`batch="max"`: the batches tried, in order, whether each fit, and the largest that did."""

    largest: int
    tried: list[tuple[int, bool]]
    stopped_by: str  # "out of memory", "the cap (--max-batch N)" or "the memory, by an estimate" (`_too_big`)


WARMUP_STEPS = 3  # untimed steps before the timed ones: allocators, kernels' first runs, torch.compile's compiling
ACTIVATION_BYTES = 64  # a CPU batch is not tried past half the memory at this many bytes per layer, token and model dimension


def card_yardstick(device_name: str, device_type: str, bf16: bool) -> CardYardstick:
    """MFU's second yardstick: the card's dense bf16 peak from its datasheet, for a bf16 run on a CUDA card
    tfcli knows; otherwise why not."""
    if device_type != "cuda":
        return CardYardstick(device_name, note=f"no datasheet peak on {device_type}: MFU is against the fastest matmul measured")
    peak = datasheet_peak(device_name)
    if peak is None:
        return CardYardstick(device_name, note=f"{device_name!r} is not in tfcli's datasheet table: MFU is against the fastest matmul measured")
    if not bf16:
        return CardYardstick(
            device_name,
            peak.card,
            peak.bf16_flops,
            note="the datasheet peak is bf16's and this run trained in fp32: MFU is against the fastest matmul measured",
        )
    return CardYardstick(device_name, peak.card, peak.bf16_flops)


def find_largest_batch(fits, cap: int, *, too_big=lambda batch: False) -> BatchSearch:
    """Double the batch from 1 while `fits(batch)` (False: the device ran out of memory) and the batch is at
    most `cap` and not `too_big` (an estimate, where the device reports no out-of-memory); the largest that fit.
    Example: fits = lambda b: b <= 8, cap 64 -> largest 8, tried [(1, True), (2, True), (4, True), (8, True), (16, False)]"""
    tried: list[tuple[int, bool]] = []
    batch, stopped_by = 1, f"the cap (--max-batch {cap})"
    while batch <= cap:
        if too_big(batch):
            stopped_by = "the memory, by an estimate"
            break
        ok = fits(batch)
        tried.append((batch, ok))
        if not ok:
            stopped_by = "out of memory"
            break
        batch *= 2
    fitted = [b for b, ok in tried if ok]
    if not fitted:
        raise TfcliError("not even one sequence per step fits on this device", hint="use a smaller preset")
    return BatchSearch(max(fitted), tried, stopped_by)


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` is the device running out of memory (torch's own error, or one that reports it, such as
    tfcli.accel's "no candidate ran" when every candidate ran out)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error).lower()
    return "out of memory" in text or "outofmemoryerror" in text or "alloc_failed" in text


def _too_big(model_config, device: torch.device):
    """The batches the search does not try: one tfcli's loop refuses (its activations, counted low, past the
    device's memory) and, on the CPU (no out-of-memory error there, only swapping or the kernel's killer),
    one whose activations, counted generously, pass half the memory."""
    total = physical_memory()
    per_row = ACTIVATION_BYTES * model_config.block_size * model_config.d_model * max(1, model_config.n_layers)

    def too_big(batch: int) -> bool:
        try:
            refuse_a_batch_memory_cannot_hold(model_config, batch, device)
        except TfcliError:
            return True
        return device.type == "cpu" and bool(total) and batch * per_row > total // 2

    return too_big


def _make_data(folder: Path, vocab_size: int, tokens: int, seed: int = 0):
    """Random token shards and a byte-level tokenizer to stand beside them (the loop needs one)."""
    tokenizer_dir = folder / "tokenizer"
    tokenizer_dir.mkdir(parents=True)
    hf, _ = build_untrained(TokenizerTrainingConfig(vocab_size=300))
    hf.save(str(tokenizer_dir / "tokenizer.json"))
    tokenizer = TextTokenizer.load(tokenizer_dir / "tokenizer.json")
    shard_dir = folder / "shards"
    shard_dir.mkdir()
    dtype = shard_dtype_name(vocab_size)
    rng = np.random.default_rng(seed)
    split_tokens = {"train": tokens, "val": tokens // 10}
    for split, n in split_tokens.items():
        rng.integers(0, vocab_size, n).astype(np.dtype(dtype).newbyteorder("<")).tofile(shard_dir / f"{split}.bin")
    meta = ShardMeta(SHARD_FORMAT_VERSION, dtype, vocab_size, 0, tokenizer.sha256, split_tokens["train"], split_tokens["val"], 1, 1, 0.1, seed, "file", [])
    (shard_dir / "meta.json").write_text(json.dumps(meta.to_json()))
    return tokenizer, shard_dir


def _job(
    implementation: str, preset_name: str, batch: int, steps: int, threads: int, device_name: str, precision: str, compile: bool = False
) -> TrainMeasurement:
    keep_freed_memory()  # as `tfcli train` sets it, for both loops, so they differ only in their own work
    if threads:
        torch.set_num_threads(threads)
    model_config = preset(preset_name)
    device = pick_device(device_name)
    try:
        return _measure(implementation, preset_name, model_config, batch, steps, device_name, precision, compile=compile)
    except Exception as error:
        if not out_of_memory(error):
            raise
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
    return TrainMeasurement(
        implementation, preset_name, 0.0, 0.0, 0.0, 0.0, peak_rss_mb(), 0, batch, _device_name(device), out_of_memory=message, device_type=device.type
    )


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _probe(preset_name: str, cap: int, threads: int, device_name: str, precision: str) -> BatchSearch:
    """Inside a worker: the batch search through tfcli's real loop (two steps at each batch); the search stops
    at the first out-of-memory, so nothing it leaves behind is reused."""
    keep_freed_memory()
    if threads:
        torch.set_num_threads(threads)
    model_config = preset(preset_name)
    device = pick_device(device_name)

    def fits(batch: int) -> bool:
        try:
            _measure("tfcli", preset_name, model_config, batch, 1, device_name, precision, warmup=1, with_peak=False)
        except Exception as error:
            if not out_of_memory(error):
                raise
            return False
        return True

    return find_largest_batch(fits, cap, too_big=_too_big(model_config, device))


def _measure(
    implementation: str,
    preset_name: str,
    model_config,
    batch: int,
    steps: int,
    device_name: str,
    precision: str,
    warmup: int = WARMUP_STEPS,
    with_peak: bool = True,
    compile: bool = False,
) -> TrainMeasurement:
    config = TrainConfig(
        max_steps=warmup + steps + 1,
        batch_size=batch,
        lr=1e-3,
        warmup_steps=0,
        eval_every=0,
        save_every=0,
        log_every=10**9,
        device=device_name,
        precision=precision,
        compile=compile,
    )
    device = pick_device(device_name)
    bf16 = use_bf16(precision, device)
    block = model_config.block_size
    tokens_per_step = batch * block
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, shard_dir = _make_data(Path(tmp), model_config.vocab_size, max(200_000, 4 * tokens_per_step))
        if implementation == "tfcli":
            timed, facts = _time_tfcli(model_config, config, tokenizer, shard_dir, Path(tmp) / "run", device, warmup, steps)
        else:
            timed, facts = _time_transformers(model_config, config, shard_dir, device, bf16, warmup, steps)
    seconds, parameters = timed.seconds_per_step, facts.parameters
    compiled = compile and not facts.note
    peak_device_mb = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    rate = tokens_per_step / seconds
    peak = measure_matmul_flops(device, torch.bfloat16 if bf16 else torch.float32, seconds=1.0) if with_peak else 0.0
    mfu = rate * training_flops_per_token(model_config, block) / peak if peak else 0.0
    yardstick = card_yardstick(_device_name(device), device.type, bf16)
    card_mfu = rate * training_flops_per_token(model_config, block) / yardstick.bf16_peak_flops if yardstick.bf16_peak_flops and bf16 else None
    return TrainMeasurement(
        implementation,
        preset_name,
        rate,
        mfu,
        peak,
        seconds,
        peak_rss_mb(),
        parameters,
        batch,
        _device_name(device),
        peak_device_mb,
        card_mfu,
        bf16=bf16,
        device_type=device.type,
        compiled=compiled,
        compile_seconds=max(0.0, timed.warmup_seconds - warmup * seconds) if compiled else 0.0,
        note=facts.note,
        cpu_seconds_per_step=timed.cpu_seconds_per_step,
    )


@dataclasses.dataclass
class LoopFacts:
    """What a loop tells the bench besides its clock: its parameter count, and why it ran uncompiled where it was
    asked to compile."""

    parameters: int = 0
    note: str = ""


def _time_tfcli(model_config, config, tokenizer, shard_dir, run_dir, device, warmup: int, steps: int) -> tuple[StepTimes, LoopFacts]:
    """The real training loop (data, schedule, forward, backward, clipping, AdamW) on the bench's clock."""
    job = ShardJob(run_dir, model_config, config, tokenizer, shard_dir, data_fingerprint=shard_fingerprint(shard_dir))
    run_dir.mkdir()
    facts = LoopFacts()
    loop = _tfcli_steps(train(job), facts)
    try:
        return time_steps(loop, device, warmup, steps), facts
    finally:
        loop.close()


def _tfcli_steps(events, facts: LoopFacts) -> Iterator[None]:
    """tfcli's loop as the clock reads one: a yield once it has started, then one per step done."""
    try:
        for event in events:
            if isinstance(event, Started):
                facts.parameters = event.parameters
                yield
            elif isinstance(event, Note) and "torch.compile" in event.message:
                facts.note = event.message
            elif isinstance(event, StepDone):
                yield
    finally:
        events.close()


def _time_transformers(model_config, config, shard_dir, device, bf16: bool, warmup: int, steps: int) -> tuple[StepTimes, LoopFacts]:
    """A plain loop over GPT2LMHeadModel on the bench's clock: the same batches, AdamW and clipping."""
    facts = LoopFacts()
    loop = _transformers_steps(model_config, config, shard_dir, device, bf16, facts)
    try:
        return time_steps(loop, device, warmup, steps), facts
    finally:
        loop.close()


def _transformers_steps(model_config, config, shard_dir, device, bf16: bool, facts: LoopFacts) -> Iterator[None]:
    """The plain loop as the clock reads one: a yield once the model is built, then one per step. With
    `config.compile` its model is compiled by torch.compile, as tfcli's trainer compiles its own (and, as it
    does, run without the compiler where the first step fails under it)."""
    import transformers

    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(**{k: v for k, v in gpt2_config(model_config, 0).items() if k not in ("architectures", "model_type")})
    model = transformers.GPT2LMHeadModel(hf_config).to(device).train()
    runner = torch.compile(model) if config.compile else model
    optimizer = make_optimizer(model, config, device)  # the same parameter groups: decay on matrices
    source = LMSource(open_shard(shard_dir, "train"), open_shard(shard_dir, "val"), model_config.block_size, config.batch_size, config.seed)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def forward_backward(ids: torch.Tensor) -> None:
        with autocast():
            loss = runner(ids, labels=ids).loss
        loss.backward()

    facts.parameters = sum(p.numel() for p in model.parameters())
    yield
    for step in itertools.count():
        ids = source.batch(Slot(step, 0)).to(device).tensors["ids"]
        try:
            forward_backward(ids)
        except Exception as exc:
            if runner is model or step or out_of_memory(exc):
                raise
            facts.note = f"torch.compile does not work here ({type(exc).__name__}); trained without it"
            runner = model
            optimizer.zero_grad(set_to_none=True)
            forward_backward(ids)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        yield


@dataclasses.dataclass
class TrainBench:
    results: list[TrainMeasurement]  # per preset: tfcli's row, then transformers'
    batch: int  # the batch every row ran at
    yardstick: CardYardstick
    search: BatchSearch | None = None  # with batch="max"
    compile: bool = False  # both loops were asked to run under torch.compile (each row says whether it did)
    steps: int = 0  # timed steps per row, after WARMUP_STEPS untimed ones on each loop


def run_train_bench(
    presets: list[str],
    batch: int | str,
    steps: int,
    repeat: int = 1,
    threads: int = 0,
    device: str = "cpu",
    precision: str = "auto",
    first_run: bool = True,
    max_batch: int = 1024,
    compile: bool = False,
) -> TrainBench:
    """Best of `repeat` interleaved rounds per preset and implementation (after the untimed first run unless
    `first_run` is False); MFU against the highest matmul rate any worker measured, and against the card's
    datasheet peak where there is one. `batch="max"`: the largest batch (a power of two, at most `max_batch`)
    that the first preset fits, found first (the search is the untimed first run then). `compile`: both loops
    under torch.compile (the search and the untimed first run are not compiled)."""
    search = None
    if batch == "max":
        found = run_worker("tfcli.bench.train", ["probe", presets[0], str(max_batch), str(threads), device, precision])
        search = BatchSearch(found["largest"], [(b, ok) for b, ok in found["tried"]], found["stopped_by"])
        batch, first_run = search.largest, False
    best: dict[tuple[str, str], TrainMeasurement] = {}
    for name in presets if first_run else []:  # untimed: tfcli measures its choices for these shapes here once, as any first run does
        run_worker("tfcli.bench.train", ["tfcli", name, str(batch), "1", str(threads), device, precision])
    for _ in range(repeat):
        for name in presets:
            for implementation in ("tfcli", "transformers"):
                args = [implementation, name, str(batch), str(steps), str(threads), device, precision, "compile" if compile else "eager"]
                measured = TrainMeasurement(**run_worker("tfcli.bench.train", args))
                key = (name, implementation)
                if key not in best or measured.tokens_per_sec > best[key].tokens_per_sec:
                    best[key] = measured
    measured = [best[(name, implementation)] for name in presets for implementation in ("tfcli", "transformers")]
    ran = [m for m in measured if not m.out_of_memory]
    if not ran:
        raise TfcliError(f"batch {batch} does not fit on this device for either loop", hint="use a smaller --batch, or --batch max")
    peak = max(m.peak_flops for m in ran)  # one yardstick for every row: the best rate any worker saw
    for m in ran:
        m.mfu, m.peak_flops = m.mfu * m.peak_flops / peak, peak
    yardstick = card_yardstick(ran[0].device_name, ran[0].device_type, ran[0].bf16)
    return TrainBench(measured, int(batch), yardstick, search, compile, steps)


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        preset_arg, cap_arg, threads_arg, device_arg, precision_arg = sys.argv[2:]
        print(json.dumps(dataclasses.asdict(_probe(preset_arg, int(cap_arg), int(threads_arg), device_arg, precision_arg))))
        sys.exit(0)
    impl, preset_arg, batch_arg, steps_arg, threads_arg, device_arg, precision_arg, *mode_arg = sys.argv[1:]
    result = _job(impl, preset_arg, int(batch_arg), int(steps_arg), int(threads_arg), device_arg, precision_arg, mode_arg == ["compile"])
    print(json.dumps(dataclasses.asdict(result)))
