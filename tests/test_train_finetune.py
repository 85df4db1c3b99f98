"""`tfcli train finetune` (classification, sequence-to-sequence, continued LM) and `tfcli eval`."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TINY_TEXT
from tests.training import pretrain_args, records, weights


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
    from tfcli.rundir import read_run_config

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
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

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
