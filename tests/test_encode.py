"""`tokenize encode`: the shard format of DESIGN.md, the seeded split by document, uint32 vocabularies,
bounded batches, and failures that leave earlier shards intact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import snapshot
from tfcli.corpus.reader import resolve_corpus
from tfcli.data.shards import META_FILE, ShardMeta, encode_corpus, load_shard_meta, open_shard, shard_dtype_name
from tfcli.errors import TfcliError
from tfcli.tokenizer.core import TextTokenizer

DOCS = [f"Story {i}: the fox met a bird <|endoftext|> near tree {i * 7}." for i in range(60)]


@pytest.fixture
def docs_file(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("\n\n".join(DOCS) + "\n")
    return path


def _documents(ids: np.ndarray, eos: int) -> list[list[int]]:
    docs, current = [], []
    for token in ids.tolist():
        if token == eos:
            docs.append(current)
            current = []
        else:
            current.append(token)
    assert current == []  # every document ends with the end-of-text id
    return docs


def test_cli_encode_writes_the_shard_format(cli, docs_file, trained_tokenizer, tmp_path):
    out = tmp_path / "shards"
    result = cli("tokenize", "encode", docs_file, "-t", trained_tokenizer, "-o", out, "--val-fraction", "0.2", "--json")
    assert result.code == 0, result.stderr
    meta = ShardMeta.load(out / META_FILE)
    tokenizer = TextTokenizer.load(trained_tokenizer)
    assert meta.dtype == "uint16" and meta.vocab_size == tokenizer.vocab_size
    assert meta.tokenizer_sha256 == tokenizer.sha256 and meta.eos_id == tokenizer.special_ids["eos"]
    assert meta.sources[0].bytes == docs_file.stat().st_size
    assert (out / "train.bin").stat().st_size == meta.train_tokens * 2
    train = _documents(np.fromfile(out / "train.bin", dtype="<u2"), meta.eos_id)
    val = _documents(np.fromfile(out / "val.bin", dtype="<u2"), meta.eos_id)
    assert len(train) == meta.train_documents and len(val) == meta.val_documents
    assert len(train) + len(val) == len(DOCS) and 0 < len(val) < len(DOCS)
    decoded = sorted(tokenizer.decode(d) for d in train + val)
    assert decoded == sorted(DOCS)  # the literal <|endoftext|> in the text came back as text
    assert json.loads(result.stdout)["train_tokens"] == meta.train_tokens

    table = cli("tokenize", "encode", docs_file, "-t", trained_tokenizer, "-o", out)
    assert table.code == 0 and "train" in table.stdout and "tokens" in table.stdout


def test_split_is_deterministic_with_the_seed(docs_file, trained_tokenizer, tmp_path):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    corpus = resolve_corpus([docs_file])
    encode_corpus(corpus, tokenizer, tmp_path / "a", val_fraction=0.3, seed=1)
    encode_corpus(corpus, tokenizer, tmp_path / "b", val_fraction=0.3, seed=1)
    encode_corpus(corpus, tokenizer, tmp_path / "c", val_fraction=0.3, seed=2)
    assert (tmp_path / "a" / "val.bin").read_bytes() == (tmp_path / "b" / "val.bin").read_bytes()
    assert (tmp_path / "a" / "val.bin").read_bytes() != (tmp_path / "c" / "val.bin").read_bytes()


def test_training_finds_the_tokenizer_the_shards_were_encoded_with(docs_file, trained_tokenizer, tmp_path):
    import shutil

    from tfcli.train.job import find_tokenizer

    tok = tmp_path / "somewhere" / "tok"  # not a folder named "tokenizer" beside the shards
    shutil.copytree(trained_tokenizer, tok)
    meta = encode_corpus(resolve_corpus([docs_file]), TextTokenizer.load(tok), tmp_path / "runs" / "shards", val_fraction=0.2)
    assert meta.tokenizer_path == str((tok / "tokenizer.json").resolve())
    assert find_tokenizer(tmp_path / "runs" / "shards", None).sha256 == meta.tokenizer_sha256
    (tok / "tokenizer.json").unlink()
    with pytest.raises(TfcliError, match="cannot find the tokenizer"):
        find_tokenizer(tmp_path / "runs" / "shards", None)


def test_no_validation_split(docs_file, trained_tokenizer, tmp_path):
    meta = encode_corpus(resolve_corpus([docs_file]), TextTokenizer.load(trained_tokenizer), tmp_path / "s", val_fraction=0.0)
    assert meta.val_tokens == 0 and meta.val_documents == 0 and meta.train_documents == len(DOCS)
    assert open_shard(tmp_path / "s", "val").size == 0


def test_open_shard_memory_maps(docs_file, trained_tokenizer, tmp_path):
    meta = encode_corpus(resolve_corpus([docs_file]), TextTokenizer.load(trained_tokenizer), tmp_path / "s")
    train = open_shard(tmp_path / "s", "train")
    assert isinstance(train, np.memmap) and train.size == meta.train_tokens


def test_uint32_vocabulary(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for i in range(70_000 - len(vocab)):
        vocab[f"filler{i}"] = len(vocab)
    vocab["th"] = len(vocab)
    hf = Tokenizer(models.BPE(vocab=vocab, merges=[("t", "h")]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(["<|endoftext|>"])
    (tmp_path / "tok").mkdir()
    hf.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "c.txt").write_text("the thin\n\nthat moth\n")

    tokenizer = TextTokenizer.load(tmp_path / "tok")
    assert tokenizer.special_ids["eos"] > 65_535
    meta = encode_corpus(resolve_corpus([tmp_path / "c.txt"]), tokenizer, tmp_path / "s", val_fraction=0.0)
    assert meta.dtype == "uint32"
    ids = open_shard(tmp_path / "s", "train")
    assert ids.dtype == np.dtype("<u4") and vocab["th"] in ids.tolist() and meta.eos_id in ids.tolist()
    assert tokenizer.decode([i for i in ids.tolist() if i != meta.eos_id]) == "the thinthat moth"


@pytest.mark.parametrize("vocab, dtype", [(300, "uint16"), (65_536, "uint16"), (65_537, "uint32")])
def test_shard_dtype(vocab, dtype):
    assert shard_dtype_name(vocab) == dtype


@pytest.mark.parametrize("encoder", ["tokenizers", "tiktoken"])
def test_batches_stay_bounded_however_large_the_corpus(tmp_path, trained_tokenizer, monkeypatch, encoder):
    import tfcli.data.shards as shards
    from tfcli.tokenizer.fast import ENCODER_ENV, FastEncoder

    if encoder == "tiktoken":
        pytest.importorskip("tiktoken")
    monkeypatch.setenv(ENCODER_ENV, encoder)
    monkeypatch.setattr(shards, "BATCH_CHARS", 20_000)
    path = tmp_path / "big.txt"
    path.write_text(("a line of text for the fox " * 30 + "\n") * 2000 + "x " * 300_000)  # and one huge line
    tokenizer = TextTokenizer.load(trained_tokenizer)
    sizes = []
    spied = FastEncoder if encoder == "tiktoken" else TextTokenizer
    original = spied.encode_batch

    def spy(self, texts):
        sizes.append(sum(map(len, texts)))
        return original(self, texts)

    monkeypatch.setattr(spied, "encode_batch", spy)
    meta = encode_corpus(resolve_corpus([path]), tokenizer, tmp_path / "s", val_fraction=0.0)
    assert meta.encoder == encoder
    assert len(sizes) >= 20  # ~1.9 MB of text
    assert max(sizes) <= 20_000 + (1 << 16)
    assert meta.train_documents == 1 and meta.train_tokens > 300_000


def test_invalid_utf8_is_reported_in_meta(cli, tmp_path, trained_tokenizer):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine text\n\nbroken \xff\xfe\xfd text\n")
    result = cli("tokenize", "encode", path, "-t", trained_tokenizer, "-o", tmp_path / "s", "--val-fraction", "0")
    assert result.code == 0, result.stderr
    assert "invalid UTF-8" in result.stdout
    meta = load_shard_meta(tmp_path / "s")
    assert meta.invalid_utf8_bytes == 3 and meta.invalid_utf8_files == 1


def test_failures_keep_earlier_shards(cli, docs_file, trained_tokenizer, tmp_path):
    out = tmp_path / "s"
    assert cli("tokenize", "encode", docs_file, "-t", trained_tokenizer, "-o", out).code == 0
    before = snapshot(out)
    (tmp_path / "empty.txt").write_text("\n\n")
    cases = [
        ([tmp_path / "empty.txt", "-t", trained_tokenizer], "empty"),
        ([docs_file, "-t", tmp_path / "nope.json"], "does not exist"),
        ([docs_file, "-t", docs_file], "is not a tokenizer.json"),
        ([docs_file, "-t", trained_tokenizer, "--val-fraction", "1.5"], "--val-fraction"),
        ([docs_file, "-t", trained_tokenizer, "--documents", "sentence"], "unknown --documents"),
    ]
    for args, message in cases:
        result = cli("tokenize", "encode", *args, "-o", out)
        assert result.code == 2 and message in result.stderr, (args, result.stderr)
        assert snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_meta_that_does_not_match_the_files_is_refused(docs_file, trained_tokenizer, tmp_path):
    encode_corpus(resolve_corpus([docs_file]), TextTokenizer.load(trained_tokenizer), tmp_path / "s")
    with open(tmp_path / "s" / "train.bin", "ab") as handle:
        handle.write(b"\x00\x00")
    with pytest.raises(TfcliError, match="promises"):
        load_shard_meta(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / META_FILE).read_text())
    meta["surprise"] = 1
    (tmp_path / "s" / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(TfcliError, match="unknown key 'surprise'"):
        load_shard_meta(tmp_path / "s")


def test_tokenizer_without_end_of_text(tmp_path, docs_file):
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TfcliError, match="has no eos token"):
        encode_corpus(resolve_corpus([docs_file]), TextTokenizer.load(tmp_path / "tokenizer.json"), tmp_path / "s")
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())


def test_output_that_is_a_file(cli, docs_file, trained_tokenizer, tmp_path):
    (tmp_path / "taken").write_text("keep")
    result = cli("tokenize", "encode", docs_file, "-t", trained_tokenizer, "-o", tmp_path / "taken")
    assert result.code == 2 and "is a file" in result.stderr
    assert (tmp_path / "taken").read_text() == "keep"
