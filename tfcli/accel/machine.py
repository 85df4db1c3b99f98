"""What this machine is (processor, torch build, threads) and where tfcli keeps what it measured and built here."""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path


def cache_dir() -> Path:
    """`$TFCLI_CACHE_DIR`, else `$XDG_CACHE_HOME/tfcli`, else `~/.cache/tfcli`."""
    if os.environ.get("TFCLI_CACHE_DIR"):
        return Path(os.environ["TFCLI_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tfcli"


def _cpuinfo() -> dict[str, str]:
    """The first 'model name', 'flags' (x86) or 'Features' / 'CPU part' (Arm) lines of /proc/cpuinfo."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "flags", "Features", "CPU part") and key not in found:
            found[key] = value.strip()
    return found


def processor_name() -> str:
    """The processor's model name where the system says it, else what Python knows."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown processor"


def vector_extensions() -> list[str]:
    """The SIMD extensions that decide which kernels are fast here (x86 flags or Arm features)."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    interesting = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "amx_bf16", "asimd", "sve", "sve2", "bf16")
    return [flag for flag in interesting if flag in flags]


def processor_key() -> str:
    """What -march=native compiles for and what a timing depends on: a kernel built or a choice measured on
    one processor is not for another."""
    info = _cpuinfo()
    described = "\n".join(f"{key}: {value}" for key, value in sorted(info.items()))
    return "\n".join([platform.machine(), platform.processor(), described])


def machine_digest(*extra: str) -> str:
    """A short digest of the processor and `extra` (a torch version, a compiler), for file names."""
    return hashlib.sha256("\0".join([processor_key(), *extra]).encode()).hexdigest()[:16]
