"""`tfcli bench lora`: what LoRA saves. The same fine-tune of a parent run (a random model of the preset's
shape, on random token shards) through tfcli's real path (`finetune_job`, the training loop), once training
every weight and once with LoRA adapters, each in its own process: peak RSS and seconds per step (wall and
CPU), and their ratios (targets: RSS <= 0.6x, step time <= 0.8x at gpt2-small).

An untimed run of each kind first lets tfcli.accel measure its choices for these shapes (kept in its
decisions file), so the measured runs time and weigh what every later run does."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tfcli.bench.common import peak_rss_mb, run_worker
from tfcli.checkpoint import save_checkpoint
from tfcli.corpus.reader import resolve_corpus
from tfcli.data.shards import SHARD_FORMAT_VERSION, ShardMeta, shard_dtype_name
from tfcli.model.config import preset
from tfcli.model.transformer import Transformer
from tfcli.runtime import keep_freed_memory
from tfcli.tokenizer.core import TOKENIZER_FILE, TextTokenizer
from tfcli.tokenizer.train import TokenizerTrainingConfig, train_tokenizer
from tfcli.train.events import Started, StepDone
from tfcli.train.job import finetune_job
from tfcli.train.loop import train

WARMUP = 2  # steps before the clock starts


@dataclasses.dataclass
class LoraMeasurement:
    kind: str  # full | lora
    seconds_per_step: float
    peak_rss_mb: float
    parameters: int
    trainable: int
    cpu_seconds_per_step: float = 0.0  # the process's CPU time (all its threads): steadier than wall time on a busy machine


@dataclasses.dataclass
class LoraBench:
    preset: str
    rank: int
    targets: str
    batch: int
    block_size: int
    full: LoraMeasurement
    lora: LoraMeasurement

    @property
    def rss_ratio(self) -> float:
        return self.lora.peak_rss_mb / self.full.peak_rss_mb

    @property
    def time_ratio(self) -> float:
        return self.lora.seconds_per_step / self.full.seconds_per_step

    @property
    def cpu_time_ratio(self) -> float:
        return self.lora.cpu_seconds_per_step / self.full.cpu_seconds_per_step


def _make_parent(folder: Path, preset_name: str, block: int) -> None:
    """A random model of the preset's shape saved as a run, random token shards, and a small byte-level
    tokenizer (with the eos a fine-tune needs) for both."""
    config = preset(preset_name)
    text = folder / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200, encoding="utf-8")
    train_tokenizer(resolve_corpus([text]), folder / "tokenizer", TokenizerTrainingConfig(vocab_size=300))
    tokenizer = TextTokenizer.load(folder / "tokenizer" / TOKENIZER_FILE)
    shards = folder / "shards"
    shards.mkdir()
    dtype = shard_dtype_name(config.vocab_size)
    rng = np.random.default_rng(0)
    split_tokens = {"train": max(100_000, 64 * block), "val": 10_000}
    for split, n in split_tokens.items():
        rng.integers(0, config.vocab_size, n).astype(np.dtype(dtype).newbyteorder("<")).tofile(shards / f"{split}.bin")
    meta = ShardMeta(SHARD_FORMAT_VERSION, dtype, config.vocab_size, 0, tokenizer.sha256, split_tokens["train"], split_tokens["val"], 1, 1, 0.1, 0, "file", [])
    (shards / "meta.json").write_text(json.dumps(meta.to_json()))
    torch.manual_seed(0)
    save_checkpoint(folder / "parent", Transformer(config), tokenizer)


def _job(kind: str, folder: Path, batch: int, block: int, steps: int, rank: int, targets: str, threads: int) -> LoraMeasurement:
    keep_freed_memory()  # as `tfcli train` sets it
    if threads:
        torch.set_num_threads(threads)
    options = dict(max_steps=WARMUP + steps + 1, batch_size=batch, block_size=block, eval_every=0, save_every=0, log_every=10**9, device="cpu")
    if kind == "lora":
        options.update(lora_rank=rank, lora_targets=targets)
    run_dir = Path(tempfile.mkdtemp(dir=folder, prefix=f"{kind}-"))
    job = finetune_job(
        init_from=folder / "parent",
        task="lm",
        data=folder / "shards",
        val_data=None,
        output=run_dir,
        config_file=None,
        sets=[],
        options=options,
        resume=False,
    )
    events = train(job)
    started_at, cpu_at, parameters, trainable = 0.0, 0.0, 0, 0
    try:
        for event in events:
            if isinstance(event, Started):
                parameters, trainable = event.parameters, event.trainable
            elif isinstance(event, StepDone):
                if steps == 0:  # untimed: one step measures tfcli.accel's choices
                    return LoraMeasurement(kind, 0.0, peak_rss_mb(), parameters, trainable)
                if event.step == WARMUP:
                    started_at, cpu_at = time.perf_counter(), time.process_time()
                elif event.step == WARMUP + steps:
                    seconds, cpu = (time.perf_counter() - started_at) / steps, (time.process_time() - cpu_at) / steps
                    return LoraMeasurement(kind, seconds, peak_rss_mb(), parameters, trainable, cpu)
    finally:
        events.close()
    raise RuntimeError("the training loop ended early")


def run_lora_bench(
    preset_name: str,
    rank: int,
    targets: str,
    batch: int,
    block: int,
    steps: int,
    repeat: int = 1,
    threads: int = 0,
    workdir: Path | None = None,
    first_run: bool = True,
) -> LoraBench:
    """Full fine-tuning and LoRA on the same parent and data, each in fresh processes; the fastest of
    `repeat` interleaved rounds per kind, with the highest peak RSS any of its rounds reached. With
    first_run, an untimed run of each kind first."""
    folder = Path(tempfile.mkdtemp(prefix="tfcli-bench-lora-", dir=workdir))
    try:
        run_worker("tfcli.bench.lora", ["parent", str(folder), preset_name, str(block)])
        common = [str(folder), str(batch), str(block)]
        for kind in ("full", "lora") if first_run else ():  # untimed: tfcli.accel measures its choices for these shapes once
            run_worker("tfcli.bench.lora", [kind, *common, "0", str(rank), targets, str(threads)])
        best: dict[str, LoraMeasurement] = {}
        for _ in range(repeat):
            for kind in ("full", "lora"):
                measured = LoraMeasurement(**run_worker("tfcli.bench.lora", [kind, *common, str(steps), str(rank), targets, str(threads)]))
                kept = best.get(kind)
                if kept is None or measured.seconds_per_step < kept.seconds_per_step:
                    measured.peak_rss_mb = max(measured.peak_rss_mb, kept.peak_rss_mb if kept else 0.0)
                    best[kind] = measured
                else:
                    kept.peak_rss_mb = max(kept.peak_rss_mb, measured.peak_rss_mb)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return LoraBench(preset_name, rank, targets, batch, block, best["full"], best["lora"])


if __name__ == "__main__":
    what, folder_arg = sys.argv[1], Path(sys.argv[2])
    if what == "parent":
        _make_parent(folder_arg, sys.argv[3], int(sys.argv[4]))
        print(json.dumps({}))
    else:
        batch_arg, block_arg, steps_arg, rank_arg, targets_arg, threads_arg = sys.argv[3:]
        result = _job(what, folder_arg, int(batch_arg), int(block_arg), int(steps_arg), int(rank_arg), targets_arg, int(threads_arg))
        print(json.dumps(dataclasses.asdict(result)))
