"""Each bench worker's peak RSS is its own (tfcli.bench.common.peak_rss_mb), not the peak of the process that
started it: a job that allocates more shows more, and one that allocates nothing shows little."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tfcli.bench.common import peak_rss_mb

PARENT_MB = 300
WORKER = "import sys; from tfcli.bench.common import peak_rss_mb; held = bytearray(int(sys.argv[1]) << 20); print(peak_rss_mb())"


def _worker_peak(allocate_mb: int) -> float:
    done = subprocess.run([sys.executable, "-c", WORKER, str(allocate_mb)], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def test_a_workers_peak_rss_is_its_own_not_its_parents():
    parent = bytearray(PARENT_MB << 20)  # zero-filled pages are resident once written; write one byte a page
    parent[::4096] = b"\x01" * len(range(0, len(parent), 4096))
    assert peak_rss_mb() >= PARENT_MB
    idle, busy = _worker_peak(0), _worker_peak(200)
    assert idle < PARENT_MB / 2  # ru_maxrss would say at least the parent's
    assert busy - idle > 150
    del parent


RESET = (
    "import sys; from tfcli.bench.common import peak_rss_mb, reset_peak_rss\n"
    "held = bytearray(200 << 20); del held\n"
    "reset = sys.argv[1] == 'reset' and reset_peak_rss()\n"
    "small = bytearray(20 << 20)\n"
    "print(reset, peak_rss_mb())"
)


def test_a_job_done_after_a_reset_shows_its_own_peak_not_the_one_before():
    """bench sae trains tfcli's SAE in the bench's own process: after the reset, the 200 MB freed before it no
    longer counts, the 20 MB the job holds does."""
    reset_said, after_reset = subprocess.run([sys.executable, "-c", RESET, "reset"], capture_output=True, text=True, check=True).stdout.split()
    _, without = subprocess.run([sys.executable, "-c", RESET, "keep"], capture_output=True, text=True, check=True).stdout.split()
    if reset_said != "True":
        pytest.skip("this kernel does not allow resetting VmHWM (/proc/self/clear_refs)")
    assert float(without) - float(after_reset) > 150
