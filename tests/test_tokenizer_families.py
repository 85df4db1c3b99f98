"""`tokenize train --model bpe|wordpiece|unigram|char`: each family trains on a tiny corpus, loads in `tokenizers`
(and WordPiece in transformers' BertTokenizerFast, id for id), keeps special-token text as text, decodes back,
and runs through every command downstream."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import training
from tests.conftest import TINY_TEXT, snapshot
from tfcli.corpus.reader import resolve_corpus
from tfcli.errors import TfcliError
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.detokenize import decode_completion, decode_pieces, text_byte_lengths
from tfcli.tokenizer.families import char_vocabulary
from tfcli.tokenizer.specials import BERT_SPECIALS, DEFAULT_SPECIALS, parse_special_tokens
from tfcli.tokenizer.train import train_tokenizer
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

# Coriolanus, Act 1 Scene 1 (public domain): the opening of nanoGPT's tiny Shakespeare.
SHAKESPEARE = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\n"
    "All:\nResolved. resolved.\n\n"
    "First Citizen:\nFirst, you know Caius Marcius is chief enemy to the people.\n\n"
    "All:\nWe know't, we know't.\n\n"
    "First Citizen:\nLet us kill him, and we'll have corn at our own price.\nIs't a verdict?\n\n"
    "All:\nNo more talking on't; let it be done: away, away!\n\n"
)
# The tiny text plus the characters special tokens are spelled with, so a family could spell them from text.
FAMILY_TEXT = TINY_TEXT * 20 + "Keep <x|y> and [a] apart; a_b. MASK, SEP, UNK.\n" * 5
FAMILIES = ["bpe", "wordpiece", "unigram", "char", "word"]
VOCAB = {"bpe": 320, "wordpiece": 200, "unigram": 150, "char": 100, "word": 200}


@pytest.fixture(scope="module")
def family_tokenizers(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("families")
    corpus = folder / "corpus.txt"
    corpus.write_text(FAMILY_TEXT, encoding="utf-8")
    out = {}
    for model in FAMILIES:
        train_tokenizer(resolve_corpus([corpus]), folder / model, TokenizerTrainingConfig(vocab_size=VOCAB[model], model=model))
        out[model] = folder / model
    return out


@pytest.mark.parametrize("model", FAMILIES)
def test_each_family_loads_in_tokenizers_and_knows_its_roles(family_tokenizers, model):
    from tokenizers import Tokenizer

    path = family_tokenizers[model]
    tokenizer = TextTokenizer.load(path)
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    text = "The fox was happy, so it played."
    assert raw.encode(text, add_special_tokens=False).ids == tokenizer.encode(text)
    assert tokenizer.family == model
    assert tokenizer.vocab_size <= VOCAB[model]
    assert tokenizer.pre_tokenizer_kind == {"bpe": "byte-level", "wordpiece": "bert", "unigram": "metaspace", "char": "characters", "word": "whitespace"}[model]
    # BERT's [SEP] ends a text (eos) and separates (sep), as a loaded BERT tokenizer's roles have it
    names = {**BERT_SPECIALS, "sep": "[SEP]"} if model == "wordpiece" else DEFAULT_SPECIALS
    assert {role: tokenizer.hf.id_to_token(i) for role, i in tokenizer.special_ids.items()} == names
    if model == "wordpiece":  # BERT's order: [PAD] [UNK] [CLS] [SEP] [MASK]
        assert tokenizer.special_ids == {"pad": 0, "unk": 1, "cls": 2, "eos": 3, "mask": 4, "sep": 3}
    elif model == "unigram":  # unk is the model's own piece 0; the others follow the pieces
        assert tokenizer.special_ids["unk"] == 0
        assert sorted(tokenizer.special_ids[r] for r in ("eos", "pad", "mask", "cls")) == list(range(tokenizer.vocab_size - 4, tokenizer.vocab_size))
    else:
        assert tokenizer.special_ids == {"eos": 0, "pad": 1, "unk": 2, "mask": 3, "cls": 4}


@pytest.mark.parametrize("model", ["unigram", "char"])
def test_unigram_and_char_load_in_transformers(family_tokenizers, model):
    transformers = pytest.importorskip("transformers")
    path = family_tokenizers[model]
    auto = transformers.AutoTokenizer.from_pretrained(str(path))
    ours = TextTokenizer.load(path)
    text = "Zoë said <|endoftext|> to the fox.\n\nThe end."
    assert auto(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert auto.decode(ours.encode("The fox was happy.")) == "The fox was happy."
    assert (auto.eos_token_id, auto.pad_token_id, auto.unk_token_id) == tuple(ours.special_ids[r] for r in ("eos", "pad", "unk"))


@pytest.mark.parametrize("model", FAMILIES)
@pytest.mark.parametrize("special", ["<|endoftext|>", "<|pad|>", "<|unk|>", "[MASK]", "[SEP]", "[UNK]"])
def test_special_token_text_stays_text_in_every_family(family_tokenizers, model, special):
    tokenizer = TextTokenizer.load(family_tokenizers[model])
    ids = tokenizer.encode(f"a {special} b")
    # the corpus holds every character of these spellings, so none of it is unknown either (a Unigram model
    # trained by `tokenizers` scores special pieces 0.0 and would read "<|unk|>" as its unk piece); a word
    # vocabulary reads a word it lacks ("endoftext") as unk, never as the special token itself
    allowed = {tokenizer.special_ids["unk"]} if model == "word" else set()
    assert not set(ids) & (set(tokenizer.special_ids.values()) - allowed)


@pytest.mark.parametrize("model", FAMILIES)
def test_decoding_and_streaming_give_the_text_back(family_tokenizers, model):
    tokenizer = TextTokenizer.load(family_tokenizers[model])
    text = "The fox was happy, so it played with the red ball."
    ids = tokenizer.encode(text)
    if model == "word":  # words and punctuation, joined with spaces: the spacing is not kept
        text = "The fox was happy , so it played with the red ball ."
    assert tokenizer.decode(ids) == text
    # streamed through the decoder after nothing: the text's first space is the decoder's to drop, as decode does
    assert "".join(decode_pieces(tokenizer, (), ids)) == text


def test_wordpiece_tokens_and_their_bytes(family_tokenizers):
    tokenizer = TextTokenizer.load(family_tokenizers["wordpiece"])
    ids = tokenizer.encode("The ball, the park.")
    tokens = [tokenizer.hf.id_to_token(i) for i in ids]
    assert tokens[0] == "The" and "," in tokens and tokens[-1] == "."
    by_token = dict(zip(tokens, decode_pieces(tokenizer, tokenizer.encode("a"), ids)))  # each token's text after a word
    assert by_token["The"] == " The" and by_token[","] == "," and by_token["."] == "."
    continuation = tokenizer.hf.token_to_id(next(t for t in tokenizer.hf.get_vocab() if t.startswith("##") and len(t) > 3))
    assert decode_completion(tokenizer, tokenizer.encode("a"), [continuation]) == tokenizer.hf.id_to_token(continuation)[2:]


@pytest.mark.parametrize("lowercase, strip_accents", [(False, None), (True, None), (True, False), (False, True)])
def test_wordpiece_matches_bert_tokenizer_fast(tmp_path, lowercase, strip_accents):
    transformers = pytest.importorskip("transformers")
    corpus = tmp_path / "c.txt"
    corpus.write_text(FAMILY_TEXT + "Chloé and Zoë went to the CAFÉ in Tōkyō, 東京.\n" * 3, encoding="utf-8")
    out = tmp_path / "tok"
    config = TokenizerTrainingConfig(vocab_size=220, model="wordpiece", lowercase=lowercase, strip_accents=strip_accents)
    train_tokenizer(resolve_corpus([corpus]), out, config)
    ours = TextTokenizer.load(out)

    vocab_lines = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert vocab_lines == [ours.hf.id_to_token(i) for i in range(ours.vocab_size)]
    kwargs = {"do_lower_case": lowercase, "strip_accents": strip_accents, "split_special_tokens": True}
    if int(transformers.__version__.split(".")[0]) >= 5:
        from transformers.models.bert.tokenization_bert import load_vocab

        reference = transformers.BertTokenizerFast(vocab=load_vocab(str(out / "vocab.txt")), **kwargs)
    else:
        reference = transformers.BertTokenizerFast(vocab_file=str(out / "vocab.txt"), **kwargs)
    auto = transformers.AutoTokenizer.from_pretrained(str(out))
    loaded = transformers.BertTokenizerFast.from_pretrained(str(out))
    assert isinstance(auto, transformers.BertTokenizerFast)
    text = 'Zoë smiled at the CAFÉ, "Thank you!" said Mia.\tTom\'s 東京 [MASK] apples in Tōkyō; unbelievable'
    expected = reference(text, add_special_tokens=False)["input_ids"]
    assert ours.encode(text) == expected
    assert auto(text, add_special_tokens=False)["input_ids"] == expected
    assert loaded(text, add_special_tokens=False)["input_ids"] == expected
    assert auto(text)["input_ids"] == [2, *expected, 3]  # [CLS] ... [SEP], as BERT reads a sentence
    assert (auto.pad_token_id, auto.unk_token_id, auto.cls_token_id, auto.sep_token_id, auto.mask_token_id) == (0, 1, 2, 3, 4)
    stripped = lowercase if strip_accents is None else strip_accents  # BERT's rule
    word = ("zo" if lowercase else "Zo") + ("e" if stripped else "ë")
    assert word in ours.decode(ours.encode(text)).split()


def test_char_tokenizer_round_trips_shakespeare_exactly(tmp_path):
    corpus = tmp_path / "input.txt"
    corpus.write_text(SHAKESPEARE * 3, encoding="utf-8")
    summary = train_tokenizer(resolve_corpus([corpus]), tmp_path / "tok", TokenizerTrainingConfig(vocab_size=100, model="char"))
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    characters = sorted(set(SHAKESPEARE))
    # nanoGPT's shakespeare_char numbering: characters in code-point order (after the special tokens)
    assert [tokenizer.hf.id_to_token(i) for i in range(5, tokenizer.vocab_size)] == characters
    assert summary.vocab_size == 5 + len(characters) and summary.alphabet_size == len(characters)
    assert summary.unknown_characters == 0 and summary.merges is None
    ids = tokenizer.encode(SHAKESPEARE)
    assert len(ids) == len(SHAKESPEARE)
    assert tokenizer.decode(ids) == SHAKESPEARE
    assert "".join(decode_pieces(tokenizer, (), ids)) == SHAKESPEARE
    assert abs(summary.bytes_per_token - 1.0) < 1e-9


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=sorted(set(FAMILY_TEXT)), max_size=120))
def test_char_round_trip_of_any_text_of_its_alphabet(family_tokenizers, text):
    tokenizer = _cached(family_tokenizers["char"])
    assert tokenizer.decode(tokenizer.encode(text)) == text  # every character of the text is known
    assert len(tokenizer.encode(text)) == len(text)


_loaded: dict = {}


def _cached(path):
    if path not in _loaded:
        _loaded[path] = TextTokenizer.load(path)
    return _loaded[path]


def test_char_vocabulary_cap_counts_what_becomes_unknown():
    from collections import Counter

    vocab = char_vocabulary(Counter("abracadabra"), cap=3)
    assert (vocab.kept, vocab.seen, vocab.unknown, vocab.unknown_occurrences) == (["a", "b", "r"], 5, 2, 2)
    tie = char_vocabulary(Counter("zzyyx"), cap=1)
    assert tie.kept == ["y"]  # a tie goes to the lower code point
    assert char_vocabulary(Counter("aab"), cap=10, min_frequency=2).kept == ["a"]


def test_char_cap_maps_rare_characters_to_unk_and_says_so(cli, tmp_path):
    corpus = tmp_path / "input.txt"
    corpus.write_text(SHAKESPEARE * 3, encoding="utf-8")
    out = tmp_path / "tok"
    result = cli("tokenize", "train", corpus, "-o", out, "--model", "char", "--vocab-size", "25", "--json")
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)
    counts = {ch: SHAKESPEARE.count(ch) * 3 for ch in set(SHAKESPEARE)}
    kept = sorted(counts, key=lambda ch: (-counts[ch], ch))[:20]
    assert summary["vocab_size"] == 25 and summary["alphabet_size"] == 20
    assert summary["unknown_characters"] == len(counts) - 20
    assert summary["unknown_occurrences"] == sum(n for ch, n in counts.items() if ch not in kept)
    tokenizer = TextTokenizer.load(out)
    rare = min(counts, key=lambda ch: (counts[ch], ch))
    assert tokenizer.encode(rare) == [tokenizer.special_ids["unk"]]
    table = cli("tokenize", "train", corpus, "-o", out, "--model", "char", "--vocab-size", "25")
    assert f"{summary['unknown_characters']} rarer characters of {len(counts)} seen" in table.stdout
    assert "encoded as <|unk|>" in table.stdout


def test_char_min_frequency_and_lowercase(tmp_path):
    corpus = tmp_path / "input.txt"
    corpus.write_text(SHAKESPEARE, encoding="utf-8")
    config = TokenizerTrainingConfig(vocab_size=100, model="char", min_frequency=2, lowercase=True)
    summary = train_tokenizer(resolve_corpus([corpus]), tmp_path / "tok", config)
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    assert tokenizer.encode("FIRST") == tokenizer.encode("first")
    lowered = SHAKESPEARE.lower()
    assert summary.alphabet_size == sum(lowered.count(ch) >= 2 for ch in set(lowered))
    once = [ch for ch in sorted(set(lowered)) if lowered.count(ch) == 1]
    assert once and all(tokenizer.encode(ch) == [tokenizer.special_ids["unk"]] for ch in once)  # below --min-frequency


def test_unigram_pieces_and_metaspace(family_tokenizers):
    tokenizer = TextTokenizer.load(family_tokenizers["unigram"])
    spec = json.loads(tokenizer.hf.to_str())
    assert spec["model"]["type"] == "Unigram" and spec["pre_tokenizer"]["type"] == "Metaspace"
    tokens = [tokenizer.hf.id_to_token(i) for i in tokenizer.encode("the fox")]
    assert tokens[0].startswith("\u2581") and "".join(tokens).replace("\u2581", " ") == " the fox"
    scores = [score for _, score in spec["model"]["vocab"]]
    assert scores[0] < min(scores[1:]) * len("<|unk|>")  # the unk piece is never the best reading of text


def test_summary_and_table_name_the_family(cli, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(FAMILY_TEXT, encoding="utf-8")
    for model, extra in (("wordpiece", ["--lowercase"]), ("unigram", []), ("char", [])):
        out = tmp_path / model
        data = json.loads(cli("tokenize", "train", corpus, "-o", out, "--model", model, "--vocab-size", "200", *extra, "--json").stdout)
        assert data["model"] == model and data["merges"] is None and data["alphabet_size"] > 20
        assert (out / "vocab.txt").is_file() == (model == "wordpiece")
        table = cli("tokenize", "train", corpus, "-o", out, "--model", model, "--vocab-size", "200", *extra).stdout
        assert f"model            {model} (" in table and "merges" not in table
    assert (
        "wordpiece (bert, lowercased, accents stripped)"
        in cli("tokenize", "train", corpus, "-o", tmp_path / "w", "--model", "wordpiece", "--vocab-size", "200", "--lowercase").stdout
    )
    config = json.loads((tmp_path / "wordpiece" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizerFast" and config["do_lower_case"] is True and config["strip_accents"] is True
    assert config["sep_token"] == config["eos_token"] == "[SEP]" and config["cls_token"] == "[CLS]"


def test_wordpiece_special_tokens_can_be_renamed(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(FAMILY_TEXT, encoding="utf-8")
    specials = parse_special_tokens(["eos=</s>", "<|user|>"], BERT_SPECIALS)
    train_tokenizer(resolve_corpus([corpus]), tmp_path / "tok", TokenizerTrainingConfig(vocab_size=200, model="wordpiece", special_tokens=specials))
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    assert tokenizer.special_ids["eos"] == tokenizer.hf.token_to_id("</s>") == 3
    assert tokenizer.hf.token_to_id("<|user|>") == 5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "nope"], "unknown --model 'nope'"),
        (["--model", "wordpiece", "--pre-tokenizer", "whitespace"], "--pre-tokenizer applies to --model bpe only"),
        (["--model", "unigram", "--min-frequency", "3"], "--min-frequency does not apply to --model unigram"),
        (["--model", "char", "--limit-alphabet", "5"], "--limit-alphabet does not apply to --model char"),
        (["--model", "unigram", "--limit-alphabet", "5"], "--limit-alphabet does not apply to --model unigram"),
        (["--strip-accents"], "apply to --model wordpiece"),
        (["--model", "char", "--keep-accents"], "apply to --model wordpiece"),
        (["--model", "char", "--vocab-size", "5"], "--vocab-size 5 leaves no room for a character beside 5 special tokens"),
        (["--model", "wordpiece", "--vocab-size", "30"], "tokens with their ## forms) plus 5 special tokens"),
        (["--model", "unigram", "--vocab-size", "12"], "Unigram keeps every character of the corpus"),
        (["--model", "wordpiece", "--special-tokens", "eos=Keep"], "would also be read from ordinary text spelled the same"),
        (["--model", "wordpiece", "--special-tokens", "eos=[E\nOS]"], "holds a line break"),
    ],
)
def test_bad_family_options_fail_cleanly(cli, tmp_path, args, message):
    corpus = tmp_path / "c.txt"
    corpus.write_text(FAMILY_TEXT, encoding="utf-8")
    out = tmp_path / "tok"
    assert cli("tokenize", "train", corpus, "-o", out, "--model", "char").code == 0
    before = snapshot(out)
    result = cli("tokenize", "train", corpus, "-o", out, *args)
    assert result.code == 2, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert snapshot(out) == before


def test_config_defaults_follow_the_family():
    assert TokenizerTrainingConfig().pre_tokenizer == "byte-level" and TokenizerTrainingConfig().min_frequency == 2
    assert TokenizerTrainingConfig(model="char", vocab_size=100).min_frequency == 1
    assert TokenizerTrainingConfig(model="unigram", vocab_size=100).min_frequency is None
    wordpiece = TokenizerTrainingConfig(model="wordpiece", vocab_size=100, lowercase=True)
    assert wordpiece.special_tokens.all_tokens() == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and wordpiece.accents_stripped
    assert not TokenizerTrainingConfig(model="wordpiece", vocab_size=100, lowercase=True, strip_accents=False).accents_stripped
    with pytest.raises(TfcliError, match="unknown --model"):
        TokenizerTrainingConfig(model="sentencepiece")  # type: ignore[arg-type]


# -- every command downstream, per family ---------------------------------------------------------------

TINY_MODEL = [*training.TINY_MODEL, "--block-size", "32", "--batch-size", "4", "--lr", "3e-3", "--log-every", "5"]


@pytest.fixture
def plain_model(monkeypatch):
    """The plain PyTorch model: these tests are about tokenizers, not about what tfcli.accel measures and picks."""
    monkeypatch.setenv("TFCLI_ACCEL", "0")


@pytest.mark.parametrize("model", ["wordpiece", "unigram", "char"])
def test_the_chain_runs_with_each_family(cli, tmp_path, plain_model, model):
    """tokenize train -> encode -> pretrain a decoder -> generate -> eval (bits per byte), through the real commands."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(FAMILY_TEXT if model != "char" else SHAKESPEARE * 10, encoding="utf-8")
    tok, shards, run = tmp_path / "tok", tmp_path / "shards", tmp_path / "run"
    assert cli("tokenize", "train", corpus, "-o", tok, "--model", model, "--vocab-size", str(VOCAB[model])).code == 0
    result = cli("tokenize", "encode", corpus, "-t", tok, "-o", shards, "--val-fraction", "0.2", "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["val_tokens"] > 33
    result = cli("train", "pretrain", "--data", shards, "-o", run, "--max-steps", "4", "--eval-every", "4", *TINY_MODEL)
    assert result.code == 0, result.stderr
    tokenizer = TextTokenizer.load(run)
    assert tokenizer.family == model

    prompt = "First Citizen" if model == "char" else "The fox"
    result = cli("generate", run, "--prompt", prompt, "-n", "12", "--seed", "1", "--json")
    assert result.code == 0, result.stderr
    completion = json.loads(result.stdout)["completions"][0]
    # the decoder's text of prompt + completion, less the prompt's
    prompt_ids = tokenizer.encode(prompt)
    full = tokenizer.hf.decode(prompt_ids + completion["tokens"], skip_special_tokens=True)
    assert prompt + completion["text"] == full
    assert "".join(completion["token_texts"]) == completion["text"]
    if model == "char":  # one character per token, joined as they are
        assert len(completion["text"]) == len(completion["tokens"]) - sum(t in tokenizer.skipped_ids for t in completion["tokens"])
    streamed = cli("generate", run, "--prompt", prompt, "-n", "12", "--seed", "1")
    assert streamed.code == 0 and streamed.stdout == completion["text"] + "\n"
    if model == "wordpiece":  # inspect names a piece that continues a word as BERT's vocabulary does
        from tfcli.tokenizer.show import token_views

        text = "The fox jumped carefully"
        pieces = [v for v in token_views(tokenizer, text) if v.continuation]
        assert pieces and pieces[0].label == "##" + pieces[0].text
        shown = cli("inspect-attention", run, "--text", text, "--head", "0.0")
        assert shown.code == 0 and pieces[0].label in shown.stdout, shown.stdout

    result = cli("eval", run, "--data", shards, "--json")
    assert result.code == 0, result.stderr
    scores = json.loads(result.stdout)
    specials = set(tokenizer.special_ids.values())
    targets = np.fromfile(shards / "val.bin", dtype=np.uint16)[1 : scores["tokens"] + 1]  # each window's targets, back to back
    decoded = tokenizer.hf.decode([int(i) for i in targets if int(i) not in specials])  # the text the scored tokens spell
    text_bytes = sum(text_byte_lengths(tokenizer)[int(i)] for i in targets if int(i) not in specials)
    assert abs(text_bytes - len(decoded.encode("utf-8"))) <= 8  # (but for the first word's space, per window)
    # bits per byte: the loss in bits over the bytes the scored tokens stand for
    assert scores["bpb"] == pytest.approx(scores["loss"] * scores["tokens"] / math.log(2) / text_bytes, rel=1e-3)


def test_an_encoder_on_wordpiece_fine_tunes_for_classification_like_bert(cli, tmp_path, plain_model):
    from tests.conftest import SAMPLE_DATA

    lines = (SAMPLE_DATA / "reviews.jsonl").read_text(encoding="utf-8").splitlines()[:200]  # a slice keeps it quick
    reviews = tmp_path / "reviews.jsonl"
    reviews.write_text("\n".join(lines) + "\n", encoding="utf-8")
    texts = [json.loads(line)["text"] for line in lines]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    tok, shards, encoder, classifier = (tmp_path / name for name in ("tok", "shards", "encoder", "classifier"))
    assert cli("tokenize", "train", corpus, "-o", tok, "--model", "wordpiece", "--vocab-size", "400", "--lowercase").code == 0
    assert cli("tokenize", "encode", corpus, "-t", tok, "-o", shards, "--val-fraction", "0.1").code == 0
    result = cli("train", "pretrain", "--data", shards, "-o", encoder, "--arch", "encoder", "--max-steps", "4", "--eval-every", "4", *TINY_MODEL)
    assert result.code == 0, result.stderr
    result = cli("generate", encoder, "--fill-mask", "The food was [MASK].", "--json")
    assert result.code == 0, result.stderr
    vocabulary = TextTokenizer.load(tok)
    for filler in json.loads(result.stdout)["masks"][0]["fillers"]:
        # the vocabulary entry ("good", "##ff"); its text brings its own space, a ## piece or punctuation none
        assert filler["token"] == vocabulary.hf.id_to_token(filler["token_id"])
        text = decode_completion(vocabulary, vocabulary.encode("The food was"), [filler["token_id"]])
        assert filler["text"] == "The food was" + text + "."
        assert text == (filler["token"][2:] if filler["token"].startswith("##") else text)
    result = cli(
        "train",
        "finetune",
        "--init-from",
        encoder,
        "--task",
        "classify",
        "--data",
        reviews,
        "-o",
        classifier,
        "--max-steps",
        "4",
        "--batch-size",
        "8",
        "--eval-every",
        "4",
        "--log-every",
        "5",
    )
    assert result.code == 0, result.stderr
    result = cli("eval", classifier, "--data", reviews, "--max-batches", "4", "--json")
    assert result.code == 0, result.stderr
    assert 0.0 <= json.loads(result.stdout)["accuracy"] <= 1.0
    assert cli("generate", classifier, "--classify", "The zipper was horrible.").code == 0
    info = cli("info", encoder)
    assert "wordpiece (bert)" in info.stdout and "[CLS]" in info.stdout
