"""End to end: `tfcli quickstart` chains the real commands on sample_data/, idempotently."""

from __future__ import annotations

import numpy as np

from tests.conftest import SAMPLE_DATA
from tfcli.data.shards import load_shard_meta, open_shard
from tfcli.tokenizer.core import TextTokenizer


def test_quickstart_runs_the_chain_then_keeps_it(cli, tmp_path):
    out = tmp_path / "qs"
    first = cli("quickstart", "-o", out, "--data", SAMPLE_DATA)
    assert first.code == 0, first.stderr
    assert first.stdout.count("made ") == 2 and "next:" in first.stdout

    tokenizer = TextTokenizer.load(out / "tokenizer")
    meta = load_shard_meta(out / "shards")
    assert meta.tokenizer_sha256 == tokenizer.sha256 and meta.val_documents > 0
    train = np.asarray(open_shard(out / "shards", "train"))
    first_doc = train[: int(np.argmax(train == meta.eos_id))].tolist()
    stories = (SAMPLE_DATA / "corpus" / "stories.txt").read_text(encoding="utf-8").split("\n\n")
    assert tokenizer.decode(first_doc) in stories

    stamp = (out / "shards" / "train.bin").stat().st_mtime_ns
    second = cli("quickstart", "-o", out, "--data", SAMPLE_DATA)
    assert second.code == 0 and second.stdout.count("kept ") == 2
    assert (out / "shards" / "train.bin").stat().st_mtime_ns == stamp

    forced = cli("quickstart", "-o", out, "--data", SAMPLE_DATA, "--force")
    assert forced.code == 0 and forced.stdout.count("made ") == 2
    assert TextTokenizer.load(out / "tokenizer").sha256 == tokenizer.sha256  # training is deterministic


def test_quickstart_remakes_shards_when_the_tokenizer_changed(cli, tmp_path):
    out = tmp_path / "qs"
    assert cli("quickstart", "-o", out, "--data", SAMPLE_DATA).code == 0
    assert cli("tokenize", "train", SAMPLE_DATA / "corpus", "-o", out / "tokenizer", "--vocab-size", "600").code == 0
    again = cli("quickstart", "-o", out, "--data", SAMPLE_DATA)
    assert "kept tokenizer" in " ".join(again.stdout.split()) and "made shards" in " ".join(again.stdout.split())
    assert load_shard_meta(out / "shards").vocab_size == 600


def test_quickstart_without_sample_data(cli, tmp_path):
    result = cli("quickstart", "-o", tmp_path / "qs", "--data", tmp_path / "nowhere")
    assert result.code == 2 and "no corpus/ folder" in result.stderr
