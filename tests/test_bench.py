"""`tfcli bench tokenize` runs all four jobs and reports ratios (speed is measured, never asserted)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import SAMPLE_DATA
from tests.helpers import require

pytestmark = pytest.mark.slow  # the real commands end to end; `-m "not slow"` skips them


def test_bench_tokenize_reports_every_job(cli, tmp_path):
    result = cli("bench", "tokenize", "--size-mb", "0.3", "--repeat", "1", "--workdir", tmp_path / "w", "--data", SAMPLE_DATA, "--json")
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    jobs = {m["job"]: m for m in data["measurements"]}
    assert set(jobs) == {"train_raw", "train_tfcli", "encode_raw", "encode_tfcli"}
    assert data["synthesized"] and data["corpus_bytes"] >= 300_000
    assert all(m["seconds"] > 0 and m["peak_rss_mb"] > 0 for m in jobs.values())
    assert jobs["encode_raw"]["tokens"] > 0 and jobs["encode_tfcli"]["tokens"] > 0
    # tfcli adds one end-of-text id per document and never splits special text, so counts are close
    assert abs(jobs["encode_tfcli"]["tokens"] - jobs["encode_raw"]["tokens"]) / jobs["encode_raw"]["tokens"] < 0.1
    assert data["train_time_ratio"] > 0 and data["encode_throughput_ratio"] > 0
    # the target follows the encoder: tiktoken where installed (the synthesized tokenizer is byte-level BPE)
    expected = "tiktoken" if importlib.util.find_spec("tiktoken") else "tokenizers"
    assert jobs["encode_tfcli"]["encoder"] == expected
    assert data["encode_throughput_target"] == (2.5 if expected == "tiktoken" else 0.9)


def test_bench_bad_options(cli, tmp_path):
    assert cli("bench", "tokenize", "--size-mb", "0").code == 2
    assert cli("bench", "tokenize", "--repeat", "0", "--size-mb", "0.1").code == 2
    (tmp_path / "afile").write_text("x")
    result = cli("bench", "tokenize", "--workdir", tmp_path / "afile", "--size-mb", "0.1", "--repeat", "1")
    assert result.code == 2 and "is a file, not a folder" in result.stderr and "Traceback" not in result.stderr


def test_bench_model_compares_with_transformers(cli):
    require("transformers")
    # no --length: the default (256) is capped at tiny's context
    result = cli("bench", "model", "--preset", "tiny", "--batch", "1", "--steps", "1", "--repeat", "1", "--json")
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["length"] == 128
    ours, theirs = data["results"]
    assert ours["implementation"] == "tfcli" and theirs["implementation"] == "transformers"
    assert ours["parameters"] == theirs["parameters"]  # the same shape on both sides
    assert abs(ours["loss"] - theirs["loss"]) < 0.5  # both near ln(vocab) at initialisation
    assert data["time_ratio"] > 0


def test_bench_model_bad_options(cli):
    assert "cannot be built as GPT-2" in cli("bench", "model", "--preset", "bert-base").stderr
    assert "longer than tiny's block size" in cli("bench", "model", "--preset", "tiny", "--length", "999").stderr
    refused = cli("bench", "model", "--preset", "tiny", "--repeat", "0")
    assert refused.code == 2 and "--repeat must be at least 1" in refused.stderr


def test_bench_train_runs_both_loops_on_the_same_shape(cli):
    require("transformers")
    # the plumbing, not the timing: --batch max capped at 2 (its search is the untimed first run: batches 1 and 2)
    result = cli("bench", "train", "--presets", "tiny", "--batch", "max", "--max-batch", "2", "--steps", "1", "--json")
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["batch"] == 2 and data["batch_search"] == {"largest": 2, "tried": [[1, True], [2, True]], "stopped_by": "the cap (--max-batch 2)"}
    assert data["card"]["bf16_peak_flops"] == 0.0 and "no datasheet peak on cpu" in data["card"]["note"]
    ours, theirs = data["results"]
    assert ours["batch"] == theirs["batch"] == 2 and ours["card_mfu"] is None and not ours["out_of_memory"]
    assert data["compile"] is False and not ours["compiled"] and ours["compile_seconds"] == 0.0 == theirs["compile_seconds"]
    assert (ours["implementation"], theirs["implementation"]) == ("tfcli", "transformers")
    assert ours["parameters"] == theirs["parameters"]
    assert all(r["tokens_per_sec"] > 0 and 0 < r["mfu"] < 1 and r["peak_flops"] > 0 for r in (ours, theirs))
    assert ours["peak_flops"] == theirs["peak_flops"]  # one yardstick, so MFU orders rows as tokens/s does
    assert (ours["mfu"] > theirs["mfu"]) == (ours["tokens_per_sec"] > theirs["tokens_per_sec"])
    assert data["throughput_ratio"]["tiny"] > 0


def test_bench_train_compile_runs_both_loops_compiled_and_times_the_compiling_apart(cli, monkeypatch):
    """--compile at tiny on the CPU: both loops run under torch.compile, each row says so with its compile time
    apart from its timed steps, and the table says what that time is. torch.compile is recorded and given back
    the module as it is: the plumbing is this test's, inductor's compile of tfcli's loop `train --compile`'s
    (tests/test_train.py), which here would cost a minute on a cold cache. The workers run in this process (a
    JSON round trip each), which saves their start-up."""
    require("transformers")
    import torch

    from tfcli.bench import train as bench

    def in_process(module, args):
        threads = torch.get_num_threads()
        try:
            if args[0] == "probe":
                return json.loads(json.dumps(bench.dataclasses.asdict(bench._probe(args[1], int(args[2]), int(args[3]), args[4], args[5]))))
            *job, mode = args
            return json.loads(json.dumps(bench.dataclasses.asdict(bench._job(job[0], job[1], *map(int, job[2:5]), job[5], job[6], mode == "compile"))))
        finally:
            torch.set_num_threads(threads)

    compiled = []

    def recorded(module, **options):
        compiled.append(type(module).__name__)
        return module

    monkeypatch.setattr(torch, "compile", recorded)
    monkeypatch.setattr(bench, "run_worker", in_process)
    monkeypatch.setattr("tfcli.train.setup.peak_matmul_flops", lambda *args, **kwargs: 1e12)  # the loop's own MFU, not the bench's
    monkeypatch.setenv("COLUMNS", "240")
    result = cli("bench", "train", "--presets", "tiny", "--batch", "2", "--steps", "1", "--compile", "--no-first-run")
    assert result.code == 0, result.stderr
    assert compiled == ["Transformer", "GPT2LMHeadModel"]  # tfcli's trainer compiled its model, the plain loop its own
    text = " ".join(result.stdout.split())
    assert "training step under torch.compile, batch 2" in text and "compiled in" in text and "not compiled" not in text
    assert "the 3 warm-up steps' time beyond that of as many timed steps" in text


def test_bench_train_bad_options(cli):
    assert "cannot be built as GPT-2" in cli("bench", "train", "--presets", "bert-base").stderr
    assert cli("bench", "train", "--presets", ",").code == 2
    assert cli("bench", "train", "--device", "tpu").code == 2
    import torch

    if not torch.cuda.is_available():  # the device is checked here, not inside a worker (whose traceback would show)
        result = cli("bench", "train", "--presets", "tiny", "--device", "cuda", "--steps", "1")
        assert result.code == 2 and "no CUDA GPU" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bench_lora_measures_full_and_lora_fine_tuning(cli, tmp_path):
    # --no-first-run: the plumbing, not the timing (the model bench runs the untimed first run)
    args = ("--preset", "tiny", "--rank", "4", "--batch", "2", "--block-size", "32", "--steps", "1", "--no-first-run")
    result = cli("bench", "lora", *args, "--workdir", tmp_path, "--json")
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    full, lora = data["full"], data["lora"]
    assert full["parameters"] == full["trainable"] and 0 < lora["trainable"] < lora["parameters"] // 10
    assert all(m["seconds_per_step"] > 0 and m["cpu_seconds_per_step"] > 0 and m["peak_rss_mb"] > 0 for m in (full, lora))
    assert data["rss_ratio"] == round(lora["peak_rss_mb"] / full["peak_rss_mb"], 4) and data["step_time_ratio"] > 0
    assert data["cpu_time_ratio"] == round(lora["cpu_seconds_per_step"] / full["cpu_seconds_per_step"], 4)
    assert list(tmp_path.iterdir()) == []  # the parent run and the shards are gone


def test_bench_lora_bad_options(cli):
    for args, message in (
        (["--preset", "bert-base"], "bench lora fine-tunes a decoder"),
        (["--preset", "tiny", "--rank", "0"], "--rank must be at least 1"),
        (["--preset", "tiny", "--rank", "65"], "is larger than the smallest targeted layer"),
        (["--preset", "tiny", "--targets", "ffn"], "unknown group 'ffn'"),
        (["--preset", "tiny", "--block-size", "4096"], "--block-size must be between 2 and the preset's context (128)"),
    ):
        result = cli("bench", "lora", *args)
        assert result.code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)


def test_sigterm_ends_a_bench_through_its_cleanup(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    process = subprocess.Popen(
        [sys.executable, "-m", "tfcli", "bench", "tokenize", "--size-mb", "20", "--repeat", "3"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("tfcli-bench-*")) and time.monotonic() < deadline:  # it has made its scratch folder
        time.sleep(0.05)
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert not list(tmp_path.glob("tfcli-bench-*")) and "Traceback" not in err
