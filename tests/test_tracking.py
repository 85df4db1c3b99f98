"""`--log-to tensorboard`: the event files hold the same scalars as metrics.jsonl, read back with tensorboard's
own reader; a resumed run's events past its checkpoint are dropped; an unknown or missing tracker is one line."""

from __future__ import annotations

import pytest

from tests.training import pretrain_args, records
from tfcli.train.tracking import TENSORBOARD_DIR, scalars


def tensorboard_scalars(run) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / TENSORBOARD_DIR), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def jsonl_scalars(run) -> dict[str, dict[int, float]]:
    found: dict[str, dict[int, float]] = {}
    for record in records(run):
        for key, value in scalars(record).items():
            found.setdefault(key, {})[record["step"]] = value
    return found


def assert_same(run):
    logged, written = tensorboard_scalars(run), jsonl_scalars(run)
    assert set(logged) == set(written) and {"loss", "lr", "val_loss", "tokens_per_sec"} <= set(logged)
    for tag, series in written.items():
        assert logged[tag].keys() == series.keys(), tag
        for step, value in series.items():
            assert logged[tag][step] == pytest.approx(value, rel=1e-6), (tag, step)  # event files hold float32


def test_tensorboard_holds_what_metrics_jsonl_holds(cli, shards, tmp_path):
    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--max-steps", "6", "--eval-every", "3", "--log-to", "tensorboard"))
    assert result.code == 0, result.stderr
    assert len(records(run)) == 6
    assert_same(run)


def test_a_resumed_run_drops_the_events_past_its_checkpoint(cli, shards, tmp_path):
    run = tmp_path / "run"
    first = pretrain_args(shards, run, "--max-steps", "4", "--save-every", "2", "--eval-every", "2", "--log-to", "tensorboard")
    assert cli(*first).code == 0
    more = pretrain_args(shards, run, "--max-steps", "6", "--save-every", "2", "--eval-every", "2", "--log-to", "tensorboard", "--resume")
    result = cli(*more)
    assert result.code == 0, result.stderr
    assert [r["step"] for r in records(run)] == [1, 2, 3, 4, 5, 6]
    assert_same(run)


def test_trackers_are_checked_before_any_work(cli, shards, tmp_path, monkeypatch):
    result = cli(*pretrain_args(shards, tmp_path / "a", "--max-steps", "2", "--log-to", "mlflow"))
    assert result.code == 2 and "unknown tracker 'mlflow'" in result.stderr and not (tmp_path / "a").exists()
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    result = cli(*pretrain_args(shards, tmp_path / "b", "--max-steps", "2", "--log-to", "tensorboard,wandb"))
    assert result.code == 2 and "needs the wandb package" in result.stderr and "tfcli[wandb]" in result.stderr
    assert not (tmp_path / "b").exists()
