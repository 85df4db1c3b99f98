"""`tfcli bench train`: training throughput of tfcli's real loop beside a plain loop over transformers'
GPT2LMHeadModel of the same shape, batch and optimizer (AdamW, decay on matrices, clipping), each in its
own process, on the same random token shards. Reports tokens/s and MFU against the matmul rate measured
on the same device.

Before the timed rounds an untimed tfcli run lets tfcli.accel measure its choices for these shapes on this
machine (kept in its decisions file), as the first run of any command here does: the rounds then time what
every later run does, and the first run's extra time and memory stay out of the table."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tfcli.bench.common import peak_rss_mb, run_worker
from tfcli.data.shards import SHARD_FORMAT_VERSION, ShardMeta, open_shard, shard_dtype_name
from tfcli.hf import gpt2_config
from tfcli.model.config import preset
from tfcli.runtime import keep_freed_memory
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.families import build_untrained
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig
from tfcli.train.data import LMSource, Slot
from tfcli.train.events import Started, StepDone
from tfcli.train.fingerprint import shard_fingerprint
from tfcli.train.flops import measure_matmul_flops, training_flops_per_token
from tfcli.train.job import ShardJob
from tfcli.train.loop import train
from tfcli.train.optim import make_optimizer
from tfcli.train.setup import pick_device, use_bf16
from tfcli.training_config import TrainConfig


@dataclasses.dataclass
class TrainMeasurement:
    implementation: str
    preset: str
    tokens_per_sec: float
    mfu: float
    peak_flops: float
    seconds_per_step: float
    peak_rss_mb: float
    parameters: int


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


def _job(implementation: str, preset_name: str, batch: int, steps: int, threads: int, device_name: str, precision: str) -> TrainMeasurement:
    keep_freed_memory()  # as `tfcli train` sets it, for both loops, so they differ only in their own work
    if threads:
        torch.set_num_threads(threads)
    model_config = preset(preset_name)
    warmup = 3
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
    )
    device = pick_device(device_name)
    bf16 = use_bf16(precision, device)
    block = model_config.block_size
    tokens_per_step = batch * block
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, shard_dir = _make_data(Path(tmp), model_config.vocab_size, max(200_000, 4 * tokens_per_step))
        if implementation == "tfcli":
            seconds, parameters = _time_tfcli(model_config, config, tokenizer, shard_dir, Path(tmp) / "run", warmup, steps)
        else:
            seconds, parameters = _time_transformers(model_config, config, shard_dir, device, bf16, warmup, steps)
    peak = measure_matmul_flops(device, torch.bfloat16 if bf16 else torch.float32, seconds=1.0)
    rate = tokens_per_step / seconds
    mfu = rate * training_flops_per_token(model_config, block) / peak
    return TrainMeasurement(implementation, preset_name, rate, mfu, peak, seconds, peak_rss_mb(), parameters)


def _time_tfcli(model_config, config, tokenizer, shard_dir, run_dir, warmup: int, steps: int) -> tuple[float, int]:
    """Seconds per step of the real training loop (data, schedule, forward, backward, clipping, AdamW)."""
    job = ShardJob(run_dir, model_config, config, tokenizer, shard_dir, data_fingerprint=shard_fingerprint(shard_dir))
    run_dir.mkdir()
    events = train(job)
    started_at, parameters = 0.0, 0
    try:
        for event in events:
            if isinstance(event, Started):
                parameters = event.parameters
            elif isinstance(event, StepDone):
                if event.step == warmup:
                    started_at = time.perf_counter()
                elif event.step == warmup + steps:
                    return (time.perf_counter() - started_at) / steps, parameters
    finally:
        events.close()
    raise RuntimeError("the training loop ended early")


def _time_transformers(model_config, config, shard_dir, device, bf16: bool, warmup: int, steps: int) -> tuple[float, int]:
    """Seconds per step of a plain loop over GPT2LMHeadModel: the same batches, AdamW and clipping."""
    import transformers

    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(**{k: v for k, v in gpt2_config(model_config, 0).items() if k not in ("architectures", "model_type")})
    model = transformers.GPT2LMHeadModel(hf_config).to(device).train()
    optimizer = make_optimizer(model, config, device)  # the same parameter groups: decay on matrices
    source = LMSource(open_shard(shard_dir, "train"), open_shard(shard_dir, "val"), model_config.block_size, config.batch_size, config.seed)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    started_at = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            _sync(device)
            started_at = time.perf_counter()
        batch = source.batch(Slot(step, 0)).to(device)
        with autocast():
            loss = model(batch.tensors["ids"], labels=batch.tensors["ids"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    return (time.perf_counter() - started_at) / steps, sum(p.numel() for p in model.parameters())


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_train_bench(
    presets: list[str], batch: int, steps: int, repeat: int = 1, threads: int = 0, device: str = "cpu", precision: str = "auto", first_run: bool = True
) -> list[TrainMeasurement]:
    """Best of `repeat` interleaved rounds per preset and implementation (after the untimed first run unless
    `first_run` is False); MFU against the highest matmul rate any worker measured."""
    best: dict[tuple[str, str], TrainMeasurement] = {}
    for name in presets if first_run else []:  # untimed: tfcli measures its choices for these shapes here once, as any first run does
        run_worker("tfcli.bench.train", ["tfcli", name, str(batch), "1", str(threads), device, precision])
    for _ in range(repeat):
        for name in presets:
            for implementation in ("tfcli", "transformers"):
                args = [implementation, name, str(batch), str(steps), str(threads), device, precision]
                measured = TrainMeasurement(**run_worker("tfcli.bench.train", args))
                key = (name, implementation)
                if key not in best or measured.tokens_per_sec > best[key].tokens_per_sec:
                    best[key] = measured
    measured = [best[(name, implementation)] for name in presets for implementation in ("tfcli", "transformers")]
    peak = max(m.peak_flops for m in measured)  # one yardstick for every row: the best rate any worker saw
    for m in measured:
        m.mfu, m.peak_flops = m.mfu * m.peak_flops / peak, peak
    return measured


if __name__ == "__main__":
    impl, preset_arg, batch_arg, steps_arg, threads_arg, device_arg, precision_arg = sys.argv[1:]
    result = _job(impl, preset_arg, int(batch_arg), int(steps_arg), int(threads_arg), device_arg, precision_arg)
    print(json.dumps(dataclasses.asdict(result)))
