"""`tokenize train`: the artifact loads in tokenizers and transformers, special text stays text,
decode(encode(x)) == x, and every bad input is a clear error that leaves disk as it was."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import snapshot
from tfcli.corpus.reader import resolve_corpus
from tfcli.errors import TfcliError
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.specials import DEFAULT_SPECIALS, parse_special_tokens
from tfcli.tokenizer.train import train_tokenizer
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

SAMPLE = 'The fox saw 3 apples. "Hi!" said Zoë at the café 🦊 — 東京\n  indented line\n'


def test_cli_train_writes_both_files_and_a_summary(cli, tiny_corpus, tmp_path):
    out = tmp_path / "tok"
    result = cli("tokenize", "train", tiny_corpus, "-o", out, "--vocab-size", "300", "--json")
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["vocab_size"] == 300
    assert summary["merges"] == 300 - 256 - 5
    assert summary["alphabet_size"] == 256
    assert summary["bytes_per_token"] > 1.0
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()

    table = cli("tokenize", "train", tiny_corpus, "-o", out, "--vocab-size", "300")
    assert table.code == 0
    for label in ("vocab size", "merges", "alphabet", "bytes per token", "time"):
        assert label in table.stdout
    assert "1 file," in table.stdout  # tiny_corpus is one file


def test_counted_says_one_and_many():
    from tfcli.cli.common import counted

    assert (counted(1, "file"), counted(0, "file"), counted(2048, "binary file")) == ("1 file", "0 files", "2,048 binary files")
    assert (counted(1, "process", "processes"), counted(2, "process", "processes")) == ("1 process", "2 processes")


def test_loads_unchanged_with_tokenizers(trained_tokenizer):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(trained_tokenizer / "tokenizer.json"))
    ours = TextTokenizer.load(trained_tokenizer)
    assert raw.encode(SAMPLE, add_special_tokens=False).ids == ours.encode(SAMPLE)
    assert ours.special_ids == {role: i for i, role in enumerate(["eos", "pad", "unk", "mask", "cls"])}


def test_transformers_fast_tokenizer_gives_the_same_ids(trained_tokenizer):
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(trained_tokenizer / "tokenizer.json"))
    ours = TextTokenizer.load(trained_tokenizer)
    assert fast(SAMPLE, add_special_tokens=False)["input_ids"] == ours.encode(SAMPLE)


def test_auto_tokenizer_knows_the_special_tokens(trained_tokenizer):
    transformers = pytest.importorskip("transformers")
    auto = transformers.AutoTokenizer.from_pretrained(str(trained_tokenizer))
    assert auto.eos_token == DEFAULT_SPECIALS["eos"] and auto.eos_token_id == 0
    assert auto.pad_token_id == 1 and auto.unk_token_id == 2 and auto.mask_token_id == 3 and auto.cls_token_id == 4
    assert auto.model_max_length == 1024
    text = f"before {DEFAULT_SPECIALS['eos']} after"
    assert auto(text, add_special_tokens=False)["input_ids"] == TextTokenizer.load(trained_tokenizer).encode(text)


@pytest.mark.parametrize("token", list(DEFAULT_SPECIALS.values()))
def test_special_token_text_in_user_text_stays_text(trained_tokenizer, token):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    ids = tokenizer.encode(f"a {token} b{token}")
    assert not set(ids) & set(tokenizer.special_ids.values())
    assert tokenizer.decode(ids) == f"a {token} b{token}"
    assert tokenizer.encode_batch([token])[0] == tokenizer.encode(token)


def test_special_token_text_in_the_training_corpus_stays_text(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello <|endoftext|> world <|pad|>\n" * 50)
    train_tokenizer(resolve_corpus([corpus]), tmp_path / "tok", TokenizerTrainingConfig(vocab_size=300))
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    assert tokenizer.special_ids["eos"] not in tokenizer.encode(corpus.read_text())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.text(max_size=200),
        st.text(alphabet=st.sampled_from(" \n\t😀🦊東京é<|>endoftx"), max_size=100),
        st.just(""),
        st.just("   leading spaces"),
    )
)
def test_byte_level_round_trip(trained_tokenizer, text):
    tokenizer = _cached(trained_tokenizer)
    expected = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace") if _has_surrogate(text) else text
    assert tokenizer.decode(tokenizer.encode(text)) == expected.replace("\ud800", "\ufffd")


def test_lone_surrogates_are_replaced(trained_tokenizer):
    tokenizer = _cached(trained_tokenizer)
    assert tokenizer.decode(tokenizer.encode("a\ud800b\udfffc")) == "a\ufffdb\ufffdc"


_loaded: dict = {}


def _cached(path):
    if path not in _loaded:
        _loaded[path] = TextTokenizer.load(path)
    return _loaded[path]


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


@pytest.mark.parametrize("kind", ["whitespace", "metaspace"])
def test_other_pre_tokenizers(tiny_corpus, tmp_path, kind):
    summary = train_tokenizer(resolve_corpus([tiny_corpus]), tmp_path / kind, TokenizerTrainingConfig(vocab_size=200, pre_tokenizer=kind))
    tokenizer = TextTokenizer.load(tmp_path / kind)
    assert tokenizer.pre_tokenizer_kind == kind
    assert summary.vocab_size <= 200 and summary.merges > 0
    text = "The fox was happy."
    decoded = tokenizer.decode(tokenizer.encode(text))
    assert decoded.split() == (["The", "fox", "was", "happy", "."] if kind == "whitespace" else text.split())


def test_lowercase_and_limit_alphabet(tiny_corpus, tmp_path):
    config = TokenizerTrainingConfig(vocab_size=120, pre_tokenizer="metaspace", lowercase=True, limit_alphabet=20)
    summary = train_tokenizer(resolve_corpus([tiny_corpus]), tmp_path / "tok", config)
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    assert tokenizer.encode("THE FOX") == tokenizer.encode("the fox")
    assert summary.alphabet_size <= 20
    assert tokenizer.special_ids["unk"] in tokenizer.encode("🦊")  # cut from the alphabet: unknown


def test_custom_special_tokens(tiny_corpus, tmp_path):
    specials = parse_special_tokens(["eos=</s>", "<|user|>"])
    train_tokenizer(resolve_corpus([tiny_corpus]), tmp_path / "tok", TokenizerTrainingConfig(vocab_size=300, special_tokens=specials))
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    assert tokenizer.special_ids["eos"] == tokenizer.hf.token_to_id("</s>") == 0
    assert tokenizer.hf.token_to_id("<|user|>") == 5
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "</s>" and config["additional_special_tokens"] == ["<|user|>"]


@pytest.mark.parametrize(
    "specs, message",
    [
        (["eos="], "has no text"),
        (["role=x"], "unknown special-token role"),
        (["eos=<|pad|>"], "share the token"),
        (["<x>", "<x>"], "given twice"),
        (["|"], "is a single character"),  # it would take over every "|" in ordinary text
        (["sep=#"], "unknown special-token role"),
        (["eos=#"], "is a single character"),
    ],
)
def test_bad_special_tokens(specs, message):
    with pytest.raises(TfcliError, match=message):
        parse_special_tokens(specs)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--vocab-size", "100"], "smaller than the byte alphabet"),
        (["--vocab-size", "10000000000"], "absurd"),
        (["--vocab-size", "200", "--pre-tokenizer", "whitespace", "--limit-alphabet", "0"], "--limit-alphabet must be at least 1"),
        (["--limit-alphabet", "10"], "does not apply to the byte-level"),
        (["--pre-tokenizer", "wordpiece"], "unknown pre-tokenizer"),
        (["--min-frequency", "0"], "--min-frequency must be at least 1"),
        (["--vocab-size", "10", "--pre-tokenizer", "whitespace"], "smaller than the alphabet"),
    ],
)
def test_bad_options_fail_cleanly_and_keep_the_old_tokenizer(cli, tiny_corpus, tmp_path, args, message):
    out = tmp_path / "tok"
    assert cli("tokenize", "train", tiny_corpus, "-o", out, "--vocab-size", "300").code == 0
    before = snapshot(out)
    result = cli("tokenize", "train", tiny_corpus, "-o", out, *args)
    assert result.code == 2
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert snapshot(out) == before


def test_a_special_token_spelled_like_a_learned_token_is_refused(cli, tmp_path):
    (tmp_path / "c.txt").write_text("the cat and the dog and the end\n" * 200)
    result = cli(
        "tokenize", "train", tmp_path / "c.txt", "-o", tmp_path / "tok", "--pre-tokenizer", "whitespace", "--vocab-size", "100", "--special-tokens", "the</w>"
    )
    assert result.code == 2 and "special token 'the</w>' is also a token BPE learned" in result.stderr
    assert not (tmp_path / "tok" / "tokenizer.json").exists()


def test_artifacts_are_not_text_and_a_run_keeps_its_tokenizer(cli, tiny_corpus, tmp_path):
    from tfcli.checkpoint import save_checkpoint
    from tfcli.model.config import preset
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    assert cli("tokenize", "train", tiny_corpus, "-o", tmp_path / "tok", "--vocab-size", "300").code == 0
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    run = tmp_path / "run"
    save_checkpoint(run, Transformer(preset("tiny", vocab_size=tokenizer.vocab_size, block_size=8)), tokenizer)
    before = snapshot(run)
    result = cli("tokenize", "train", tiny_corpus, "-o", run, "--vocab-size", "280")
    assert result.code == 2 and "run is a run directory; a new tokenizer there would replace" in result.stderr
    assert snapshot(run) == before
    for path, kind in ((run, "a run directory"), (tmp_path / "tok", "a tokenizer folder"), (tmp_path / "tok" / "tokenizer.json", "a tokenizer")):
        result = cli("tokenize", "train", path, "-o", tmp_path / "other")
        assert result.code == 2 and f"is {kind}, not text" in result.stderr, result.stderr


def test_empty_corpus(cli, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n\n  \n")
    for name in ("empty.txt", "blank.txt"):
        result = cli("tokenize", "train", tmp_path / name, "-o", tmp_path / "tok")
        assert result.code == 2 and "empty" in result.stderr
    assert not (tmp_path / "tok" / "tokenizer.json").exists()


def test_binary_file_and_output_that_is_a_file(cli, tiny_corpus, tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\x00\x01\x02")
    result = cli("tokenize", "train", tmp_path / "x.bin", "-o", tmp_path / "tok")
    assert result.code == 2 and "binary" in result.stderr
    (tmp_path / "taken").write_text("keep")
    result = cli("tokenize", "train", tiny_corpus, "-o", tmp_path / "taken")
    assert result.code == 2 and "is a file" in result.stderr
    assert (tmp_path / "taken").read_text() == "keep"


def test_invalid_utf8_is_reported_not_fatal(cli, tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"good text here \xff\xfe and more text\n" * 30)
    result = cli("tokenize", "train", path, "-o", tmp_path / "tok", "--vocab-size", "300", "--json")
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["invalid_bytes"] == 60 and summary["files_with_invalid_utf8"] == 1


def test_a_line_of_megabytes_trains_in_bounded_pieces(tmp_path, monkeypatch):
    import tfcli.tokenizer.train as train_module

    path = tmp_path / "oneline.txt"
    path.write_text("the quick brown fox jumps " * 80_000)  # ~2 MB, no newline
    longest = 0
    original = train_module.iter_text_batches

    def spy(*args, **kwargs):
        nonlocal longest
        for lines in original(*args, **kwargs):
            longest = max(longest, *map(len, lines))
            yield lines

    monkeypatch.setattr(train_module, "iter_text_batches", spy)
    summary = train_tokenizer(resolve_corpus([path]), tmp_path / "tok", TokenizerTrainingConfig(vocab_size=300))
    assert summary.merges > 0
    assert 0 < longest <= 1 << 16


def test_not_a_tokenizer_file(cli, tmp_path):
    for name, content in (("garbage.json", '{"hello": 1}'), ("text.json", "not json at all"), ("bytes.json", b"\xff\x00")):
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        result = cli("tokenize", "show", "hi", "-t", path)
        assert result.code == 2 and "is not a tokenizer.json" in result.stderr, result.stderr
