"""keep_freed_memory: once a training-like pattern of large blocks has run a few times, freed blocks are
reused, so writing the next ones faults no fresh pages (by default every block > 32 MB is mapped anew)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import torch
from tfcli.runtime import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else False
def step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = torch.ones(10_000_000); b = torch.ones(12_000_000); del a  # 40 and 48 MB
    c = torch.ones(8_000_000); del b, c
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(took, min(step() for _ in range(8)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_blocks_are_reused_instead_of_mapped_again():
    # both probes at once (each its own process): their page faults are their own
    probes = {mode: subprocess.Popen([sys.executable, "-c", PROBE, mode], stdout=subprocess.PIPE, text=True) for mode in ("keep", "default")}
    results = {}
    for mode, process in probes.items():
        out, _ = process.communicate()
        assert process.returncode == 0
        results[mode] = (out.split()[0], int(out.split()[1]))
    took, kept_faults = results["keep"]
    if took != "True":
        pytest.skip("not glibc")
    _, default_faults = results["default"]
    assert default_faults > 10_000  # fresh 4 KB pages for every block
    assert kept_faults < 100
