"""bench train's two loops on one clock (tfcli.bench.step_clock): the same untimed warm-up, then wall and CPU
time over the same timed steps. The clock here is a fake one that a step moves on, so a slow first step (first
allocations, lazy set-up, autotuning) is seen exactly, whatever the machine's load."""

from __future__ import annotations

import types

import pytest
import torch

from tests.helpers import require
from tfcli.bench import step_clock
from tfcli.bench import train as bench

FIRST_STEP, LATER_STEP = 1.0, 0.01


class FakeClock:
    """Wall and CPU seconds that move only when a step says so: the first step slow, every later one quick."""

    def __init__(self) -> None:
        self.seconds, self.steps = 0.0, 0

    def step(self) -> None:
        self.seconds += FIRST_STEP if self.steps == 0 else LATER_STEP
        self.steps += 1

    def as_time_module(self):
        return types.SimpleNamespace(perf_counter=lambda: self.seconds, process_time=lambda: self.seconds)


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(step_clock, "time", fake.as_time_module())
    return fake


def _fake_loop(clock: FakeClock, steps: int):
    yield  # set up
    for _ in range(steps):
        clock.step()
        yield


@pytest.mark.parametrize("timed", [1, 3, 10])
def test_the_warm_up_is_never_counted_and_both_clocks_read_the_same_steps(clock, timed):
    times = step_clock.time_steps(_fake_loop(clock, 3 + timed), torch.device("cpu"), warmup=3, steps=timed)
    assert times.seconds_per_step == pytest.approx(LATER_STEP)
    assert times.cpu_seconds_per_step == pytest.approx(LATER_STEP)
    assert times.warmup_seconds == pytest.approx(FIRST_STEP + 2 * LATER_STEP)


def test_a_loop_that_ends_before_its_timed_steps_is_an_error_not_a_figure(clock):
    with pytest.raises(RuntimeError, match="ended early, in its timed steps"):
        step_clock.time_steps(_fake_loop(clock, 4), torch.device("cpu"), warmup=3, steps=2)


@pytest.mark.parametrize("timed", [1, 3])
def test_tfclis_loop_and_transformers_loop_are_timed_alike(clock, monkeypatch, timed):
    """The real loops at tiny, batch 1, each optimizer update moving the fake clock (the first one slow, as the
    first AdamW step that makes its state is): both report the steady step, by wall and by CPU time."""
    require("transformers")
    import tfcli.train.setup

    def clocked(make_optimizer):
        def made(*args, **kwargs):
            optimizer = make_optimizer(*args, **kwargs)
            real_step = optimizer.step

            def step(*step_args, **step_kwargs):
                clock.step()
                return real_step(*step_args, **step_kwargs)

            optimizer.step = step
            return optimizer

        return made

    monkeypatch.setattr(tfcli.train.setup, "make_optimizer", clocked(tfcli.train.setup.make_optimizer))
    monkeypatch.setattr(bench, "make_optimizer", clocked(bench.make_optimizer))
    monkeypatch.setattr(tfcli.train.setup, "peak_matmul_flops", lambda *args, **kwargs: 1e12)  # the loop's own MFU, not this test's
    threads = torch.get_num_threads()
    try:
        rows = []
        for implementation in ("tfcli", "transformers"):
            clock.steps = 0
            rows.append(bench._measure(implementation, "tiny", bench.preset("tiny"), 1, timed, "cpu", "fp32", with_peak=False))
    finally:
        torch.set_num_threads(threads)
    for row in rows:
        assert (row.seconds_per_step, row.cpu_seconds_per_step) == (pytest.approx(LATER_STEP), pytest.approx(LATER_STEP)), row.implementation
        assert row.tokens_per_sec == pytest.approx(bench.preset("tiny").block_size / LATER_STEP)
