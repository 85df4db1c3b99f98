"""Process-wide settings that make long CPU jobs faster."""

from __future__ import annotations

import ctypes
import os
import sys

import torch

from tfcli.errors import TfcliError

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Serve every allocation from glibc's heap and keep what is freed there.

    By default glibc maps a fresh region for every block over 32 MB and hands it back to the system when
    it is freed, so the next block of the same size starts as untouched pages, each paying a page fault
    and a zero-fill on first write. A training step frees and re-allocates such blocks every step (the
    logits, the weight gradients of large matrices, the optimizer's temporaries): on a gpt2-small step on
    CPU that is 6-10% of the time. Returns whether the setting took (glibc on Linux only; elsewhere the
    defaults stay)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def physical_memory() -> int | None:
    """This machine's memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def resolve_device(name: str) -> str:
    """A device name checked against this machine: auto (a CUDA GPU, else Apple's MPS, else the CPU), cpu,
    cuda, cuda:N or mps. Anything else, or a device that is not there, is a TfcliError."""
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    if name == "cpu":
        return name
    kind, colon, index = name.partition(":")
    if kind == "cuda" and (not colon or index.isdigit()):
        if not torch.cuda.is_available():
            raise TfcliError(f"--device {name} was asked for but no CUDA GPU is available", hint="use --device cpu or auto")
        if colon and int(index) >= torch.cuda.device_count():
            raise TfcliError(
                f"--device {name}: this machine's CUDA GPUs are numbered 0 to {torch.cuda.device_count() - 1}", hint="use --device cuda for the first"
            )
        return name
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise TfcliError("--device mps was asked for but MPS is not available", hint="use --device cpu or auto")
        return name
    raise TfcliError(f"unknown device {name!r}", hint="use auto, cpu, cuda, cuda:N or mps")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(threads: int, option: str = "--threads") -> None:
    """0 (automatic) up to this machine's usable cores: more threads than cores only wait on each other, and
    tens of thousands end the process inside the OpenMP runtime."""
    cores = usable_cores()
    if not 0 <= threads <= cores:
        raise TfcliError(
            f"{option} must be between 0 (automatic) and this machine's {cores} usable cores, not {threads:,}", hint=f"use {option} {cores} or fewer"
        )
