"""What every benchmark shares: each measurement runs in a fresh subprocess with its own peak RSS."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

from tfcli.errors import TfcliError


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


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
