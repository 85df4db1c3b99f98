"""`--log-to tensorboard`: the event files hold the same scalars as metrics.jsonl, read back with tensorboard's
own reader; a resumed run's events past its checkpoint are dropped; an unknown or missing tracker is one line.
`--log-to wandb` (offline): its files in RUN/wandb/, a resumed run continues the same wandb run. `--log-to
trackio`: read back from its local store, a run of its own for each training, continued on resume."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.helpers import missing_tool
from tests.training import pretrain_args, records
from tfcli.train.tracking import TENSORBOARD_DIR, TRACKIO_NAME_FILE, WANDB_DIR, WANDB_ID_FILE, scalars


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
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    result = cli(*pretrain_args(shards, tmp_path / "b", "--max-steps", "2", "--log-to", "tensorboard,wandb"))
    assert result.code == 2 and "needs the wandb package" in result.stderr and "tfcli[wandb]" in result.stderr
    assert not (tmp_path / "b").exists()


def _read_only_folder(tmp_path):
    """A folder no file can be made in: a chmod-ed one, or for root (whom permissions do not stop) one of the
    kernel's (sysfs, procfs) where even root cannot create a file."""
    import os
    import tempfile

    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    for candidate in ("/sys/fs", "/proc/self"):
        try:
            with tempfile.TemporaryFile(dir=candidate):
                continue
        except OSError:
            return candidate
    pytest.skip("no folder here refuses root a new file")


def _needs_wandb(monkeypatch) -> None:
    if importlib.util.find_spec("wandb") is None:
        missing_tool("wandb is not installed (pip install 'tfcli[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.mark.parametrize("tracker, folder", [("tensorboard", TENSORBOARD_DIR), ("wandb", WANDB_DIR)])
@pytest.mark.parametrize("blocker", ["a file", "a read-only folder"])
def test_a_log_folder_that_cannot_be_written_is_one_line_and_the_run_is_intact(cli, shards, tmp_path, monkeypatch, blocker, tracker, folder):
    """RUN/tensorboard (RUN/wandb) a file (FileExistsError) or a folder no file can be made in (a PermissionError
    raised in tensorboard's writer thread, printed there as a second traceback; wandb quietly writing to a
    temporary folder instead): one line, exit 2, nothing trained."""
    if tracker == "wandb":
        _needs_wandb(monkeypatch)
    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "2", "--save-every", "2")).code == 0
    if blocker == "a file":
        (run / folder).write_text("not a folder")
    else:
        (run / folder).symlink_to(_read_only_folder(tmp_path), target_is_directory=True)
    state = (run / "trainer" / "state.json").read_text()
    result = cli(*pretrain_args(shards, run, "--max-steps", "4", "--save-every", "2", "--log-to", tracker, "--resume"))
    assert result.code == 2, result.stderr
    assert "Traceback" not in result.stderr and "Exception in thread" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"{run / folder}" in lines[0] and f"--log-to {tracker}" in lines[0], result.stderr
    assert (run / "trainer" / "state.json").read_text() == state and [r["step"] for r in records(run)] == [1, 2]


def test_a_write_that_fails_in_tensorboards_thread_is_one_error_not_a_thread_traceback(tmp_path, monkeypatch, capsys):
    """A disk that fills during a run: the writer thread's OSError reaches the step that logs as one TfcliError,
    and the thread prints nothing of its own."""
    import errno
    import threading

    from tensorboard.summary.writer.record_writer import RecordWriter

    from tfcli.errors import TfcliError
    from tfcli.train.tracking import TensorBoardTracker

    printed = []
    monkeypatch.setattr(threading, "excepthook", printed.append)  # what Python would print from a thread
    tracker = TensorBoardTracker(tmp_path, {}, 0)
    tracker.log({"step": 1, "loss": 2.0})

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RecordWriter, "write", full)
    with pytest.raises(TfcliError, match="No space left on device") as failed:
        for step in range(2, 50):  # the thread fails on its own time; a later call sees it
            tracker.log({"step": step, "loss": 2.0})
    assert str(tmp_path / TENSORBOARD_DIR) in str(failed.value)
    tracker.close()  # after the error: closing says nothing more
    assert printed == [] and threading.excepthook == printed.append  # the hook is put back
    captured = capsys.readouterr()
    assert "Exception in thread" not in captured.err and "Traceback" not in captured.err, captured.err


def _offline_runs(run) -> list[str]:
    """The wandb run id of each offline run folder in RUN/wandb/, oldest first (offline-run-DATE_TIME-ID[-k])."""
    folders = sorted((run / WANDB_DIR).glob("offline-run-*"), key=lambda f: f.stat().st_mtime_ns)
    return [f.name.split("-")[3] for f in folders]


def test_wandb_writes_in_the_run_and_a_resumed_run_continues_the_same_wandb_run(cli, shards, tmp_path, monkeypatch):
    """Stopped at step 3 with its checkpoint at 2 (as kill -9 leaves it), then resumed twice: one wandb run id
    throughout, kept in RUN/wandb/, and every file wandb made is inside the run."""
    _needs_wandb(monkeypatch)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    first = cli(*pretrain_args(shards, run, "--max-steps", "3", "--save-every", "2", "--log-to", "wandb"))
    assert first.code == 0, first.stderr
    run_id = (run / WANDB_DIR / WANDB_ID_FILE).read_text().strip()
    assert _offline_runs(run) == [run_id]
    for steps in ("5", "6"):
        more = cli(*pretrain_args(shards, run, "--max-steps", steps, "--save-every", "2", "--log-to", "wandb", "--resume"))
        assert more.code == 0, more.stderr
    assert _offline_runs(run) == [run_id] * 3 and (run / WANDB_DIR / WANDB_ID_FILE).read_text().strip() == run_id
    assert [r["step"] for r in records(run)] == [1, 2, 3, 4, 5, 6]
    assert not (tmp_path / "wandb").exists()  # nothing beside the run


def test_a_new_run_gets_a_new_wandb_run(cli, shards, tmp_path, monkeypatch):
    _needs_wandb(monkeypatch)
    ids = []
    for name in ("a", "b"):
        result = cli(*pretrain_args(shards, tmp_path / name, "--max-steps", "1", "--log-to", "wandb"))
        assert result.code == 0, result.stderr
        ids.append((tmp_path / name / WANDB_DIR / WANDB_ID_FILE).read_text().strip())
    assert ids[0] != ids[1] and [_offline_runs(tmp_path / n) for n in ("a", "b")] == [[ids[0]], [ids[1]]]


def test_a_kept_wandb_id_that_is_not_one_is_refused(cli, shards, tmp_path, monkeypatch):
    _needs_wandb(monkeypatch)
    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "2", "--save-every", "2", "--log-to", "wandb")).code == 0
    (run / WANDB_DIR / WANDB_ID_FILE).write_text("../../etc\n")
    result = cli(*pretrain_args(shards, run, "--max-steps", "3", "--log-to", "wandb", "--resume"))
    assert result.code == 2 and "does not hold a wandb run id" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert [r["step"] for r in records(run)] == [1, 2]


def test_a_wandb_run_that_cannot_start_is_one_line_and_leaves_the_folder_usable(cli, shards, tmp_path, monkeypatch):
    """wandb refusing to start (here a WANDB_MODE it does not know): one line, exit 2, and no wandb/ left in the
    new run's folder, so the same command with the setting fixed runs."""
    _needs_wandb(monkeypatch)
    run = tmp_path / "run"
    args = pretrain_args(shards, run, "--max-steps", "1", "--log-to", "wandb")
    monkeypatch.setenv("WANDB_MODE", "nonsense")
    result = cli(*args)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.code == 2 and len(lines) == 1 and "--log-to wandb could not start its run" in lines[0], result.stderr
    assert "Traceback" not in result.stderr and not (run / WANDB_DIR).exists()
    monkeypatch.setenv("WANDB_MODE", "offline")
    again = cli(*args)
    assert again.code == 0, again.stderr
    assert [r["step"] for r in records(run)] == [1]


TRAIN_THEN_READ_TRACKIO = """
import json, sys
from tfcli.cli.app import main
for args in json.loads(sys.argv[1]):
    try:
        main(args)
    except SystemExit as exc:
        assert not exc.code, (args, exc.code)
from trackio.sqlite_storage import SQLiteStorage
runs = SQLiteStorage.get_runs("tests")
print(json.dumps({name: SQLiteStorage.get_logs("tests", name) for name in runs}, default=str))
"""


def _needs_trackio() -> None:
    if importlib.util.find_spec("trackio") is None:
        missing_tool("trackio is not installed (pip install 'tfcli[trackio]')")


def test_trackio_holds_what_metrics_jsonl_holds_and_a_resumed_run_continues_its_trackio_run(shards, tmp_path):
    """Two runs both called `model` get a trackio run each; the first, resumed, logs on in its own: read back with
    trackio's own storage, each holds metrics.jsonl's scalars at their steps. In a process of its own, whose
    trackio keeps its store in the test's folder (trackio reads TRACKIO_DIR once, at import)."""
    _needs_trackio()
    first, second = tmp_path / "a" / "model", tmp_path / "b" / "model"
    trainings = [
        [str(a) for a in pretrain_args(shards, run, "--max-steps", steps, "--save-every", "2", "--log-to", "trackio", *more)]
        for run, steps, more in ((first, "2", ()), (second, "1", ()), (first, "4", ("--resume",)))
    ]
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "TRACKIO_PROJECT": "tests"}
    done = subprocess.run([sys.executable, "-c", TRAIN_THEN_READ_TRACKIO, json.dumps(trainings)], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    logs = json.loads(done.stdout.splitlines()[-1])
    names = {run: (run / TRACKIO_NAME_FILE).read_text().strip() for run in (first, second)}
    assert names[first] != names[second] and all(name.startswith("model-") for name in names.values())
    assert set(logs) == set(names.values())
    for run, name in names.items():
        kept: dict[str, dict[int, float]] = {}
        for row in logs[name]:
            for key, value in row.items():
                if key not in ("step", "timestamp") and isinstance(value, float):
                    kept.setdefault(key, {})[row["step"]] = value
        written = jsonl_scalars(run)
        assert {"loss", "val_loss"} <= set(kept) and kept["loss"].keys() == written["loss"].keys(), (name, kept.keys())
        for key in ("loss", "lr", "val_loss"):
            assert kept[key] == pytest.approx(written[key], rel=1e-6), (name, key)
    assert sorted(jsonl_scalars(first)["loss"]) == [1, 2, 3, 4]


def test_a_trackio_store_that_cannot_be_written_is_one_line_before_any_step(cli, shards, tmp_path, monkeypatch):
    _needs_trackio()
    import trackio.utils

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(trackio.utils, "TRACKIO_DIR", blocker)  # the store the tracker checks before trackio starts
    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--max-steps", "2", "--log-to", "trackio"))
    assert result.code == 2 and "--log-to trackio writes its files in" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (run / "metrics.jsonl").exists()
