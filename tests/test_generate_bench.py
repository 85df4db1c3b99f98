"""`tfcli bench generate` measures tfcli with and without its cache beside transformers on the same weights
(speed is reported, never asserted)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # the real commands end to end; `-m "not slow"` skips them


def test_bench_generate_compares_with_transformers_on_the_same_weights(cli, tmp_path):
    pytest.importorskip("transformers")
    result = cli(
        "bench",
        "generate",
        "--preset",
        "tiny",
        "--repeat",
        "1",
        "--prompt-tokens",
        "4",
        "--new-tokens",
        "12",
        "--threads",
        "1",
        "--workdir",
        tmp_path,
        "--no-first-run",  # the plumbing, not the timing, is tested here (the model bench runs the untimed first run)
        "--skip-compiled",  # compiling takes tens of seconds: tests/test_compiled_step.py holds the compiled step
        "--json",
    )
    assert result.code == 0, result.stderr
    (bench,) = json.loads(result.stdout)["benches"]
    jobs = {r["job"]: r for r in bench["results"]}
    assert set(jobs) == {"tfcli", "transformers", "tfcli-no-cache"}
    assert all(r["new_tokens"] == 12 and r["seconds"] > 0 for r in jobs.values())
    assert bench["same_tokens"] is True  # greedy on the same weights: the same ids on both sides
    assert jobs["tfcli"]["first_tokens"] == jobs["tfcli-no-cache"]["first_tokens"]
    assert bench["bandwidth_gb_s"] > 0 and bench["floor_ms_per_token"] > 0
    assert jobs["tfcli"]["floor_ratio"] == pytest.approx(bench["time_per_token_vs_floor"], rel=1e-3) and bench["time_per_token_vs_floor"] > 0
    assert jobs["tfcli"]["bandwidth_gb_s"] == pytest.approx(bench["bandwidth_gb_s"], rel=1e-3) and jobs["transformers"]["bandwidth_gb_s"] == 0
    assert bench["speedup_vs_transformers"] > 0 and bench["speedup_vs_no_cache"] > 0
    # what decoded tfcli's row: the step `tfcli generate` would choose for this model on this machine
    assert jobs["tfcli"]["kernel"].startswith(("tfcli's C decoder step", "PyTorch's step")) and jobs["transformers"]["kernel"] == ""


def test_bench_generate_bad_options(cli):
    assert "cannot be built as GPT-2" in cli("bench", "generate", "--preset", "seq2seq-tiny", "--repeat", "1").stderr
    assert cli("bench", "generate", "--repeat", "0").code == 2
    assert "decodes at most 8,192" in cli("bench", "generate", "--prompt-tokens", "100000").stderr


def test_a_workers_user_error_comes_back_as_one(tmp_path):
    from tfcli.bench.common import run_worker
    from tfcli.errors import TfcliError

    with pytest.raises(TfcliError, match="unknown preset 'nope'"):
        run_worker("tfcli.bench.generate", ["prepare", str(tmp_path), "nope", "16", "256"])
