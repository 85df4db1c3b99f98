"""Tokens per second and MFU as a run logs them: over its steps' own time, against a peak timed again on an idle
machine when it was timed on a busy one."""

from __future__ import annotations

import json
import time

import pytest
import torch

from tests.conftest import forget_accel
from tests.training import pretrain_args, records
from tfcli.accel import choices
from tfcli.train import flops
from tfcli.train.setup import MetricsWindow, Throughput


@pytest.fixture
def fresh_choices(monkeypatch, tmp_path):
    """An empty decisions file, this test's own."""
    monkeypatch.setenv("TFCLI_CACHE_DIR", str(tmp_path / "cache"))
    forget_accel()
    yield
    forget_accel()


def test_mfu_is_the_rate_over_the_timed_peak_whatever_rate_came_before():
    """No ratchet: a fast window does not lower the MFU of the windows after it."""
    speed = Throughput(tokens_per_step=1000, flops_per_step=1e9, peak=1e12)
    assert speed.utilisation(500_000) == pytest.approx(0.5)
    assert speed.utilisation(2_000_000) == pytest.approx(2.0)  # a peak timed low reads high; it is not raised
    assert speed.utilisation(100_000) == pytest.approx(0.1)
    assert Throughput(1000, 1e9, peak=0.0).utilisation(500_000) == 0.0  # a rank that does not log has no peak


def test_a_windows_rate_counts_its_steps_time_and_the_window_before_where_asked():
    before = MetricsWindow(torch.zeros(()), 0, tokens=8192, seconds=1.0)
    now = MetricsWindow(torch.zeros(()), 0, tokens=4096, seconds=1.0)
    assert now.rate() == 4096.0 and now.rate(since=before) == pytest.approx(12288 / 2)
    assert MetricsWindow.opened(torch.device("cpu")).rate() == 0.0


def test_the_logged_rate_leaves_out_the_time_spent_evaluating(cli, shards, tmp_path, monkeypatch):
    """An evaluation that takes 2 s (faked) between two logged steps: the rate is the steps', not the steps' and the
    evaluation's (two tiny steps take far less than a second)."""
    from tfcli.train import trainer

    def slow_evaluation(*args, **kwargs):
        time.sleep(2.0)
        return {"val_loss": 1.0}

    monkeypatch.setattr(trainer, "evaluate_model", slow_evaluation)
    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "4", "--eval-every", "2", "--log-every", "2")).code == 0
    first, second = records(run)
    tokens_per_window = second["tokens"] - first["tokens"]
    assert second["tokens_per_sec"] > tokens_per_window / 1.0  # the evaluation at step 2 is not in step 4's window
    assert first["tokens_per_sec"] > tokens_per_window / 1.0


def _recorded_peak(load: choices.Load | None, seconds: float = 10.0) -> str:
    """A peak decision in the machine's file as a busy (or old) timing left it: 10 s a product, far too slow."""
    key = flops._peak_key(torch.device("cpu"), torch.float32)
    choices.choices().record(key, choices.Decision("torch", {"torch": seconds}, load=load))
    forget_accel()  # the next run reads the file
    return key


@pytest.mark.parametrize("load", [choices.Load(waited=0.6), None], ids=["busy", "not-recorded"])
def test_a_peak_timed_busy_is_timed_again_on_an_idle_machine(fresh_choices, monkeypatch, load):
    key = _recorded_peak(load)
    monkeypatch.setattr(flops, "machine_is_idle", lambda: True)
    peak = flops.peak_matmul_flops(torch.device("cpu"), torch.float32)
    assert peak > 2 * 1024**3 / 10.0 * 100  # timed again: a 1024-cube product takes well under 0.1 s
    saved = json.loads(choices.choices_path().read_text())["decisions"][key]
    assert saved["load"] is not None and saved["seconds"]["torch"] < 10.0


def test_a_peak_timed_busy_is_kept_while_the_machine_is_busy(fresh_choices, monkeypatch):
    key = _recorded_peak(choices.Load(waited=0.6))
    monkeypatch.setattr(flops, "machine_is_idle", lambda: False)
    monkeypatch.setattr(choices, "measure", lambda *args, **kwargs: pytest.fail("timed again on a busy machine"))
    assert flops.peak_matmul_flops(torch.device("cpu"), torch.float32) == pytest.approx(2 * 1024**3 / 10.0)
    assert choices.choices().decisions[key].measured_busy()  # kept, and `info --device` marks it
