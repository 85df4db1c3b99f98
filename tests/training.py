"""What the training tests share: a tiny model's settings, the command line of a pretraining run, its
records and weights, and the processes that run one (a plain one, torchrun ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

TINY_MODEL = ["--set", "d_model=32", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "d_ff=64"]


def pretrain_args(shards: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "pretrain",
        "--data",
        shards,
        "-o",
        out,
        "--block-size",
        "32",
        "--batch-size",
        "4",
        "--lr",
        "3e-3",
        "--log-every",
        "1",
        *TINY_MODEL,
        *extra,
    ]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "model.safetensors"))


def spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tfcli", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


def wait_for_step(run: Path, process: subprocess.Popen, step: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        except (FileNotFoundError, json.JSONDecodeError):
            done = []
        if done and done[-1] >= step:
            return done[-1]
        assert process.poll() is None, process.communicate()
        time.sleep(0.005)
    raise AssertionError("the run did not get there in time")


def torchrun(args: list, nproc: int = 2) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc), "-m", "tfcli", *map(str, args)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    )


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
