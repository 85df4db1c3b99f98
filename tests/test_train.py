"""`tfcli train pretrain / finetune`: objectives, the run directory, exact resume, signals, refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TINY_TEXT, snapshot

TINY_MODEL = ["--set", "d_model=32", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "d_ff=64"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory, trained_tokenizer) -> Path:
    """Shards of the tiny text, with the tokenizer beside them (found without --tokenizer)."""
    import shutil

    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.tokenizer.core import TextTokenizer

    folder = tmp_path_factory.mktemp("data")
    corpus = folder / "corpus.txt"
    corpus.write_text(TINY_TEXT * 30, encoding="utf-8")
    shutil.copytree(trained_tokenizer, folder / "tokenizer")
    encode_corpus(resolve_corpus([corpus]), TextTokenizer.load(folder / "tokenizer"), folder / "shards", val_fraction=0.2)
    return folder / "shards"


@pytest.fixture(scope="module")
def reviews(tmp_path_factory) -> Path:
    """A labeled set a tiny model can learn: the label is whether the text mentions the fox."""
    import random

    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("labeled")
    lines = []
    for i in range(120):
        fox = i % 2 == 0
        words = rng.sample(["the", "dog", "ball", "park", "rain", "cat", "apple", "day"], 4)
        words.insert(rng.randrange(5), "fox" if fox else "tom")
        lines.append(json.dumps({"text": " ".join(words), "label": "fox" if fox else "other"}))
    path = folder / "reviews.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


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


def test_pretrain_decoder_makes_a_complete_run_directory(cli, shards, tmp_path):
    from tfcli.checkpoint import load_checkpoint

    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--max-steps", "40", "--eval-every", "20", "--json"))
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["step"] == 40 and summary["stopped_by"] == "steps"
    rows = records(run)
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0  # it learns
    assert {"val_loss", "val_ppl", "val_bpb"} <= set(rows[19]) and "val_loss" not in rows[18]
    assert "NaN" not in (run / "metrics.jsonl").read_text()
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "trainer" / "optimizer.safetensors").is_file()
    checkpoint = load_checkpoint(run)
    assert checkpoint.config.training["step"] == 40 and checkpoint.config.training["task"] == "lm"
    assert checkpoint.config.model.block_size == 32 and checkpoint.config.model.d_model == 32
    best = load_checkpoint(run / "best")
    assert best.config.training["step"] in (20, 40)
    assert summary["best_val_loss"] == min(r["val_loss"] for r in rows if "val_loss" in r)


def test_the_last_step_is_validated_when_it_is_not_an_evaluation_step(cli, shards, tmp_path):
    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--max-steps", "30", "--eval-every", "20", "--json"))
    assert result.code == 0, result.stderr
    rows = records(run)
    assert [r["step"] for r in rows] == list(range(1, 31))  # one record per step: the evaluation joins step 30's
    assert [r["step"] for r in rows if "val_loss" in r] == [20, 30]
    assert "loss" in rows[-1] and "val_ppl" in rows[-1]
    summary = json.loads(result.stdout)
    assert summary["last"]["val_loss"] == rows[-1]["val_loss"]
    assert summary["best_val_loss"] == min(rows[19]["val_loss"], rows[29]["val_loss"])
    lines = [line for line in result.stderr.splitlines() if line.startswith("step") and line.split()[1] == "30"]
    assert len(lines) == 2 and "loss" in lines[0] and lines[1].split()[2] == "val"  # the second line adds only the validation


@pytest.mark.parametrize("arch", ["encoder", "encoder-decoder"])
def test_pretrain_encoder_and_encoder_decoder_objectives_learn(cli, shards, tmp_path, arch):
    run = tmp_path / arch
    result = cli(*pretrain_args(shards, run, "--arch", arch, "--max-steps", "40", "--eval-every", "40"))
    assert result.code == 0, result.stderr
    rows = records(run)
    first = sum(r["loss"] for r in rows[:5]) / 5
    last = sum(r["loss"] for r in rows[-5:]) / 5
    assert last < first - 0.5
    assert "val_loss" in rows[-1]
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["arch"] == arch
    task = {"encoder": "mlm", "encoder-decoder": "denoise"}[arch]
    assert config["training"]["task"] == task
    # continued pretraining: the architecture's own objective, from where the run left off
    more = cli(
        "train", "finetune", "--init-from", run, "--task", task, "--data", shards, "-o", tmp_path / "more", "--max-steps", "3", "--batch-size", "4", "--json"
    )
    assert more.code == 0, more.stderr
    assert json.loads((tmp_path / "more" / "config.json").read_text())["training"]["task"] == task
    assert records(tmp_path / "more")[0]["loss"] < first  # it starts trained
    wrong = cli("train", "finetune", "--init-from", run, "--task", "lm", "--data", shards, "-o", tmp_path / "lm")
    assert wrong.code == 2 and f"is {'an encoder' if arch == 'encoder' else 'an encoder-decoder'}" in wrong.stderr
    assert f"continue its pretraining with --task {task}" in wrong.stderr


def _spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tfcli", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


def _wait_for_step(run: Path, process: subprocess.Popen, step: int, timeout: float = 120.0) -> int:
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


def test_a_run_killed_between_checkpoints_resumes_bit_for_bit(cli, shards, tmp_path):
    args = ["--max-steps", "60", "--save-every", "10", "--eval-every", "10", "--batch-size", "16"]
    whole = tmp_path / "whole"
    assert cli(*pretrain_args(shards, whole, *args)).code == 0
    broken = tmp_path / "broken"
    process = _spawn(pretrain_args(shards, broken, *args))
    reached = _wait_for_step(broken, process, 23)
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
    process = _spawn(pretrain_args(shards, broken, *args))
    _wait_for_step(broken, process, 14 if stop == signal.SIGKILL else 5)
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
    processes = {signum: _spawn(pretrain_args(shards, run, *args)) for signum, (run, _) in runs.items()}
    for signum, process in processes.items():
        _wait_for_step(runs[signum][0], process, 3)
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


def test_resume_refuses_a_changed_model_or_setting(cli, shards, tmp_path):
    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "3")).code == 0
    before = snapshot(run)
    result = cli(*pretrain_args(shards, run, "--max-steps", "5", "--resume", "--set", "n_layers=2"))
    assert result.code == 2 and "n_layers" in result.stderr
    result = cli(*pretrain_args(shards, run, "--max-steps", "5", "--resume", "--batch-size", "8"))
    assert result.code == 2 and "batch_size" in result.stderr
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


def test_bad_inputs_are_one_line_errors(cli, shards, tmp_path):
    from tfcli.data.shards import load_shard_meta

    meta = load_shard_meta(shards)
    assert meta.train_tokens > meta.val_tokens + 1
    toml = tmp_path / "encoder.toml"
    toml.write_text('[model]\narch = "encoder"\n')
    small = tmp_path / "small.toml"
    small.write_text('preset = "small"\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nd_model = "abc"\n')
    cases = [
        (pretrain_args(shards, tmp_path / "a", "--block-size", "100000"), "the train split holds"),
        # longer than the validation split, not the train split: refused too, not trained without validation
        (pretrain_args(shards, tmp_path / "a2", "--block-size", str(meta.val_tokens)), "the validation split holds"),
        (pretrain_args(tmp_path, tmp_path / "b"), "meta.json"),
        (pretrain_args(shards, tmp_path / "c", "--arch", "lstm"), "--arch"),
        (pretrain_args(shards, tmp_path / "d", "--set", "warp=9"), "warp"),
        (pretrain_args(shards, tmp_path / "e", "--time-budget", "soon"), "duration"),
        (pretrain_args(shards, tmp_path / "e", "--time-budget", "5s", "--max-steps", "10"), "do not go together"),
        (pretrain_args(shards, tmp_path / "f", "--lr", "-1"), "lr"),
        (pretrain_args(shards, tmp_path / "g", "--device", "cuda"), "cuda"),
        # what --arch, the tokenizer and the objective decide is never silently overridden by a file or --set
        (pretrain_args(shards, tmp_path / "h", "--config", toml, "--arch", "decoder"), "sets arch = 'encoder', but --arch decides it here"),
        (pretrain_args(shards, tmp_path / "i", "--set", "task=mlm"), "but a decoder's pretraining objective decides it"),
        (pretrain_args(shards, tmp_path / "j", "--set", "vocab_size=99"), "but the tokenizer decides it"),
        (pretrain_args(shards, tmp_path / "k", "--set", "train.block_size=64"), "set the context with --block-size"),
        (pretrain_args(shards, tmp_path / "l", "--block-size", "1"), "model block_size must be at least 2"),
        (pretrain_args(shards, tmp_path / "m", "--config", small, "--preset", "tiny"), "asks for preset 'small' and --preset for 'tiny'"),
        # settings that would be silently untrained or ignored
        (pretrain_args(shards, tmp_path / "n", "--set", "n_classes=3"), "pretraining does not train a classification head"),
        (pretrain_args(shards, tmp_path / "o", "--set", "n_decoder_layers=3"), "a decoder's depth is n_layers"),
        (pretrain_args(shards, tmp_path / "p", "--set", "noise_density=0.5"), "noise_density is for the denoise task; this run trains lm"),
        (pretrain_args(shards, tmp_path / "q", "--set", "freeze=body"), "freeze is for fine-tuning"),
        # a value of the wrong type, named as it was typed
        (pretrain_args(shards, tmp_path / "r", "--set", "d_model=abc"), "error: --set d_model: expected an integer, got 'abc'\n"),
        (pretrain_args(shards, tmp_path / "s", "--set", "train.lr=fast"), "error: --set train.lr: expected a finite number, got 'fast'\n"),
        (pretrain_args(shards, tmp_path / "t", "--config", bad), f"error: {bad}: model.d_model: expected an integer, got 'abc'\n"),
    ]
    for args, needle in cases:
        result = cli(*args)
        assert result.code == 2, (args, result.stderr)
        assert needle in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for name in (
        "a",
        "a2",
        "b",
        "c",
        "d",
        "e",
        "f",
        "g",
        "h",
        "i",
        "j",
        "k",
        "l",
        "m",
        "n",
        "o",
        "p",
        "q",
        "r",
        "s",
        "t",
    ):  # nothing written, not even the folder
        assert not (tmp_path / name).exists(), name
    (tmp_path / "mine").mkdir()  # a folder that was there before stays, empty or not
    assert cli(*pretrain_args(shards, tmp_path / "mine", "--block-size", "100000")).code == 2 and (tmp_path / "mine").is_dir()
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    result = cli(*pretrain_args(shards, afile, "--max-steps", "2"))
    assert result.code == 2 and afile.read_text() == "keep me"


def test_the_architecture_follows_the_settings_unless_arch_is_given(shards, tmp_path):
    from tfcli.train.job import pretrain_job

    toml = tmp_path / "s2s.toml"
    toml.write_text('[model]\narch = "encoder-decoder"\n')
    cases = [
        (dict(preset_name="bert-base"), "encoder", "mlm"),
        (dict(config_file=toml), "encoder-decoder", "denoise"),
        (dict(sets=["arch=encoder"]), "encoder", "mlm"),
        ({}, "decoder", "lm"),
        (dict(arch="decoder", preset_name="bert-base"), "decoder", "lm"),
    ]  # --arch wins: bert-base's shape as a decoder
    for i, (given, arch, task) in enumerate(cases):
        arguments = dict(
            data=shards, output=tmp_path / f"run{i}", arch=None, preset_name=None, config_file=None, sets=[], options={}, tokenizer_path=None, resume=False
        )
        job = pretrain_job(**{**arguments, **given})
        assert (job.model_config.arch, job.config.task) == (arch, task), given


def test_the_output_folder_is_new_empty_or_a_failed_start_and_one_process_at_a_time(cli, shards, tmp_path, monkeypatch):
    from tfcli.fsutil import exclusive_lock

    mine = tmp_path / "mine"
    (mine / "trainer").mkdir(parents=True)
    (mine / "notes.txt").write_text("precious")
    (mine / "trainer" / "keep.txt").write_text("keep")
    before = snapshot(mine)
    result = cli(*pretrain_args(shards, mine, "--max-steps", "2"))
    assert result.code == 2 and "holds files that are not a run's ('notes.txt')" in result.stderr
    assert snapshot(mine) == before
    result = cli(*pretrain_args(shards, shards.parent / "tokenizer", "--max-steps", "2"))
    assert result.code == 2 and "is a tokenizer folder; a run would write over it" in result.stderr
    leftovers = tmp_path / "failed"  # what a run that died before its first checkpoint leaves may be trained into
    leftovers.mkdir()
    (leftovers / "metrics.jsonl").write_text("")
    assert cli(*pretrain_args(shards, leftovers, "--max-steps", "2")).code == 0
    busy = tmp_path / "busy"
    busy.mkdir()
    with exclusive_lock(busy, "training into"):  # as if another process were training there
        result = cli(*pretrain_args(shards, busy, "--max-steps", "2"))
    assert result.code == 2 and "another process is training into" in result.stderr
    assert cli(*pretrain_args(shards, busy, "--max-steps", "2")).code == 0

    import tfcli.train.loop

    def interrupted(job):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(tfcli.train.loop, "train", interrupted)  # Ctrl-C before anything is written
    assert cli(*pretrain_args(shards, tmp_path / "never", "--max-steps", "2")).code == 130
    assert not (tmp_path / "never").exists()


def test_shards_with_ids_past_the_vocabulary_are_one_line(cli, shards, tmp_path):
    import shutil

    import numpy as np

    from tfcli.data.shards import load_shard_meta

    damaged = tmp_path / "data" / "shards"
    shutil.copytree(shards.parent, tmp_path / "data")
    ids = np.fromfile(damaged / "train.bin", dtype=load_shard_meta(damaged).dtype)
    ids[::7] = 60000
    ids.tofile(damaged / "train.bin")
    result = cli(*pretrain_args(damaged, tmp_path / "run", "--max-steps", "2"))
    assert result.code == 2 and "holds the token id 60000, outside the model's vocabulary" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_empty_validation_split_is_said_out_loud(cli, trained_tokenizer, tmp_path):
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.tokenizer.core import TextTokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TINY_TEXT * 30, encoding="utf-8")
    encode_corpus(resolve_corpus([corpus]), TextTokenizer.load(trained_tokenizer), tmp_path / "shards", val_fraction=0.0)
    result = cli(*pretrain_args(tmp_path / "shards", tmp_path / "run", "--max-steps", "3", "--tokenizer", trained_tokenizer))
    assert result.code == 0, result.stderr
    assert "the validation split is empty: nothing is validated and no best/ checkpoint is kept" in result.stdout + result.stderr
    assert not (tmp_path / "run" / "best").exists()
    result = cli("eval", tmp_path / "run", "--data", tmp_path / "shards")
    assert result.code == 2 and "the val split of" in result.stderr and "--split train" in result.stderr


def test_finetune_task_is_not_overridden_by_a_setting(cli, shards, reviews, tmp_path):
    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "2")).code == 0
    result = cli(
        "train", "finetune", "--init-from", run, "--task", "classify", "--data", reviews, "-o", tmp_path / "child", "--max-steps", "2", "--set", "task=lm"
    )
    assert result.code == 2 and "sets task = 'lm', but --task decides it here" in result.stderr
    for task, data in (("lm", shards), ("classify", reviews)):  # a head would go untrained, or contradict the labels
        result = cli(
            "train",
            "finetune",
            "--init-from",
            run,
            "--task",
            task,
            "--data",
            data,
            "-o",
            tmp_path / f"child-{task}",
            "--max-steps",
            "2",
            "--set",
            "n_classes=3",
        )
        assert result.code == 2 and "fine-tuning does not take n_classes" in result.stderr, result.stderr
        assert not (tmp_path / f"child-{task}").exists()
    result = cli(
        "train",
        "finetune",
        "--init-from",
        run,
        "--task",
        "classify",
        "--data",
        reviews,
        "--val-data",
        reviews,
        "-o",
        tmp_path / "child-v",
        "--max-steps",
        "2",
        "--set",
        "val_fraction=0.5",
    )
    assert result.code == 2 and "val_fraction does nothing with --val-data" in result.stderr


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


def test_time_budget_ends_the_run_on_time(cli, shards, tmp_path):
    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--time-budget", "2s", "--eval-every", "0", "--json"))
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["stopped_by"] == "budget" and 2.0 <= summary["elapsed_seconds"] < 6.0
    lrs = [r["lr"] for r in records(run)]
    assert max(lrs) > 2e-3 and lrs[-1] < 0.5 * max(lrs)  # warmed up, then decayed over the budget


def test_config_file_and_sets_resolve_in_order(cli, shards, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('preset = "tiny"\n[model]\nd_model = 48\nn_heads = 3\npositions = "rotary"\n[train]\nlr = 0.002\nseed = 7\n')
    run = tmp_path / "run"
    result = cli(
        "train",
        "pretrain",
        "--data",
        shards,
        "-o",
        run,
        "--config",
        config,
        "--set",
        "n_layers=1",
        "--set",
        "train.seed=8",
        "--block-size",
        "32",
        "--max-steps",
        "2",
        "--seed",
        "9",
        "--batch-size",
        "2",
    )
    assert result.code == 0, result.stderr
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["d_model"] == 48 and saved["model"]["positions"] == "rotary" and saved["model"]["n_layers"] == 1
    assert saved["training"]["config"]["lr"] == 0.002 and saved["training"]["config"]["seed"] == 9


def test_finetune_classifier_learns_and_records_labels(cli, shards, reviews, tmp_path):
    from tfcli.checkpoint import load_checkpoint

    parent = tmp_path / "parent"
    assert cli(*pretrain_args(shards, parent, "--max-steps", "5")).code == 0
    child = tmp_path / "child"
    result = cli(
        "train",
        "finetune",
        "--init-from",
        parent,
        "--task",
        "classify",
        "--data",
        reviews,
        "-o",
        child,
        "--max-steps",
        "60",
        "--batch-size",
        "16",
        "--lr",
        "3e-3",
        "--eval-every",
        "60",
        "--json",
    )
    assert result.code == 0, result.stderr
    last = json.loads(result.stdout)["last"]
    assert last["val_accuracy"] >= 0.9 and last["val_macro_f1"] >= 0.9
    checkpoint = load_checkpoint(child)
    assert checkpoint.config.model.n_classes == 2
    assert checkpoint.config.training["labels"] == ["fox", "other"]
    shown = cli("info", child).stdout
    assert "classify (fine-tuned from" in shown and "2: fox, other" in shown
    parent_weights, child_weights = weights(parent), weights(child)
    assert not (parent_weights["tok_emb.weight"] == child_weights["tok_emb.weight"]).all()


def test_finetune_reads_csv_and_parquet_with_renamed_fields(cli, shards, reviews, tmp_path):
    import csv
    import gzip

    rows = [json.loads(line) for line in reviews.read_text().splitlines()]
    table = tmp_path / "reviews.csv.gz"
    with gzip.open(table, "wt", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "review", "stars"])
        writer.writerows([i, r["text"], r["label"]] for i, r in enumerate(rows))
    parent = tmp_path / "parent"
    assert cli(*pretrain_args(shards, parent, "--max-steps", "2")).code == 0
    child = tmp_path / "child"
    args = ["train", "finetune", "--init-from", parent, "--task", "classify", "--max-steps", "3", "--batch-size", "8"]
    result = cli(*args, "--data", table, "-o", child, "--text-field", "review", "--label-field", "stars")
    assert result.code == 0, result.stderr
    from tfcli.checkpoint import read_run_config

    training = read_run_config(child).training
    assert training["labels"] == ["fox", "other"] and training["fields"] == {"text": "review", "label": "stars"}
    scored = cli("eval", child, "--data", table, "--json")  # the run's own field names
    assert scored.code == 0 and json.loads(scored.stdout)["examples"] == len(rows), scored.stderr
    missing = cli(*args, "--data", table, "-o", tmp_path / "c2")
    assert missing.code == 2 and "reviews.csv.gz has no column 'text'" in missing.stderr and "--text-field" in missing.stderr
    wrong = cli(*args, "--data", table, "-o", tmp_path / "c3", "--source-field", "review")
    assert wrong.code == 2 and "--source-field does not apply to --task classify" in wrong.stderr

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    parquet = tmp_path / "reviews.parquet"
    pq.write_table(pa.table({"text": [r["text"] for r in rows], "label": [1 if r["label"] == "fox" else 0 for r in rows]}), parquet)
    result = cli(*args, "--data", parquet, "-o", tmp_path / "c4", "--json")
    assert result.code == 0, result.stderr
    assert read_run_config(tmp_path / "c4").training["labels"] == ["0", "1"]


def test_finetune_with_a_frozen_body_trains_only_the_head(cli, shards, reviews, tmp_path):
    parent = tmp_path / "parent"
    assert cli(*pretrain_args(shards, parent, "--arch", "encoder", "--max-steps", "3")).code == 0
    child = tmp_path / "child"
    result = cli("train", "finetune", "--init-from", parent, "--task", "classify", "--data", reviews, "-o", child, "--max-steps", "5", "--freeze", "body")
    assert result.code == 0, result.stderr
    a, b = weights(parent), weights(child)
    assert all((a[k] == b[k]).all() for k in a)
    assert "classifier.weight" in b and "classifier.weight" not in a


def test_finetune_seq2seq_and_continued_lm(cli, shards, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"source": f"the fox {i}", "target": f"a dog {i}"}) + "\n" for i in range(40)))
    parent = tmp_path / "s2s"
    assert cli(*pretrain_args(shards, parent, "--arch", "encoder-decoder", "--max-steps", "3")).code == 0
    child = tmp_path / "s2s-child"
    result = cli(
        "train",
        "finetune",
        "--init-from",
        parent,
        "--task",
        "seq2seq",
        "--data",
        pairs,
        "-o",
        child,
        "--max-steps",
        "30",
        "--batch-size",
        "8",
        "--lr",
        "3e-3",
        "--eval-every",
        "30",
        "--json",
    )
    assert result.code == 0, result.stderr
    rows = records(child)
    assert rows[-1]["loss"] < rows[0]["loss"] and "val_loss" in rows[-1]

    decoder = tmp_path / "lm"
    assert cli(*pretrain_args(shards, decoder, "--max-steps", "3")).code == 0
    result = cli(
        "train", "finetune", "--init-from", decoder, "--task", "lm", "--data", shards, "-o", tmp_path / "lm2", "--max-steps", "3", "--block-size", "16"
    )
    assert result.code == 0, result.stderr


def test_finetune_refusals(cli, shards, reviews, tmp_path, trained_tokenizer):
    parent = tmp_path / "parent"
    assert cli(*pretrain_args(shards, parent, "--max-steps", "2")).code == 0
    other = tmp_path / "other-shards"
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.tokenizer.core import TextTokenizer
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.training_config import TokenizerTrainingConfig

    corpus = tmp_path / "c.txt"
    corpus.write_text(TINY_TEXT * 10)
    train_tokenizer(resolve_corpus([corpus]), tmp_path / "tok2", TokenizerTrainingConfig(vocab_size=300))
    encode_corpus(resolve_corpus([corpus]), TextTokenizer.load(tmp_path / "tok2"), other)
    bad_label = tmp_path / "bad.jsonl"
    bad_label.write_text('{"text": "a", "label": "x"}\n{"text": "b"}\n')
    one_label = tmp_path / "one.jsonl"
    one_label.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "x"}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    cases = [
        (["--task", "lm", "--data", other], "another tokenizer"),
        (["--task", "classify", "--data", bad_label], "line 2"),
        (["--task", "classify", "--data", one_label], "only one label"),
        (["--task", "classify", "--data", empty], "no labeled examples"),
        (["--task", "seq2seq", "--data", reviews], "encoder-decoder"),
        (["--task", "classify", "--data", reviews, "--set", "d_model=64"], "d_model"),
        (["--task", "classify", "--data", reviews, "--block-size", "999"], "context"),
    ]
    for args, needle in cases:
        result = cli("train", "finetune", "--init-from", parent, "-o", tmp_path / "child", "--max-steps", "1", *args)
        assert result.code == 2, (args, result.stderr)
        assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "child" / "config.json").exists()


def _torchrun(args: list, nproc: int = 2) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc), "-m", "tfcli", *map(str, args)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    )


def test_two_gloo_ranks_match_one_process_with_the_whole_batch(cli, shards, tmp_path):
    common = ["--max-steps", "6", "--eval-every", "3", "--set", "bias=false", "--grad-accum", "2"]
    single, double = tmp_path / "single", tmp_path / "double"
    # the reference runs like a rank does (its own process, one thread), so only the process count differs;
    # the two runs go side by side (every rank has one thread)
    reference = _torchrun(pretrain_args(shards, single, *common, "--batch-size", "8"), nproc=1)
    process = _torchrun(pretrain_args(shards, double, *common, "--batch-size", "4"))
    _, err = reference.communicate(timeout=240)
    assert reference.returncode == 0, err
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err
    assert out.count("done:") == 1  # rank 0 alone speaks
    assert "FutureWarning" not in err
    one, two = records(single), records(double)
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 7))
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-5
        assert a["tokens"] == b["tokens"]
    assert abs(one[-1]["val_loss"] - two[-1]["val_loss"]) < 1e-5
    wa, wb = weights(single), weights(double)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6
    state = json.loads((double / "trainer" / "state.json").read_text())
    assert state["world_size"] == 2
    result = cli(*pretrain_args(shards, double, *common, "--batch-size", "4", "--resume", "--max-steps", "8"))
    assert result.code == 2 and "world size was 2, now 1" in result.stderr


def test_fsdp_ranks_train_like_ddp_ranks_and_resume_sharded(cli, shards, tmp_path):
    # a constant learning rate, so stopping at step 4 and resuming to 6 follows the same schedule as 6 at once
    common = [
        "--eval-every",
        "2",
        "--save-every",
        "2",
        "--set",
        "bias=false",
        "--grad-accum",
        "2",
        "--batch-size",
        "4",
        "--set",
        "schedule=constant",
        "--set",
        "warmup_steps=0",
    ]
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    # the DDP run and the first FSDP run go side by side (every rank has one thread)
    processes = [
        _torchrun(pretrain_args(shards, ddp, *common, "--max-steps", "6")),
        _torchrun(pretrain_args(shards, fsdp, *common, "--max-steps", "4", "--fsdp")),
    ]
    for process in processes:
        _, err = process.communicate(timeout=240)
        assert process.returncode == 0, err
    assert (fsdp / "best" / "model.safetensors").is_file()
    # the optimizer state was gathered whole on save and is sharded again on resume
    process = _torchrun(pretrain_args(shards, fsdp, *common, "--max-steps", "6", "--fsdp", "--resume"))
    _, err = process.communicate(timeout=240)
    assert process.returncode == 0, err
    one, two = records(ddp), records(fsdp)
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 7))
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-5
    assert abs(one[-1]["val_loss"] - two[-1]["val_loss"]) < 1e-5
    wa, wb = weights(ddp), weights(fsdp)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6


def test_fsdp_needs_torchrun(cli, shards, tmp_path):
    result = cli(*pretrain_args(shards, tmp_path / "run", "--max-steps", "2", "--fsdp"))
    assert result.code == 2 and "torchrun" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "config.json").exists()


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the worker processes through /proc")
def test_a_rank_that_dies_ends_the_whole_run_with_an_error(shards, tmp_path):
    run = tmp_path / "run"
    process = _torchrun(pretrain_args(shards, run, "--max-steps", "100000", "--batch-size", "4", "--eval-every", "0"))
    _wait_for_step(run, process, 2)
    victims = [c for c in _children(process.pid) if b"RANK=1\x00" in Path(f"/proc/{c}/environ").read_bytes()]
    assert victims, "no rank-1 worker found"
    os.kill(victims[0], signal.SIGKILL)
    process.communicate(timeout=120)
    assert process.returncode != 0


def test_eval_scores_shards_text_and_labeled_sets(cli, shards, reviews, tmp_path, tiny_corpus):
    import math

    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--max-steps", "20", "--eval-every", "20")).code == 0
    result = cli("eval", run, "--data", shards, "--json")
    assert result.code == 0, result.stderr
    scored = json.loads(result.stdout)
    assert scored["task"] == "lm" and scored["split"] == "val" and scored["tokens"] > 0
    assert math.isclose(scored["ppl"], math.exp(scored["loss"]), rel_tol=1e-6) and 0 < scored["bpb"] < scored["loss"]
    text = cli("eval", run, "--data", tiny_corpus, "--json")
    assert text.code == 0 and json.loads(text.stdout)["loss"] > 0
    table = cli("eval", run, "--data", shards)
    assert "bits per byte" in table.stdout

    child = tmp_path / "child"
    assert (
        cli("train", "finetune", "--init-from", run, "--task", "classify", "--data", reviews, "-o", child, "--max-steps", "10", "--batch-size", "8").code == 0
    )
    labeled = cli("eval", child, "--data", reviews, "--json")
    scored = json.loads(labeled.stdout)
    assert scored["task"] == "classify" and scored["examples"] == 120 and 0 <= scored["accuracy"] <= 1 and "macro_f1" in scored
    first = json.loads(cli("eval", child, "--data", reviews, "--json", "--max-batches", "2", "--batch-size", "16").stdout)
    assert first["examples"] == 32 and first["loss"] != scored["loss"]  # --max-batches holds for labeled sets too
    shard_part = json.loads(cli("eval", run, "--data", shards, "--json", "--max-batches", "1", "--batch-size", "2").stdout)
    assert shard_part["tokens"] == 2 * 32

    assert "no classification head" in cli("eval", run, "--data", reviews).stderr
    assert cli("eval", run, "--data", tmp_path / "missing").code == 2
    (tmp_path / "short.txt").write_text("The fox.", encoding="utf-8")
    short = cli("eval", run, "--data", tmp_path / "short.txt")
    assert short.code == 2 and "short.txt holds" in short.stderr and "fewer than one window of 33" in short.stderr
    assert cli("eval", tmp_path / "nope", "--data", shards).code == 2
    for data, needle in ((run, "is a run directory, not data to evaluate"), (shards / "meta.json", f"pass the folder {shards}")):
        result = cli("eval", run, "--data", data)
        assert result.code == 2 and needle in result.stderr, result.stderr
    result = cli("eval", run, "--data", shards, "--device", "tpu")
    assert result.code == 2 and "unknown device 'tpu'" in result.stderr and "Traceback" not in result.stderr
    result = cli("eval", run, "--data", tiny_corpus, "--split", "train")  # a text file has no splits to choose
    assert result.code == 2 and "chooses a split of a shard folder" in result.stderr


def test_eval_scores_an_encoder_with_its_own_masking_reading_each_token_once(cli, shards, tmp_path, monkeypatch):
    from tfcli.train import data as d

    run = tmp_path / "mlm"
    assert cli(*pretrain_args(shards, run, "--arch", "encoder", "--set", "mask_prob=0.3", "--max-steps", "2")).code == 0
    seen = {}
    real = d.MLMSource.__init__

    def spy(self, *args, **kwargs):
        seen.update(kwargs)
        real(self, *args, **kwargs)

    monkeypatch.setattr(d.MLMSource, "__init__", spy)
    result = cli("eval", run, "--data", shards, "--json")
    assert result.code == 0, result.stderr
    assert seen["prob"] == 0.3
    assert json.loads(result.stdout)["tokens"] % 31 == 0  # rows of block - 1 = 31 text tokens, none read twice


def test_compile_falls_back_with_a_note_where_it_fails(cli, shards, tmp_path, monkeypatch):
    import torch

    def broken_compile(module, *args, **kwargs):
        def run(*a, **k):
            raise RuntimeError("no compiler here")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--max-steps", "3", "--compile"))
    assert result.code == 0, result.stderr
    assert "torch.compile does not work here" in result.stderr
    assert json.loads((run / "config.json").read_text())["training"]["config"]["compile"] is True
    assert records(run)[-1]["step"] == 3
