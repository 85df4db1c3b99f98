"""A run loaded for decoding, as `tfcli generate` and `tfcli bench generate` both load it: the device, the
thread count and this machine's accelerated paths (`tfcli.accel`) chosen the same way for both."""

from __future__ import annotations

from pathlib import Path

import torch

from tfcli.accel import accelerate, decode_step
from tfcli.checkpoint import load_checkpoint
from tfcli.runtime import resolve_device

SMALL_MODEL = 5_000_000  # parameters under which a CPU decodes on one thread


def load_for_decoding(run: Path, device: str = "auto", threads: int = 0):
    """The run's checkpoint, on `device`, with `threads` threads (0: one for a small model on the CPU,
    PyTorch's default otherwise), bf16 on a GPU that has it, and its accelerated paths attached; on the
    CPU the decoding step is built, checked and measured now, before any clock starts."""
    device = resolve_device(device)
    checkpoint = load_checkpoint(run, device)
    if threads:
        torch.set_num_threads(threads)
    elif device == "cpu" and checkpoint.model.parameter_count() < SMALL_MODEL:
        torch.set_num_threads(1)  # a small model's steps are too short to share between threads
    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        checkpoint.model.to(torch.bfloat16)  # decoding reads every weight per token: half the bytes, twice the speed
    accelerate(checkpoint.model)
    if device == "cpu":
        decode_step.describe(checkpoint.model)  # builds, checks and measures what decodes one row
    return checkpoint
