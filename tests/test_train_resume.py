"""Training that stops and starts again: a kill, a signal, a closed pipe or a failing save, then --resume,
which gives what one uninterrupted run gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import TINY_TEXT, snapshot
from tests.training import pretrain_args, records, spawn, wait_for_step, weights


@pytest.mark.parametrize("recipe", [[], ["--optimizer", "muon", "--schedule", "wsd"]], ids=["adamw", "muon-wsd"])
def test_a_run_killed_between_checkpoints_resumes_bit_for_bit(cli, shards, tmp_path, recipe):
    """Muon's momentum is saved beside AdamW's moments (muon/NAME/KEY), so it resumes as exactly."""
    args = ["--max-steps", "60", "--save-every", "10", "--eval-every", "10", "--batch-size", "16", *recipe]
    whole = tmp_path / "whole"
    assert cli(*pretrain_args(shards, whole, *args)).code == 0
    broken = tmp_path / "broken"
    process = spawn(pretrain_args(shards, broken, *args))
    reached = wait_for_step(broken, process, 23)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    saved = json.loads((broken / "trainer" / "state.json").read_text())["step"]
    assert saved % 10 == 0 and saved < 60 and reached < 60
    result = cli(*pretrain_args(shards, broken, *args, "--resume"))
    assert result.code == 0, result.stderr
    a, b = weights(whole), weights(broken)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    steps = [r["step"] for r in records(broken)]
    assert steps == list(range(1, 61))  # one record per step: those past the checkpoint were dropped, not doubled
    assert [r["loss"] for r in records(broken)] == pytest.approx([r["loss"] for r in records(whole)], abs=1e-6)


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT])
def test_a_resumed_run_writes_the_records_of_an_uninterrupted_one(cli, shards, tmp_path, stop):
    # records every 7 steps and at evaluations, checkpoints every 11: a checkpoint (or a Ctrl-C) falls mid-window
    args = ["--max-steps", "30", "--log-every", "7", "--eval-every", "4", "--save-every", "11", "--batch-size", "16"]
    whole = tmp_path / "whole"
    assert cli(*pretrain_args(shards, whole, *args)).code == 0
    broken = tmp_path / "broken"
    process = spawn(pretrain_args(shards, broken, *args))
    wait_for_step(broken, process, 14 if stop == signal.SIGKILL else 5)
    process.send_signal(stop)
    process.communicate(timeout=60)
    assert json.loads((broken / "trainer" / "state.json").read_text())["step"] < 30
    result = cli(*pretrain_args(shards, broken, *args, "--resume"))
    assert result.code == 0, result.stderr
    drop = ("tokens_per_sec", "mfu", "elapsed")
    assert [{k: v for k, v in r.items() if k not in drop} for r in records(broken)] == [{k: v for k, v in r.items() if k not in drop} for r in records(whole)]


def test_a_closed_stderr_does_not_stop_training(shards, tmp_path):
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "tfcli", *map(str, pretrain_args(shards, run, "--max-steps", "40"))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    process.stderr.readline()  # the first status line, then the reader goes away (`2>&1 | head -1`)
    process.stderr.close()
    assert process.wait(timeout=120) == 0
    assert json.loads((run / "trainer" / "state.json").read_text())["step"] == 40


def test_a_signal_saves_a_checkpoint_that_resumes(cli, shards, tmp_path):
    """Ctrl-C (exit 130) and SIGTERM (143), one run each, side by side."""
    args = ["--max-steps", "400", "--save-every", "1000", "--eval-every", "1000", "--batch-size", "16"]
    runs = {signal.SIGINT: (tmp_path / "sigint", 130), signal.SIGTERM: (tmp_path / "sigterm", 143)}
    processes = {signum: spawn(pretrain_args(shards, run, *args)) for signum, (run, _) in runs.items()}
    for signum, process in processes.items():
        wait_for_step(runs[signum][0], process, 3)
        process.send_signal(signum)
    for signum, process in processes.items():
        run, code = runs[signum]
        _, err = process.communicate(timeout=60)
        assert process.returncode == code, err
        assert "--resume" in err and "Traceback" not in err
        state = json.loads((run / "trainer" / "state.json").read_text())
        assert 3 <= state["step"] < 400
        assert records(run)[-1]["step"] == state["step"]
        result = cli(
            *pretrain_args(shards, run, "--max-steps", str(state["step"] + 2), "--save-every", "1000", "--eval-every", "1000", "--batch-size", "16", "--resume")
        )
        assert result.code == 0, result.stderr
        assert json.loads((run / "trainer" / "state.json").read_text())["step"] == state["step"] + 2


def test_a_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(cli, shards, tmp_path, monkeypatch):
    from tfcli.checkpoint import load_checkpoint
    from tfcli.train import objectives

    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "2")).code == 0
    before = snapshot(run)
    result = cli(*pretrain_args(shards, run, "--max-steps", "2", "--resume"))
    assert result.code == 0 and snapshot(run)["model.safetensors"] == before["model.safetensors"]

    real_loss, calls = objectives.loss_sum, []

    def loss_turning_nan_at_step_4(*args, **kwargs):
        calls.append(1)
        loss = real_loss(*args, **kwargs)
        return loss * float("nan") if len(calls) == 4 else loss

    monkeypatch.setattr(objectives, "loss_sum", loss_turning_nan_at_step_4)
    run = tmp_path / "exploding"
    result = cli(*pretrain_args(shards, run, "--max-steps", "50", "--save-every", "2"))
    assert result.code == 2
    assert "step 4:" in result.stderr and "not finite" in result.stderr and "step 2" in result.stderr
    assert "Traceback" not in result.stderr
    assert json.loads((run / "trainer" / "state.json").read_text())["step"] == 2
    load_checkpoint(run)  # the last checkpoint holds only finite tensors
    text = (run / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text


@pytest.mark.parametrize("where", ["step", "evaluation"])
def test_the_device_running_out_of_memory_is_one_line_with_the_fix_and_the_checkpoint_kept(cli, shards, tmp_path, monkeypatch, where):
    """CUDA's out-of-memory error, faked on the CPU (torch.OutOfMemoryError, which torch.cuda.OutOfMemoryError is),
    raised from the third step's forward pass or from the evaluation after it: one line that says what to change,
    exit 2, and the checkpoint of step 2 as it was written."""
    import torch

    from tfcli.train import objectives, trainer

    real_loss, calls = objectives.loss_sum, []

    def loss_out_of_memory_at_step_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB\nmore")
        return real_loss(*args, **kwargs)

    def evaluate_out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    if where == "step":
        monkeypatch.setattr(objectives, "loss_sum", loss_out_of_memory_at_step_3)
    else:
        monkeypatch.setattr(trainer, "evaluate_model", evaluate_out_of_memory)
    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--max-steps", "50", "--save-every", "2", "--eval-every", "3"))
    assert result.code == 2 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "out of memory" in line]  # under the progress lines, the error's one
    begins = "step 3: the cpu device ran out of memory (CUDA out of memory" if where == "step" else "evaluating at step 3: the cpu device ran out"
    assert line.startswith(f"error: {begins}") and "GPU 0 has" not in line, line  # CUDA's first two sentences, not its paragraph
    assert "the last good checkpoint (step 2) is kept" in line and "use a smaller --batch-size (--set grad_accum=N keeps the tokens per step)" in line
    assert json.loads((run / "trainer" / "state.json").read_text())["step"] == 2
    assert records(run)[-1]["step"] == 2  # nothing recorded after the failure (step 3's record waits for its evaluation)


@pytest.mark.parametrize("where", ["move", "optimizer"])
def test_running_out_of_memory_while_the_model_is_set_up_is_one_line_that_names_a_smaller_model(cli, shards, tmp_path, monkeypatch, where):
    """CUDA's out-of-memory error (faked on the CPU) as the model moves to the device or as the optimizer is
    built (--resume loads its saved state onto the device): one line, exit 2, the model's size as the fix (a
    smaller batch would not help), and the checkpoint the run resumed from kept."""
    import torch

    from tfcli.train import trainer

    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "2")).code == 0

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB\nmore")

    monkeypatch.setattr(trainer, "prepare" if where == "move" else "optimizer_for", out_of_memory)
    result = cli(*pretrain_args(shards, run, "--max-steps", "4", "--resume"))
    assert result.code == 2 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "out of memory" in line]
    doing = "moving the model to the cpu device" if where == "move" else "building the optimizer"
    assert line.startswith(f"error: {doing}: the cpu device ran out of memory (CUDA out of memory. Tried to allocate 20.00 GiB)"), line
    assert "the last good checkpoint (step 2) is kept" in line and "a smaller model (--preset" in line and "--batch-size" not in line
    assert json.loads((run / "trainer" / "state.json").read_text())["step"] == 2


def test_running_out_of_memory_under_compile_is_not_taken_for_the_compiler_failing(cli, shards, tmp_path, monkeypatch):
    """--compile's fallback (a first step that fails: train without the compiler) leaves the device's
    out-of-memory alone: a smaller batch is the fix, not dropping torch.compile."""
    import torch

    from tfcli.train import objectives

    monkeypatch.setattr(torch, "compile", lambda module, *args, **kwargs: module)  # compiling is not what this test times

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(objectives, "loss_sum", out_of_memory)
    result = cli(*pretrain_args(shards, tmp_path / "run", "--max-steps", "3", "--compile"))
    assert result.code == 2 and "torch.compile does not work here" not in result.stderr
    assert "step 1: the cpu device ran out of memory" in result.stderr and "no checkpoint was written" in result.stderr


def test_resume_refuses_a_changed_model_or_setting(cli, shards, tmp_path):
    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "3")).code == 0
    before = snapshot(run)
    result = cli(*pretrain_args(shards, run, "--max-steps", "5", "--resume", "--set", "n_layers=2"))
    assert result.code == 2 and "n_layers" in result.stderr
    result = cli(*pretrain_args(shards, run, "--max-steps", "5", "--resume", "--batch-size", "8"))
    assert result.code == 2 and "batch_size was 4, now 8; pass the run's own value (--set batch_size=4)" in result.stderr
    result = cli(*pretrain_args(shards, run, "--max-steps", "5"))
    assert result.code == 2 and "already holds a run" in result.stderr
    assert snapshot(run) == before
    result = cli(*pretrain_args(shards, tmp_path / "fresh", "--max-steps", "5", "--resume"))
    assert result.code == 2 and "no run to resume" in result.stderr
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.tokenizer.core import TextTokenizer

    (tmp_path / "more.txt").write_text(TINY_TEXT * 31, encoding="utf-8")
    other = tmp_path / "other-shards"
    encode_corpus(resolve_corpus([tmp_path / "more.txt"]), TextTokenizer.load(shards.parent / "tokenizer"), other, val_fraction=0.2)
    result = cli(*pretrain_args(other, run, "--max-steps", "5", "--resume", "--tokenizer", shards.parent / "tokenizer"))
    assert result.code == 2 and f"{other} is not the data the run was trained on" in result.stderr, result.stderr
    assert snapshot(run) == before


@pytest.mark.parametrize("kind", ["os", "safetensors"])  # safetensors reports a full disk as its own error type
def test_a_failing_save_is_a_clear_error_and_keeps_the_previous_checkpoint(cli, shards, tmp_path, monkeypatch, kind):
    import errno

    import safetensors.torch
    from safetensors import SafetensorError

    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "2")).code == 0
    real = safetensors.torch.save_file

    def full_disk(*args, **kwargs):
        if kind == "os":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    before = {k: v for k, v in snapshot(run).items() if k != "metrics.jsonl"}
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    result = cli(*pretrain_args(shards, run, "--max-steps", "4", "--resume"))
    assert result.code == 2 and "No space left" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 or "error:" in result.stderr.strip().splitlines()[-1]
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    after = {k: v for k, v in snapshot(run).items() if k != "metrics.jsonl" and k != "loss.png"}
    assert after == {k: v for k, v in before.items() if k != "loss.png"}


def test_a_resume_never_replaces_best_with_a_worse_model(cli, shards, tmp_path):
    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "4", "--eval-every", "2", "--save-every", "4")).code == 0
    config = json.loads((run / "best" / "config.json").read_text())
    assert config["training"]["val_loss"] > 0
    # as if best/ had been saved after the last checkpoint (a crash between the two) with a loss no later step beats
    config["training"]["val_loss"] = 0.001
    (run / "best" / "config.json").write_text(json.dumps(config))
    best_weights = (run / "best" / "model.safetensors").read_bytes()
    assert cli(*pretrain_args(shards, run, "--max-steps", "8", "--eval-every", "2", "--save-every", "4", "--resume")).code == 0
    assert (run / "best" / "model.safetensors").read_bytes() == best_weights


def test_a_longer_max_steps_on_resume_continues_the_schedule(cli, shards, tmp_path):
    """Extending a finished run: the rate goes on down from where it was, to the new end, never back up; a
    second resume of the extended run keeps that schedule."""
    run = tmp_path / "run"
    common = ["--eval-every", "4", "--save-every", "4", "--log-every", "1", "--batch-size", "4", "--set", "warmup_steps=2"]
    assert cli(*pretrain_args(shards, run, *common, "--max-steps", "8")).code == 0
    first = {r["step"]: r["lr"] for r in records(run) if "lr" in r}
    assert cli(*pretrain_args(shards, run, *common, "--max-steps", "16", "--resume")).code == 0
    rates = [r["lr"] for r in records(run) if "lr" in r]
    assert len(rates) == 16 and rates[:8] == pytest.approx([first[step] for step in range(1, 9)])
    after = rates[7:]
    assert all(b <= a + 1e-12 for a, b in zip(after, after[1:])), after  # laid out again, step 9's rate would jump up
    assert after[-1] == pytest.approx(first[8])  # ends at min_lr_ratio, as the run did before
    assert after[1] > rates[7] * 0.9  # and goes on from the rate it had, not from the floor
    restart = json.loads((run / "config.json").read_text())["training"]["config"]["decay_restart"]
    assert restart[0] == 8

    extended = tmp_path / "extended"  # the same extension killed halfway and resumed again gives the same rates
    assert cli(*pretrain_args(shards, extended, *common, "--max-steps", "8")).code == 0
    process = spawn(pretrain_args(shards, extended, *common, "--max-steps", "16", "--resume", "--save-every", "2"))
    wait_for_step(extended, process, 12)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert 8 < json.loads((extended / "trainer" / "state.json").read_text())["step"] < 16
    assert cli(*pretrain_args(shards, extended, *common, "--max-steps", "16", "--resume")).code == 0
    assert [r["lr"] for r in records(extended) if "lr" in r] == pytest.approx(rates)


def test_early_stopping_counts_on_across_a_resume(cli, shards, tmp_path):
    """The evaluations without a lower validation loss are in the trainer state: a run stopped with the count
    running and resumed stops where the uninterrupted run stopped, with the same records."""
    common = ["--eval-every", "5", "--set", "eval_batches=2", "--early-stop", "3", "--schedule", "constant", "--set", "warmup_steps=0", "--save-every", "5"]
    whole = tmp_path / "whole"
    result = cli(*pretrain_args(shards, whole, *common, "--max-steps", "400", "--json"))
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["stopped_by"] == "early_stop"
    stop = records(whole)[-1]["step"]
    best, pause = float("inf"), None
    for record in records(whole):
        if "val_loss" in record and record["val_loss"] < best:
            best = record["val_loss"]
        elif "val_loss" in record:  # the count is running here
            pause = record["step"]
            break
    assert pause is not None and pause < stop < 400
    broken = tmp_path / "broken"
    assert cli(*pretrain_args(shards, broken, *common, "--max-steps", str(pause))).code == 0
    assert json.loads((broken / "trainer" / "state.json").read_text())["evals_since_best"] >= 1
    result = cli(*pretrain_args(shards, broken, *common, "--max-steps", "400", "--resume"))
    assert result.code == 0, result.stderr
    assert "stopped early: the validation loss did not improve for 3 evaluations" in result.stdout
    drop = ("tokens_per_sec", "mfu", "elapsed")
    assert [{k: v for k, v in r.items() if k not in drop} for r in records(broken)] == [{k: v for k, v in r.items() if k not in drop} for r in records(whole)]
