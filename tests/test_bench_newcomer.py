"""A bench whose peer is not installed stops before any work, in one line that says what to install (the same
shape for every bench); the tokenize bench says when tfcli's faster encoder is missing."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import SAMPLE_DATA


@pytest.fixture
def run_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")  # what the serve bench looks for before its peer
    return run


@pytest.mark.parametrize(
    "missing, args, install",
    [
        ("transformers", ["bench", "model", "--preset", "tiny"], "pip install 'tfcli[hf]'"),
        ("transformers", ["bench", "train", "--presets", "tiny"], "pip install 'tfcli[hf]'"),
        ("transformers", ["bench", "generate", "--preset", "tiny"], "pip install 'tfcli[hf]'"),
        ("llama_cpp", ["bench", "generate", "--preset", "tiny", "--against", "llama.cpp"], "pip install llama-cpp-python"),
        ("lm_eval", ["bench", "eval", "RUN"], "pip install 'tfcli[eval]'"),
        ("sae_lens", ["bench", "sae", "RUN", "--hook", "blocks.0.hook_resid_post", "--data", "RUN"], "pip install 'tfcli[sae]'"),
        ("gensim", ["bench", "word2vec"], "pip install 'tfcli[word2vec]'"),
        ("fastapi", ["bench", "serve", "RUN"], "pip install 'tfcli[serve]'"),
    ],
)
def test_a_bench_without_its_peer_says_what_to_install(cli, monkeypatch, run_folder, missing, args, install):
    monkeypatch.setitem(sys.modules, missing, None)  # as Python's import treats a module it cannot find
    result = cli(*[str(run_folder) if a == "RUN" else a for a in args])
    assert result.code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ") and "not installed" in result.stderr
    assert result.stderr.rstrip().endswith(install) and result.stdout == ""


@pytest.mark.slow  # runs the bench's four jobs
def test_bench_tokenize_says_when_tiktoken_is_missing(cli, monkeypatch, tmp_path):
    hidden = tmp_path / "hidden" / "tiktoken"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", str(hidden.parent))  # the bench's jobs, each a process of its own
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # and this one
    args = ["bench", "tokenize", "--size-mb", "0.1", "--repeat", "1", "--data", SAMPLE_DATA]
    table = cli(*args)
    assert table.code == 0, table.stderr
    assert "tiktoken is not installed, so tfcli encoded with tokenizers (target >= 0.90); pip install tiktoken" in table.stdout
    measured = json.loads(cli(*args, "--json").stdout)
    assert {m["job"]: m for m in measured["measurements"]}["encode_tfcli"]["encoder"] == "tokenizers"
