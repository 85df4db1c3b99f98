"""Model FLOPs utilisation: the FLOPs a training step needs, over the matmul rate this device reaches, and
over the dense bf16 peak of the card's datasheet where the card is one tfcli knows."""

from __future__ import annotations

import dataclasses
import os
import re
import time

import torch

from tfcli.accel import choices, products
from tfcli.model.config import ModelConfig


def training_flops_per_token(config: ModelConfig, tokens_per_row: int) -> float:
    """6 FLOPs per parameter per token (forward and backward) for the matmul weights, plus attention's
    12 * layers * d_model * context (PaLM's estimate); embeddings lookups cost nothing."""
    counts = config.parameter_counts()
    lm_head = config.vocab_size * config.d_model  # a matmul even when tied to the embedding matrix
    heads = counts["heads"] - (0 if config.tie_embeddings else lm_head)
    dense = counts["attention"] + counts["mlp"] + heads + lm_head
    layers = (config.n_layers if config.has_encoder else 0) + (config.decoder_layers if config.has_decoder else 0)
    return 6 * dense + 12 * layers * config.d_model * tokens_per_row


@dataclasses.dataclass(frozen=True)
class CardPeak:
    card: str  # the datasheet's name for the card
    bf16_flops: float  # dense bf16 tensor-core FLOP/s (the datasheets' "with sparsity" figures are twice these)


# (what torch.cuda.get_device_name() says, as a lower-case fragment; the card). The first that matches wins,
# so a longer name stands before a shorter one it contains ("h100 nvl" before "h100").
DATASHEET_PEAKS: tuple[tuple[str, CardPeak], ...] = (
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): BF16 tensor core 1,979 / 1,513 / 1,671 TFLOPS
    # with sparsity for SXM / PCIe / NVL; half of each dense. The SXM card names itself "NVIDIA H100 80GB HBM3".
    ("h100 nvl", CardPeak("H100 NVL", 835e12)),
    ("h100 pcie", CardPeak("H100 PCIe", 756e12)),
    ("h100", CardPeak("H100 SXM", 989.4e12)),
    # NVIDIA GH200 Grace Hopper datasheet: the H100 SXM's tensor cores, 989 TFLOPS dense bf16
    ("gh200", CardPeak("GH200", 989.4e12)),
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): BF16 1,979 TFLOPS with sparsity (SXM); NVL 1,671
    ("h200 nvl", CardPeak("H200 NVL", 835e12)),
    ("h200", CardPeak("H200 SXM", 989.4e12)),
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): BF16 tensor core 312 TFLOPS dense (SXM and PCIe)
    ("a100", CardPeak("A100", 312e12)),
    # NVIDIA L40S datasheet: BF16 tensor core 362.05 TFLOPS dense (733 with sparsity)
    ("l40s", CardPeak("L40S", 362.05e12)),
    # NVIDIA L4 datasheet: BF16 tensor core 242 TFLOPS with sparsity, 121 dense
    ("l4", CardPeak("L4", 121e12)),
)


def datasheet_peak(device_name: str) -> CardPeak | None:
    """The card's dense bf16 peak from its datasheet, by the name CUDA gives it; None for a card not listed.
    Example: datasheet_peak("NVIDIA H100 80GB HBM3") -> CardPeak("H100 SXM", 989.4e12); datasheet_peak("NVIDIA L40") -> None"""
    name = device_name.lower()
    for fragment, peak in DATASHEET_PEAKS:
        if re.search(rf"(?<![a-z0-9]){re.escape(fragment)}(?![a-z0-9])", name):
            return peak
    return None


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, size: int | None = None, seconds: float = 0.3) -> float:
    """The FLOP/s of a square matmul on `device` in `dtype`, through the fastest library tfcli can use there
    (PyTorch's own, or oneDNN for fp32 on the CPU where it is available): the peak MFU is measured against."""
    size = size or (4096 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    backends = [products.TORCH]
    if products.plain_cpu_fp32(a, b) and products.available(products.ONEDNN):
        backends.append(products.ONEDNN)
    return max(_rate(lambda backend=backend: products.product(backend, a, b.t()), device, 2 * size**3, seconds) for backend in backends)


IDLE_PER_CORE = 0.5  # a machine whose 1-minute load average is under half a process per core is idle enough to time the peak


def peak_matmul_flops(device: torch.device, dtype: torch.dtype) -> float:
    """The matmul rate a training run's MFU is measured against: timed on the first run on this machine
    (for this device, dtype and thread count) and remembered beside tfcli.accel's decisions, so later runs
    start without probing. The best single product of each library counts, as a peak should. A peak timed
    while the machine was busy (or by a tfcli that did not record how busy) reads low: the first run that
    finds the machine idle times it again."""
    size = _peak_size(device)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype).t()
    candidates = {products.TORCH: lambda: products.product(products.TORCH, a, b)}
    if products.plain_cpu_fp32(a, b) and products.available(products.ONEDNN):
        candidates[products.ONEDNN] = lambda: products.product(products.ONEDNN, a, b)
    key, store = _peak_key(device, dtype), choices.choices()
    known = store.decisions.get(key)
    if known is not None and (known.load is None or known.measured_busy()) and machine_is_idle():
        store.record(key, choices.measure(candidates, products.close, sync=lambda: _sync(device)))
    else:
        store.decide(key, candidates, products.close, sync=lambda: _sync(device))
    return 2 * size**3 / min(store.decisions[key].seconds.values())


def _peak_size(device: torch.device) -> int:
    return 4096 if device.type == "cuda" else 1024


def _peak_key(device: torch.device, dtype: torch.dtype) -> str:
    """The peak's decision name. Example: "peak matmul cpu float32 t2 1024x1024x1024" """
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    size = _peak_size(device)
    return f"peak matmul {where} {str(dtype).removeprefix('torch.')} t{torch.get_num_threads()} {size}x{size}x{size}"


def machine_is_idle() -> bool:
    """Whether the 1-minute load average leaves the cores to this process (False where the system does not say)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1) < IDLE_PER_CORE
    except (OSError, AttributeError):
        return False


def _rate(multiply, device: torch.device, flops: int, seconds: float) -> float:
    for _ in range(2):
        multiply()
    _sync(device)
    runs, start = 0, time.perf_counter()
    while True:
        multiply()
        runs += 1
        if runs % 4 == 0:
            _sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return flops * runs / elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
