"""`train pretrain --data TEXT`: a tokenizer sized to the text and its shards made in RUN/data/, the quickstart's
settings as defaults under what the user says; `quickstart --data DIR` without reviews.jsonl skips the classifier."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TINY_TEXT
from tests.training import TINY_MODEL
from tfcli.train.text_data import MAX_VOCAB, MIN_VOCAB, TEXT_DEFAULTS, text_defaults, vocab_for


@pytest.mark.parametrize(
    ("size", "vocab"), [(1_000, MIN_VOCAB), (100_000, 4096), (500_329, 4096), (1_400_000, 4096), (2_000_000, 8192), (10_000_000, MAX_VOCAB)]
)
def test_the_vocabulary_grows_with_the_text(size, vocab):
    chosen, why = vocab_for(size)
    assert chosen == vocab and f"{vocab:,} tokens asked" in why and f"{size:,} bytes" in why


def test_what_the_user_says_wins_over_the_defaults(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[train]\nbatch_size = 8\n")
    added = text_defaults({"lr": 1e-3}, config, ["train.eval_every=5"])
    assert added == {k: v for k, v in TEXT_DEFAULTS.items() if k not in ("lr", "batch_size", "eval_every")}
    assert "max_steps" not in text_defaults({"time_budget": 60.0}, None, [])


def test_text_trains_in_one_command(cli, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text(TINY_TEXT * 40, encoding="utf-8")
    run = tmp_path / "run"
    args = ["train", "pretrain", "--data", notes, "-o", run, "--max-steps", "3", "--block-size", "32", "--batch-size", "4", *TINY_MODEL]
    result = cli(*args)
    assert result.code == 0, result.stderr
    assert "4,096 tokens asked" in result.stderr and "the floor for small texts" in result.stderr and "it learned" in result.stderr
    assert "settings" in result.stderr and "lr 0.003" in result.stderr
    config = json.loads((run / "config.json").read_text())
    assert config["training"]["config"]["lr"] == TEXT_DEFAULTS["lr"] and config["training"]["config"]["batch_size"] == 4
    assert (run / "data" / "shards" / "meta.json").is_file() and (run / "data" / "tokenizer" / "tokenizer.json").is_file()
    again = cli(*args[: -len(TINY_MODEL)], "--max-steps", "5", *TINY_MODEL, "--resume")
    assert again.code == 0, again.stderr
    assert "kept" in again.stderr and json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 5


def test_quickstart_skips_the_classifier_without_reviews(cli, tmp_path):
    (tmp_path / "mine" / "corpus").mkdir(parents=True)
    (tmp_path / "mine" / "corpus" / "notes.txt").write_text(TINY_TEXT * 200, encoding="utf-8")
    result = cli("quickstart", "--data", tmp_path / "mine", "-o", tmp_path / "qs", "--steps", "2")
    assert result.code == 0, result.stderr
    assert "skipped classifier" in result.stdout and "has no reviews.jsonl" in result.stdout
    assert (tmp_path / "qs" / "model" / "model.safetensors").is_file() and not (tmp_path / "qs" / "classifier").exists()
    assert "--classify" not in result.stdout
