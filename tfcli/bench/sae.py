"""`tfcli bench sae`: tfcli's SAE trainer beside SAELens's (`sae_lens.SAETrainer`, fed the same batches through
its data-provider iterator) on the same activations of the same run: same architecture (topk), width, k,
learning rate (Adam, constant), batch size, tokens, AuxK weight and dead-feature window, both on `threads`
CPU threads. The activations are drawn once from the run through the hook point (as `tfcli train sae`
streams them) and handed to both; only the training is timed (CPU seconds: the machine may be shared).
Both SAEs are then scored by the same code on the same held-out windows: L0, explained variance, dead
features and CE loss recovered. SAELens runs in a process of its own (tfcli.bench.sae_worker)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tfcli.bench.common import peak_rss_mb, reset_peak_rss, run_worker
from tfcli.errors import TfcliError
from tfcli.loader import load_run
from tfcli.sae.files import load_sae, sae_config, save_sae
from tfcli.sae.metrics import ce_loss_recovered, reconstruction_stats
from tfcli.sae.model import SparseAutoencoder
from tfcli.sae.points import hook_widths, resolve_hook
from tfcli.train.sae import ActivationBuffer, SaeTrainSettings, folded, input_scale, new_optimizer, tokens_of, train_step

TARGET = "tfcli's training tokens per CPU second >= SAELens's; L0, explained variance and CE loss recovered within 5% of SAELens's"


@dataclasses.dataclass
class SaeBenchRow:
    trainer: str
    cpu_seconds: float
    wall_seconds: float
    tokens: int
    l0: float
    explained_variance: float
    ce_loss_recovered: float
    dead_fraction: float
    peak_rss_mb: float

    @property
    def tokens_per_cpu_second(self) -> float:
        return self.tokens / max(self.cpu_seconds, 1e-9)


@dataclasses.dataclass
class SaeBenchResult:
    settings: dict[str, Any]
    rows: list[SaeBenchRow]

    def ratio(self, name: str) -> float:
        tfcli, theirs = self.rows
        if name == "tokens_per_cpu_second":
            return tfcli.tokens_per_cpu_second / theirs.tokens_per_cpu_second
        return getattr(tfcli, name) / getattr(theirs, name) if getattr(theirs, name) else float("nan")

    def to_json(self) -> dict[str, Any]:
        rows = [{**dataclasses.asdict(r), "tokens_per_cpu_second": r.tokens_per_cpu_second} for r in self.rows]
        ratios = {name: self.ratio(name) for name in ("tokens_per_cpu_second", "l0", "explained_variance", "ce_loss_recovered")}
        return {"settings": self.settings, "rows": rows, "ratios_tfcli_over_sae_lens": ratios, "target": TARGET}


def _score(model, sae: SparseAutoencoder, hook: str, held_out: torch.Tensor, windows: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        features = sae.encode(held_out)
        stats = reconstruction_stats(held_out, features, sae.decode(features))
    del stats["mse"]
    stats["dead_fraction"] = float(((features > 0).sum(0) == 0).double().mean())
    stats["ce_loss_recovered"] = ce_loss_recovered(model, sae, hook, windows)["ce_loss_recovered"]
    return stats


def run_sae_bench(
    run: Path,
    hook: str,
    data: Path,
    folder: Path,
    *,
    width: int,
    k: int,
    lr: float,
    batch_size: int,
    max_tokens: int,
    threads: int = 1,
    seed: int = 0,
    progress: Callable[[str], None] = lambda job: None,
) -> SaeBenchResult:
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _bench(run, hook, data, folder, width, k, lr, batch_size, max_tokens, threads, seed, progress)
    finally:
        torch.set_num_threads(threads_before)


def _bench(run, hook, data, folder, width, k, lr, batch_size, max_tokens, threads, seed, progress) -> SaeBenchResult:
    checkpoint = load_run(run, "evaluate", "cpu")
    model = checkpoint.model
    model.requires_grad_(False)
    widths = hook_widths(model)
    hook = resolve_hook(model, hook, widths)
    d_in = widths[hook]
    d_sae = width or 8 * d_in
    if not 1 <= k <= d_sae:
        raise TfcliError(f"--k must be between 1 and the width ({d_sae}), not {k}")
    steps = max(1, max_tokens // batch_size)
    s = SaeTrainSettings(
        run=str(run), hook=hook, data=str(data), width=d_sae, k=k, lr=lr, batch_size=batch_size, max_tokens=steps * batch_size, seed=seed,
        context=min(128, checkpoint.config.model.block_size - 1), buffer=max(batch_size, 65_536),
    )  # fmt: skip
    progress(f"reading {steps * batch_size:,} activations at {hook}")
    buffer = ActivationBuffer(model, hook, tokens_of(checkpoint, Path(data), "train"), s)
    batches = torch.stack([buffer.batch(step) for step in range(steps)])  # (steps, B, d_in), raw
    windows = ActivationBuffer(model, hook, tokens_of(checkpoint, Path(data), "val"), s).draw(-2, 32, extra=1)
    held_out = buffer.read(windows[:, :-1])
    save_file({"batches": batches.contiguous()}, str(folder / "activations.safetensors"))

    progress("training tfcli's SAE")
    reset_peak_rss()  # the row's peak is the training's, as SAELens's worker's is: not the model's loading nor the drawing
    scale = input_scale(buffer, d_in)
    torch.manual_seed(seed)
    sae = SparseAutoencoder(d_in, d_sae, "topk", k=k)
    optimizer = new_optimizer(sae, s)
    since_fired = torch.zeros(d_sae, dtype=torch.long)
    cpu, wall = time.process_time(), time.perf_counter()
    for step in range(steps):
        since_fired = train_step(sae, optimizer, batches[step] * scale, since_fired, s, step)[3]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    ours = SparseAutoencoder(d_in, d_sae, "topk", k=k)
    ours.load_state_dict(folded(sae, scale))
    save_sae(folder / "tfcli", ours, sae_config(ours, hook))
    tfcli_row = SaeBenchRow("tfcli", cpu, wall, steps * batch_size, **_score(model, ours.eval(), hook, held_out, windows), peak_rss_mb=peak_rss_mb())

    progress("training SAELens's SAE")
    settings = {"d_sae": d_sae, "k": k, "lr": lr, "batch_size": batch_size, "threads": threads, "seed": seed, "hook": hook}
    settings |= {"aux_coefficient": s.aux_coefficient, "dead_feature_window": max(1, s.dead_after // batch_size)}
    measured = run_worker("tfcli.bench.sae_worker", [str(folder), json.dumps(settings)])
    theirs, _ = load_sae(folder / "sae_lens")
    sae_lens_row = SaeBenchRow(
        "SAELens",
        measured["cpu_seconds"],
        measured["wall_seconds"],
        measured["tokens"],
        **_score(model, theirs, hook, held_out, windows),
        peak_rss_mb=measured["peak_rss_mb"],
    )
    settings |= {"run": str(run), "d_in": d_in, "tokens": steps * batch_size, "steps": steps}
    return SaeBenchResult(settings, [tfcli_row, sae_lens_row])
