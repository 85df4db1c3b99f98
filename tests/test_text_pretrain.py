"""`train pretrain --data TEXT`: a tokenizer sized to the text and its shards made in RUN/data/, the quickstart's
settings as defaults under what the user says; `quickstart --data DIR` without reviews.jsonl skips the classifier."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import TINY_TEXT
from tests.training import TINY_MODEL
from tfcli.train.text_data import MAX_VOCAB, MIN_VOCAB, TEXT_DEFAULTS, text_defaults, vocab_for
from tfcli.training_config import EARLY_STOP_DEFAULT


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
    assert TEXT_DEFAULTS["early_stop"] == EARLY_STOP_DEFAULT and "early_stop" not in text_defaults({"early_stop": 0}, None, [])  # --early-stop 0: off


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
    other = tmp_path / "other.txt"  # --resume with other text once went on with the kept shards, silently
    other.write_text(TINY_TEXT * 41, encoding="utf-8")
    refused = cli("train", "pretrain", "--data", other, *args[4 : -len(TINY_MODEL)], "--max-steps", "6", *TINY_MODEL, "--resume")
    assert refused.code == 2 and f"cannot resume: {run} trains on the text it encoded from {notes} (" in refused.stderr, refused.stderr
    with notes.open("a", encoding="utf-8") as grown:
        grown.write("One more line.\n")
    assert cli(*args[: -len(TINY_MODEL)], "--max-steps", "6", *TINY_MODEL, "--resume").code == 2
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 5


def test_a_small_text_stops_early_and_best_keeps_the_lowest_validation_loss(cli, tmp_path):
    """The one-command text path stops by default once EARLY_STOP_DEFAULT evaluations in a row find no lower
    validation loss: a text this small is learned by heart well before 600 steps."""
    patience = EARLY_STOP_DEFAULT
    notes = tmp_path / "notes.txt"
    notes.write_text(TINY_TEXT * 40, encoding="utf-8")
    run = tmp_path / "run"
    args = ["--max-steps", "600", "--block-size", "32", "--batch-size", "8", "--eval-every", "10", "--set", "eval_batches=2", "--save-every", "0"]
    result = cli("train", "pretrain", "--data", notes, "-o", run, *args, *TINY_MODEL)
    assert result.code == 0, result.stderr
    assert f"early_stop {patience}" in result.stderr  # among the settings the text path chose
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    best_step, best = min(evaluated, key=lambda e: (e[1], e[0]))
    stop = records[-1]["step"]
    after_best = [step for step, _ in evaluated if step > best_step]
    assert stop < 600 and after_best == [best_step + 10 * n for n in range(1, patience + 1)] and after_best[-1] == stop
    said = re.search(rf"stopped early: the validation loss did not improve for {patience} evaluations \(best ([0-9.]+) at step (\d+)\)", result.stdout)
    assert said is not None, result.stdout
    assert int(said[2]) == best_step and float(said[1]) == pytest.approx(best, rel=1e-3)
    kept = json.loads((run / "best" / "config.json").read_text())["training"]
    assert kept["val_loss"] == best and kept["step"] == best_step  # best/ is the lowest validation loss seen
    assert json.loads((run / "trainer" / "state.json").read_text())["evals_since_best"] == patience
    again = cli("train", "pretrain", "--data", notes, "-o", run, *args, *TINY_MODEL, "--resume")
    assert again.code == 0 and "the run stopped early at step" in again.stderr and "--early-stop" in again.stderr, again.stderr
    assert json.loads((run / "trainer" / "state.json").read_text())["step"] == stop


def test_quickstart_skips_the_classifier_without_reviews(cli, tmp_path):
    (tmp_path / "mine" / "corpus").mkdir(parents=True)
    (tmp_path / "mine" / "corpus" / "notes.txt").write_text(TINY_TEXT * 200, encoding="utf-8")
    result = cli("quickstart", "--data", tmp_path / "mine", "-o", tmp_path / "qs", "--steps", "2")
    assert result.code == 0, result.stderr
    assert "skipped classifier" in result.stdout and "has no reviews.jsonl" in result.stdout
    assert (tmp_path / "qs" / "model" / "model.safetensors").is_file() and not (tmp_path / "qs" / "classifier").exists()
    assert "--classify" not in result.stdout
