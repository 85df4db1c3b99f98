"""SAELens's side of `tfcli bench sae`, in a process of its own: its TopK training SAE and `SAETrainer`, fed the
batches tfcli drew (FOLDER/activations.safetensors) through its data-provider iterator; only `fit()` is
timed. Saves the inference SAE (scaling and decoder norms folded in) to FOLDER/sae_lens and prints one JSON
line: the CPU and wall seconds, the tokens trained on, the peak RSS.

Usage: python -m tfcli.bench.sae_worker FOLDER SETTINGS_JSON
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from tfcli.bench.common import peak_rss_mb


def main(folder: Path, settings: dict) -> dict:
    os.environ.setdefault("TQDM_DISABLE", "1")
    from sae_lens import SAETrainer, TopKTrainingSAE, TopKTrainingSAEConfig  # noqa: PLC0415 - the test extra's, imported only in this process
    from sae_lens.config import SAETrainerConfig  # noqa: PLC0415
    from sae_lens.saes.sae import SAEMetadata  # noqa: PLC0415

    torch.set_num_threads(settings["threads"])
    batches = load_file(str(folder / "activations.safetensors"))["batches"]  # (steps, B, d_in)
    steps, batch_size, d_in = batches.shape
    torch.manual_seed(settings["seed"])
    config = TopKTrainingSAEConfig(
        d_in=d_in,
        d_sae=settings["d_sae"],
        k=settings["k"],
        aux_loss_coefficient=settings["aux_coefficient"],
        normalize_activations="expected_average_only_in",
        metadata=SAEMetadata(hook_name=settings["hook"]),
    )
    sae = TopKTrainingSAE(config)
    trainer_config = SAETrainerConfig(
        total_training_samples=steps * batch_size,
        train_batch_size_samples=batch_size,
        lr=settings["lr"],
        lr_end=settings["lr"] / 10,  # as its runner config sets it (unused: the rate is constant)
        device="cpu",
        dead_feature_window=settings["dead_feature_window"],
        n_batches_for_norm_estimate=min(steps, 100),
    )
    trainer = SAETrainer(trainer_config, sae, itertools.cycle(batches))
    cpu, wall = time.process_time(), time.perf_counter()
    trained = trainer.fit()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    trained.save_inference_model(folder / "sae_lens")
    return {"cpu_seconds": cpu, "wall_seconds": wall, "tokens": trainer.n_training_samples, "peak_rss_mb": peak_rss_mb()}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), json.loads(sys.argv[2]))))
