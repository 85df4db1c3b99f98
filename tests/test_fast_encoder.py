"""The tiktoken encoder of `tokenize encode`: shards byte-identical to tokenizers' on nasty text, the same
split of every code point, and the fast path refused wherever equivalence is not proven."""

from __future__ import annotations

import json
import sys

import pytest

from tfcli.corpus.reader import resolve_corpus
from tfcli.data.shards import encode_corpus
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.fast import ENCODER_ENV, fast_encoder
from tfcli.tokenizer.specials import DEFAULT_SPECIALS
from tfcli.tokenizer.train import train_tokenizer
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

pytest.importorskip("tiktoken")

NASTY = (
    "Plain words, then   runs of   spaces,\t\ttabs\t and\r\nCRLF lines\r\n"
    "Zoë's café — naïve “quotes” ’n’ it’s, they'll we've I'M 'S\n"
    "中文字符，日本語のテキスト、한국어 텍스트 🦊🐦👩‍👩‍👧 ✨ e\u0301 \u00a0nbsp \u2028ls \u3000ideographic\n"
    "<|endoftext|> <|pad|><|unk|> <|endoftext|>< |endoftext|> <|cls|>x <|tfcli-never-matched|>\n"
    "numbers 12345 3.14 1,000,000 ٣٤٥ ⅻ ²³\n"
    "   \n\n\n  leading and trailing   \n \t \n"
    "symbols !!! ??? ... --- ___ *** @@@ ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}\n\n"
)


@pytest.fixture(scope="module")
def nasty_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nasty-tok")
    corpus = folder / "corpus.txt"
    corpus.write_text(NASTY * 40, encoding="utf-8")
    train_tokenizer(resolve_corpus([corpus]), folder / "tok", TokenizerTrainingConfig(vocab_size=700, min_frequency=2))
    return folder / "tok"


def _encode_both(corpus, tokenizer, out, monkeypatch, **options):
    metas = {}
    for encoder in ("tokenizers", "tiktoken"):
        monkeypatch.setenv(ENCODER_ENV, encoder)
        metas[encoder] = encode_corpus(corpus, tokenizer, out / encoder, **options)
        assert metas[encoder].encoder == encoder
    return metas


@pytest.mark.parametrize("boundary", ["paragraph", "line", "file"])
def test_shards_are_byte_identical_either_way(tmp_path, nasty_tokenizer, trained_tokenizer, monkeypatch, boundary):
    text_file = tmp_path / "nasty.txt"
    long_line = ("a very long line without a newline, " * 3000 + "x" * 70_000 + "  \t  " * 2000) * 2  # cut into pieces
    text_file.write_bytes((NASTY * 5 + long_line + "\n\n").encode("utf-8") + b"invalid \xff\xfe utf-8 \xc3(\n\nend\n")
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps({"text": t}) + "\n" for t in NASTY.split("\n\n") + ["lone \ud800 surrogate", "pair \ud83e\udd8a"]))
    for tok in (nasty_tokenizer, trained_tokenizer):
        tokenizer = TextTokenizer.load(tok)
        assert fast_encoder(tokenizer)[0] is not None
        out = tmp_path / f"{tok.parent.name}-{boundary}"
        metas = _encode_both(resolve_corpus([text_file, records]), tokenizer, out, monkeypatch, val_fraction=0.3, boundary=boundary)
        for split in ("train", "val"):
            assert (out / "tokenizers" / f"{split}.bin").read_bytes() == (out / "tiktoken" / f"{split}.bin").read_bytes()
        plain = {k: v for k, v in metas["tokenizers"].to_json().items() if k not in ("seconds", "encoder", "checks")}
        assert plain == {k: v for k, v in metas["tiktoken"].to_json().items() if k not in ("seconds", "encoder", "checks")}
        for split in ("train", "val"):  # the same ids, so the same fingerprints (but for when each file was written)
            assert metas["tokenizers"].checks[split].sha256 == metas["tiktoken"].checks[split].sha256
        assert metas["tiktoken"].train_tokens + metas["tiktoken"].val_tokens > 10_000


def test_every_code_point_is_split_and_merged_alike(nasty_tokenizer):
    """Both regex engines classify each character (letter, number, white space, other) the same way: every
    code point of the planes in use, next to a letter, a digit, a space and itself."""
    tokenizer = TextTokenizer.load(nasty_tokenizer)
    fast, _ = fast_encoder(tokenizer)
    planes = [*range(0, 0x323B0), *range(0xE0000, 0xE01F0)]
    chars = [chr(c) for c in planes if not 0xD800 <= c <= 0xDFFF]
    texts = ["".join(f"a{c}1{c} {c}{c}\n" for c in chars[i : i + 4096]) for i in range(0, len(chars), 4096)]
    texts.append("lone \ud800 and \udfff surrogates, a pair of them \ud83e\udd8a")  # each becomes U+FFFD, as tfcli does
    slow = tokenizer.encode_batch(texts)
    quick = fast.encode_batch(texts)
    assert [list(ids) for ids in quick] == slow


def _byte_level_bpe(tmp_path, merges: list[tuple[str, str]], extra: dict | None = None):
    """A byte-level BPE tokenizer.json over the 256 byte symbols, with the given merges (ids in merge order)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.add_special_tokens([DEFAULT_SPECIALS["eos"]])
    spec = json.loads(hf.to_str())
    for key, value in (extra or {}).items():
        spec[key] = value
    folder = tmp_path / "tok"
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return TextTokenizer.load(folder)


def test_a_token_its_own_bytes_do_not_reach_is_refused_for_good_reason(tmp_path):
    """`abc` comes from (ab, c), but on "abc" the merge (b, c) ranks first, so tokenizers ends at [a, bc];
    tiktoken takes "abc" whole, being in the vocabulary. The ids differ, so the fast path must refuse."""
    import tiktoken

    from tfcli.tokenizer.fast import GPT2_PATTERN

    tokenizer = _byte_level_bpe(tmp_path, [("b", "c"), ("a", "b"), ("ab", "c")])
    assert tokenizer.encode("abc") == [tokenizer.hf.token_to_id("a"), tokenizer.hf.token_to_id("bc")]
    ranks = {bytes([b]): tokenizer.hf.token_to_id(ch) for ch, b in _byte_map().items()}
    ranks |= {token.encode(): tokenizer.hf.token_to_id(token) for token in ("bc", "ab", "abc")}
    naive = tiktoken.Encoding("naive", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    assert naive.encode_ordinary("abc") == [tokenizer.hf.token_to_id("abc")]
    encoder, why = fast_encoder(tokenizer)
    assert encoder is None and why == "its token 'abc', encoded alone, does not come out as itself"
    good = _byte_level_bpe(tmp_path, [("a", "b"), ("b", "c"), ("ab", "c")])
    assert fast_encoder(good)[0] is not None


def test_a_file_that_truncates_and_pads_still_encodes_whole_on_the_fast_path(tmp_path, nasty_tokenizer):
    """tfcli switches a file's padding and truncation off (transformers does when it encodes), so tiktoken, which
    has neither, gives the same ids."""
    base = TextTokenizer.load(nasty_tokenizer)
    truncation = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    padding = {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"}
    tokenizer = _edited(base, tmp_path, lambda s: s.update(truncation=truncation, padding=padding))
    fast, why = fast_encoder(tokenizer)
    assert fast is not None, why
    texts = [NASTY, "a few words", NASTY * 3]
    ids = tokenizer.encode_batch(texts)
    assert [list(i) for i in fast.encode_batch(texts)] == ids and len(ids[2]) > 64 and len(ids[1]) < 8


def _byte_map() -> dict[str, int]:
    from tfcli.tokenizer.fast import byte_of_symbol

    return byte_of_symbol()


def _retrained(tmp_path, **config):
    corpus = tmp_path / "c.txt"
    corpus.write_text(NASTY * 5, encoding="utf-8")
    out = tmp_path / "tok"
    train_tokenizer(resolve_corpus([corpus]), out, TokenizerTrainingConfig(**config))
    return TextTokenizer.load(out)


def _edited(tokenizer: TextTokenizer, tmp_path, edit) -> TextTokenizer:
    spec = json.loads(tokenizer.hf.to_str())
    edit(spec)
    (tmp_path / "edited").mkdir()
    (tmp_path / "edited" / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return TextTokenizer.load(tmp_path / "edited")


@pytest.mark.parametrize(
    "case, reason",
    [
        ("lowercase", "it has a normalizer (Lowercase)"),
        ("whitespace", "its pre-tokenizer is not byte-level"),
        ("metaspace", "its pre-tokenizer is not byte-level"),
        ("prefix space", "its pre-tokenizer is not byte-level with GPT-2's regex and no prefix space"),
        ("no regex", "its pre-tokenizer is not byte-level with GPT-2's regex and no prefix space"),
        ("added token", "it has added tokens that are not special"),
        ("template", "it has a post-processor (TemplateProcessing)"),
        ("dropout", "its BPE has dropout"),
        ("unordered ids", "its token ids do not grow with the merge order"),
    ],
)
def test_the_fast_path_is_refused_where_not_proven(tmp_path, nasty_tokenizer, case, reason):
    base = TextTokenizer.load(nasty_tokenizer)
    if case == "lowercase":
        tokenizer = _retrained(tmp_path, vocab_size=400, lowercase=True)
    elif case in ("whitespace", "metaspace"):
        tokenizer = _retrained(tmp_path, vocab_size=400, pre_tokenizer=case)
    elif case == "prefix space":
        tokenizer = _edited(base, tmp_path, lambda s: s["pre_tokenizer"].update(add_prefix_space=True))
    elif case == "no regex":
        tokenizer = _edited(base, tmp_path, lambda s: s["pre_tokenizer"].update(use_regex=False))
    elif case == "added token":
        tokenizer = _edited(
            base,
            tmp_path,
            lambda s: s["added_tokens"].append(
                {"id": len(s["model"]["vocab"]), "content": "fox", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False}
            ),
        )
    elif case == "template":
        tokenizer = _edited(
            base,
            tmp_path,
            lambda s: s.update(
                post_processor={
                    "type": "TemplateProcessing",
                    "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                    "special_tokens": {},
                }
            ),
        )
    elif case == "dropout":
        tokenizer = _edited(base, tmp_path, lambda s: s["model"].update(dropout=0.1))
    else:

        def swap(spec):
            vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
            first, second = ("".join(m) if isinstance(m, list) else m.replace(" ", "") for m in merges[:2])
            vocab[first], vocab[second] = vocab[second], vocab[first]

        tokenizer = _edited(base, tmp_path, swap)
    encoder, why = fast_encoder(tokenizer)
    assert encoder is None and why.startswith(reason), why


def test_without_tiktoken_encoding_stays_on_tokenizers(tmp_path, trained_tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    tokenizer = TextTokenizer.load(trained_tokenizer)
    assert fast_encoder(tokenizer) == (None, "tiktoken is not installed")
    (tmp_path / "c.txt").write_text(NASTY, encoding="utf-8")
    meta = encode_corpus(resolve_corpus([tmp_path / "c.txt"]), tokenizer, tmp_path / "s", val_fraction=0)
    assert meta.encoder == "tokenizers" and meta.train_tokens > 0
