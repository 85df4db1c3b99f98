"""One clock for every training loop a bench compares, so each side gets the same warm-up and is timed the
same way: the loop is an iterator that yields once when it is set up and once after each finished step; the
clock runs the warm-up steps untimed, then times the next steps by wall clock and by the process's CPU time."""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Iterator

import torch


@dataclasses.dataclass
class StepTimes:
    seconds_per_step: float  # wall clock, the device's queue drained at both ends
    cpu_seconds_per_step: float  # the process's CPU time, all its threads
    warmup_seconds: float  # wall clock of the warm-up steps (compiling, where the loop compiles)


def time_steps(loop: Iterator[object], device: torch.device, warmup: int, steps: int) -> StepTimes:
    """Time `steps` steps of `loop` after `warmup` untimed ones. Example: a loop whose first step takes 1 s and
    every later one 10 ms gives seconds_per_step 0.01 for any warm-up of at least one step."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    _advance(loop, 1, "before it was set up")
    begun = time.perf_counter()
    _advance(loop, warmup, "in its warm-up")
    _sync(device)
    warmed = time.perf_counter()
    gc.collect()  # a full collection (a tenth of a second with torch loaded) never lands in a timed step
    wall, cpu = time.perf_counter(), time.process_time()
    _advance(loop, steps, "in its timed steps")
    _sync(device)
    cpu_seconds, seconds = time.process_time() - cpu, time.perf_counter() - wall
    return StepTimes(seconds / steps, cpu_seconds / steps, warmed - begun)


def _advance(loop: Iterator[object], count: int, when: str) -> None:
    for _ in range(count):
        if next(loop, StopIteration) is StopIteration:
            raise RuntimeError(f"the training loop ended early, {when}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
