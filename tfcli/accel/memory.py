"""A decoding model's weights moved into transparent huge pages (Linux), so that streaming them once a token
takes fewer TLB misses: gpt2-small's fp32 step measured 7-8% faster on one thread (14.9 -> 13.7 ms a token, AMD
EPYC, 2026-11-28; docs/benchmarks.md).

A run's weights come from the safetensors file as a file mapping, which the kernel backs with 4 KB pages only.
`use_huge_pages` copies every tensor of the model into memory of its own, each large one advised as huge pages
(madvise MADV_HUGEPAGE) before it is written, so that nothing refers to the file mapping any more and it is
unmapped: the model then takes the same memory as before, and for a moment while it is copied, up to twice that.
It is done only where that moment fits (twice the weights under MemAvailable), where the kernel lends huge pages
on request (transparent_hugepage not "never"), and for fp32 models: a quantized run's blocks stay where they were
read, so its memory stays within 1.3x its file (tests/test_quant_commands.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path

import torch
from torch import nn

HUGE_PAGE = 1 << 21
LARGE = 4 << 20  # a tensor of at least this many bytes is advised as huge pages
MADV_HUGEPAGE = 14
SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_lent() -> bool:
    """The kernel gives transparent huge pages to memory that asks for them (Linux, not "[never]")."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return "[never]" not in SETTING.read_text()
    except OSError:
        return False


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (0 where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _advise(tensor: torch.Tensor) -> bool:
    """Ask for huge pages over the whole 2 MB pages inside the tensor's memory (not yet written)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    start = (tensor.data_ptr() + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    end = (tensor.data_ptr() + tensor.nbytes) & ~(HUGE_PAGE - 1)
    return end > start and libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE) == 0


def use_huge_pages(model: nn.Module) -> bool:
    """Copy an fp32 CPU model's parameters and buffers into memory of their own, the large ones in huge pages
    (see the module's docstring); True where it was done. Tied tensors stay one tensor."""
    tensors = list(dict.fromkeys([*model.parameters(), *model.buffers()]))  # each once, in order
    large = [t for t in tensors if t.nbytes >= LARGE]
    if not large or not huge_pages_lent() or any(t.device.type != "cpu" for t in tensors):
        return False
    if any(t.dtype != torch.float32 for t in large):  # a quantized run's blocks: left as they are
        return False
    if 2 * sum(t.nbytes for t in tensors) > available_bytes():
        return False
    with torch.no_grad():
        for tensor in tensors:
            if tensor.nbytes >= LARGE and tensor.is_contiguous():
                copy = torch.empty_like(tensor, memory_format=torch.contiguous_format)
                _advise(copy)  # before the first write: the pages are given out as it is written
                tensor.data = copy.copy_(tensor)
            else:
                tensor.data = tensor.data.clone()
    return True
