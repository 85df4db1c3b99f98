"""End to end: `tfcli quickstart` chains the real commands on sample_data/, idempotently."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SAMPLE_DATA
from tfcli.data.shards import load_shard_meta, open_shard
from tfcli.rundir import read_run_config
from tfcli.tokenizer.core import TextTokenizer

pytestmark = pytest.mark.slow  # the real commands end to end; `-m "not slow"` skips them

QUICK = ("--steps", "4", "--classifier-steps", "4")


@pytest.fixture(scope="module")
def quick_chain(tmp_path_factory):
    """One short quickstart, made once for the module (a tokenizer over the whole corpus is most of its
    time) in this process, as the `cli` fixture runs a command; each test copies what it needs. Returns
    the folder and what the command printed."""
    from tfcli.cli.app import main

    out = tmp_path_factory.mktemp("quick") / "qs"
    printed, said = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(said):
        try:
            main(["quickstart", "-o", str(out), "--data", str(SAMPLE_DATA), *QUICK])
        except SystemExit as ended:
            code = ended.code
    assert code in (0, None), said.getvalue()
    return out, printed.getvalue()


def copied(chain: Path, to: Path, parts: tuple[str, ...] = ("tokenizer", "shards", "model", "classifier")) -> Path:
    for part in parts:
        shutil.copytree(chain / part, to / part)
    return to


def test_quickstart_runs_the_chain_then_keeps_it(cli, tmp_path, quick_chain):
    chain, printed = quick_chain
    assert printed.count("made ") == 4 and "next:" in printed
    out = copied(chain, tmp_path / "qs")
    assert (out / "model" / "model.safetensors").is_file() and (out / "classifier" / "loss.png").is_file()

    tokenizer = TextTokenizer.load(out / "tokenizer")
    meta = load_shard_meta(out / "shards")
    assert meta.tokenizer_sha256 == tokenizer.sha256 and meta.val_documents > 0
    train = np.asarray(open_shard(out / "shards", "train"))
    first_doc = train[: int(np.argmax(train == meta.eos_id))].tolist()
    stories = (SAMPLE_DATA / "corpus" / "stories.txt").read_text(encoding="utf-8").split("\n\n")
    assert tokenizer.decode(first_doc) in stories

    stamp = (out / "shards" / "train.bin").stat().st_mtime_ns
    model_stamp = (out / "model" / "model.safetensors").stat().st_mtime_ns
    second = cli("quickstart", "-o", out, "--data", SAMPLE_DATA, *QUICK)
    assert second.code == 0 and second.stdout.count("kept ") == 4
    assert (out / "shards" / "train.bin").stat().st_mtime_ns == stamp
    assert (out / "model" / "model.safetensors").stat().st_mtime_ns == model_stamp

    forced = cli("quickstart", "-o", out, "--data", SAMPLE_DATA, "--force", *QUICK)
    assert forced.code == 0 and forced.stdout.count("made ") == 4
    assert TextTokenizer.load(out / "tokenizer").sha256 == tokenizer.sha256  # training is deterministic


def test_quickstart_remakes_shards_when_the_tokenizer_changed(cli, tmp_path, quick_chain):
    out = copied(quick_chain[0], tmp_path / "qs")
    assert cli("tokenize", "train", SAMPLE_DATA / "corpus", "-o", out / "tokenizer", "--vocab-size", "600").code == 0
    again = cli("quickstart", "-o", out, "--data", SAMPLE_DATA, *QUICK)
    said = " ".join(again.stdout.split())
    assert "kept tokenizer" in said and "made shards" in said and "made model" in said and "made classifier" in said
    assert load_shard_meta(out / "shards").vocab_size == 600
    assert json.loads((out / "model" / "config.json").read_text())["model"]["vocab_size"] == 600


def test_quickstart_without_sample_data(cli, tmp_path):
    result = cli("quickstart", "-o", tmp_path / "qs", "--data", tmp_path / "nowhere")
    assert result.code == 2 and "no corpus/ folder" in result.stderr


def test_quickstart_learns_the_stories_and_the_reviews(cli, tmp_path, quick_chain):
    """Quality, on a shortened schedule: the decoder's validation loss ends well below the unigram
    entropy of the shards, and the classifier well above the majority-class baseline. (The tokenizer and
    shards are the module's: the quickstart keeps them and trains both models.)"""
    from tfcli.quickstart import majority_baseline
    from tfcli.train.evaluate import unigram_entropy
    from tfcli.train.state import read_metrics

    out = copied(quick_chain[0], tmp_path / "qs", ("tokenizer", "shards"))
    result = cli("quickstart", "-o", out, "--data", SAMPLE_DATA, "--steps", "60", "--classifier-steps", "150")
    assert result.code == 0, result.stderr
    val_loss = [r["val_loss"] for r in read_metrics(out / "model" / "metrics.jsonl") if "val_loss" in r][-1]
    entropy = unigram_entropy(out / "shards")
    assert val_loss < entropy - 1.0
    accuracy = [r["val_accuracy"] for r in read_metrics(out / "classifier" / "metrics.jsonl") if "val_accuracy" in r][-1]
    baseline = majority_baseline(out / "classifier")
    assert 0.4 < baseline < 0.6 and accuracy > baseline + 0.25
    said = " ".join(result.stdout.split())
    assert f"{entropy:.3f}" in said and f"{val_loss:.3f}" in said and f"{baseline:.1%}" in said


def test_a_shorter_quickstart_keeps_the_longer_runs_and_says_so(cli, tmp_path, quick_chain):
    """look-inside.md's `quickstart --steps 60 --classifier-steps 20` after a full quickstart: the better model
    and classifier stay, and the lines say why; asking for more steps trains anew and says that."""
    out = copied(quick_chain[0], tmp_path / "qs")
    model_stamp = (out / "model" / "model.safetensors").stat().st_mtime_ns
    classifier_stamp = (out / "classifier" / "model.safetensors").stat().st_mtime_ns
    shorter = cli("quickstart", "-o", out, "--data", SAMPLE_DATA, "--steps", "2", "--classifier-steps", "2")
    said = " ".join(shorter.stdout.split())
    assert shorter.code == 0 and "made " not in said, said
    assert "kept model" in said and "(it trained 4 steps; --steps 2 asks fewer: --force trains it again)" in said
    assert "kept classifier" in said
    assert (out / "model" / "model.safetensors").stat().st_mtime_ns == model_stamp
    assert (out / "classifier" / "model.safetensors").stat().st_mtime_ns == classifier_stamp

    longer = cli("quickstart", "-o", out, "--data", SAMPLE_DATA, "--steps", "5", "--classifier-steps", "4")
    said = " ".join(longer.stdout.split())
    assert longer.code == 0 and "made model" in said and "(the one there trained 4 steps; --steps 5 asks more)" in said
    assert "made classifier" in said  # on the new model
    assert "training model: " in longer.stderr and "5 steps" in longer.stderr  # off a terminal too, it says what it trains
    assert read_run_config(out / "model").training["step"] == 5
