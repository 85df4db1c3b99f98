"""What every benchmark shares: each measurement runs in a fresh subprocess with its own peak RSS."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

from tfcli.errors import TfcliError


def peak_rss_mb() -> float:
    """This process's own peak resident memory in MB: Linux's VmHWM. Not ru_maxrss, which keeps the forking
    parent's peak across exec, so every worker of a big parent would report the parent's figure."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:  # no /proc (macOS)
        status = ""
    high_water_kib = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")]
    if high_water_kib:
        return high_water_kib[0] / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB on Linux


def reset_peak_rss() -> bool:
    """Start this process's peak RSS afresh from what it holds now, so that `peak_rss_mb()` after a job done in
    this process is that job's (Linux: "5" written to /proc/self/clear_refs resets VmHWM). False where the
    kernel does not allow it: the peak is then the process's so far."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def run_worker(module: str, args: list[str]) -> dict:
    """Run `python -m MODULE ARGS...`, whose last stdout line is a JSON object, and return it."""
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        if lines and lines[-1].startswith("tfcli.errors.TfcliError: "):  # a user's mistake the worker found: one line
            raise TfcliError(lines[-1].removeprefix("tfcli.errors.TfcliError: "))
        raise RuntimeError(f"bench job {module} {' '.join(args[:1])} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def keep_fastest(results: dict, job: str, measured) -> None:
    """Keep the fastest of a job's interleaved rounds (by `.seconds`), and the highest peak RSS of any round."""
    best = results.get(job)
    if best is None or measured.seconds < best.seconds:
        measured.peak_rss_mb = max(measured.peak_rss_mb, best.peak_rss_mb if best else 0.0)
        results[job] = measured
    else:
        best.peak_rss_mb = max(best.peak_rss_mb, measured.peak_rss_mb)
