"""tokenizer.json read as transformers reads it (issue 44): a file saved with padding and truncation on, a
tokenizer_config.json that asks for transformers' space clean-up, added tokens with lstrip/rstrip/single_word/
normalized, and tokenizer_config.json's own word on added tokens. Each folder is built here, at test time, with
`tokenizers` (no download; this environment ships no tokenizer.json in site-packages), then loaded by tfcli
and by `transformers.AutoTokenizer.from_pretrained(folder)` and compared on varied text: the ids, the text with
and without special tokens, and streamed pieces joined.

Where transformers and `tokenizers` disagree, tfcli follows transformers, and the test says so:
- padding and truncation: `Tokenizer.from_str` keeps them on (`encode` pads, `encode_batch` pads to the
  longest row); transformers turns them off for every call that does not ask (TokenizersBackend.
  set_truncation_and_padding with PaddingStrategy.DO_NOT_PAD / TruncationStrategy.DO_NOT_TRUNCATE);
- clean_up_tokenization_spaces: `Tokenizer.decode` knows nothing of it; transformers' TokenizersBackend._decode
  applies clean_up_tokenization after the decoder, except for a BPE model (a warning, and no clean-up);
- tokenizer_config.json's added_tokens_decoder and named special tokens: `Tokenizer.from_str` reads only
  tokenizer.json; transformers adds them again over it (TokenizersBackend.__init__, _post_init).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tfcli.tokenizer.chat_template import ChatTemplate, Message
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.detokenize import IncrementalDecoder, decode_completion

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello world",
    "Don't stop , ok ? It's 3.5 ... yes ! They're here , we've won . I 'm sure n't",
    "The café was naïve; the résumé said déjà vu. Ωμέγα, straße, ÅNGSTRÖM.",
    "東京へ行きました。你好，世界！ 한국어",
    "emoji 😀👍🏽🦊🎉 ok",
    "def f(x):\n\treturn {'a': x  +  1}  # code, [1, 2]",
    "   whitespace   runs\n\n\t  end   ",
]
CORPUS = TEXTS * 20 + ["the quick brown fox jumps over the lazy dog . hello , world ! don ' t , it ' s"] * 20
PAD_MULTIPLE, TRUNCATE_AT = 8, 256  # as the sentence-transformers file in the issue (all-MiniLM-L6-v2) pads and cuts


def _save(tokenizer: Tokenizer, folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def _pad_and_truncate(tokenizer: Tokenizer, pad: str) -> None:
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(pad), pad_token=pad, pad_to_multiple_of=PAD_MULTIPLE)
    tokenizer.enable_truncation(TRUNCATE_AT)


def minilm_like(folder: Path) -> Path:
    """BERT's WordPiece as sentence-transformers saves it: padding and truncation on, clean-up asked for."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    _pad_and_truncate(tokenizer, "[PAD]")
    config = {"clean_up_tokenization_spaces": True, "do_lower_case": True, "model_max_length": 512, "tokenizer_class": "PreTrainedTokenizerFast"}
    config |= {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}
    return _save(tokenizer, folder, config)


def gpt2_like(folder: Path) -> Path:
    """Byte-level BPE, padded and truncated, asking for clean-up: transformers leaves BPE text uncleaned."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    _pad_and_truncate(tokenizer, "<|endoftext|>")
    return _save(tokenizer, folder, {"clean_up_tokenization_spaces": True, "eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"})


def t5_like(folder: Path) -> Path:
    """A Metaspace Unigram ending each text with </s>, its decoder leaving " ." and " ," (T5's, the issue's)."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=250, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    config = {"clean_up_tokenization_spaces": True, "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    return _save(tokenizer, folder, config | {"tokenizer_class": "PreTrainedTokenizerFast"})


def words_joined_by_spaces(folder: Path) -> Path:
    """A word-level vocabulary without a decoder (the library joins tokens with a space: "don ' t")."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[SEP]"]))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A [SEP]", special_tokens=[("[SEP]", 1)])
    return _save(tokenizer, folder, {"clean_up_tokenization_spaces": True, "unk_token": "[UNK]", "sep_token": "[SEP]"})


def wordpiece_decoder_without_cleanup(folder: Path) -> Path:
    """WordPiece whose decoder cleans nothing itself (cleanup=False), so tokenizer_config.json's clean-up does it all."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(cleanup=False)
    tokenizer.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    _pad_and_truncate(tokenizer, "[PAD]")
    return _save(
        tokenizer, folder, {"clean_up_tokenization_spaces": True, "unk_token": "[UNK]", "pad_token": "[PAD]", "tokenizer_class": "PreTrainedTokenizerFast"}
    )


LAYOUTS = {
    "minilm": minilm_like,
    "gpt2": gpt2_like,
    "t5": t5_like,
    "words": words_joined_by_spaces,
    "wordpiece-no-decoder-cleanup": wordpiece_decoder_without_cleanup,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizer-json")
    return {name: build(root / name) for name, build in LAYOUTS.items()}


def _theirs(folder: Path, **options):
    return transformers.AutoTokenizer.from_pretrained(str(folder), **options)


def _streamed(tokenizer: TextTokenizer, context: list[int], ids: list[int], skip: bool) -> list[str]:
    decoder = IncrementalDecoder(tokenizer, context, skip_special_tokens=skip)
    return [decoder.extend([i]) for i in ids] + [decoder.finish()]


@pytest.mark.parametrize("layout", ["minilm", "gpt2", "wordpiece-no-decoder-cleanup"])
def test_padding_and_truncation_in_the_file_are_off(folders, layout):
    folder = folders[layout]
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert spec["padding"]["pad_to_multiple_of"] == PAD_MULTIPLE and spec["truncation"]["max_length"] == TRUNCATE_AT
    library = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert len(library.encode("Hello world", add_special_tokens=False).ids) == PAD_MULTIPLE  # the library pads, as saved
    ours, theirs = TextTokenizer.load(folder), _theirs(folder)
    pad = library.padding["pad_id"]
    hello = ours.encode("Hello world")
    assert hello == theirs("Hello world", add_special_tokens=False)["input_ids"] and pad not in hello and len(hello) < PAD_MULTIPLE
    long = " ".join(["hello", "world", "fox", "café"] * 250)  # a thousand words
    assert len(ours.encode(long)) > TRUNCATE_AT and ours.encode(long) == theirs(long, add_special_tokens=False)["input_ids"]
    rows = ours.encode_batch(["Hello world", long, "fox"])  # a batch is not padded to its longest row either
    assert rows == [ours.encode("Hello world"), ours.encode(long), ours.encode("fox")]
    assert not ours.spec["padding"] and not ours.spec["truncation"]
    # a streamed decode after a context: no pad ids in the context, so the pieces are the text's
    context = ours.encode("Hello world")
    new = ours.encode(" the quick brown fox")
    assert "".join(_streamed(ours, context, new, True)) == decode_completion(ours, context, new)
    assert ours.decode(context + new) == theirs.decode(context + new)


def test_tokenize_show_gives_no_pad_ids(cli, folders):
    result = cli("tokenize", "show", "Hello world", "-t", folders["minilm"], "--json")
    assert result.code == 0, result.stderr
    ids = [token["id"] for token in json.loads(result.stdout)["tokens"]]
    assert ids == _theirs(folders["minilm"])("Hello world", add_special_tokens=False)["input_ids"] and 0 not in ids


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_varied_text_encodes_and_decodes_as_transformers(folders, layout):
    ours, theirs = TextTokenizer.load(folders[layout]), _theirs(folders[layout])
    for text in TEXTS:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
        ids = theirs(text)["input_ids"]  # with the post-processor's special tokens ([CLS] ... [SEP], </s>)
        for skip in (False, True):
            whole = theirs.decode(ids, skip_special_tokens=skip)
            assert ours.decode(ids, skip_special_tokens=skip) == whole, (text, skip)
            assert ours.decode_batch([ids, ids[:3]], skip_special_tokens=skip) == [whole, theirs.decode(ids[:3], skip_special_tokens=skip)]
            assert "".join(_streamed(ours, [], ids, skip)) == whole, (text, skip)
            for cut in sorted({1, len(ids) // 3, len(ids) // 2, len(ids) - 1}):
                prompt = theirs.decode(ids[:cut], skip_special_tokens=skip)
                if whole.startswith(prompt):  # else the clean-up takes out a space the prompt's text ends with
                    assert "".join(_streamed(ours, ids[:cut], ids[cut:], skip)) == whole[len(prompt) :], (text, cut, skip)


@pytest.mark.parametrize("layout, cleans", [("minilm", True), ("t5", True), ("words", True), ("wordpiece-no-decoder-cleanup", True), ("gpt2", False)])
def test_clean_up_tokenization_spaces_is_honoured_as_transformers_applies_it(folders, layout, cleans, tmp_path):
    """The clean-up changes these texts (so a decoder without it fails), and never a BPE's: transformers 5
    skips it there ("destructive for BPE"), unless clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output."""
    ours, theirs = TextTokenizer.load(folders[layout]), _theirs(folders[layout])
    assert ours.cleans_up_spaces is cleans
    ids = ours.encode(TEXTS[1])
    library = ours.hf.decode(ids)
    assert ours.decode(ids) == theirs.decode(ids)
    if layout in ("t5", "words", "wordpiece-no-decoder-cleanup"):
        assert ours.decode(ids) != library  # the library alone leaves " ," " ?" " n't": transformers cleans them up
    if layout == "t5":
        dots = ours.encode("dash ... ellipsis")
        assert ours.decode(dots) == theirs.decode(dots) == "dash... ellipsis" != ours.hf.decode(dots)
    pieces = _streamed(ours, [], ids, True)
    assert "".join(pieces) == ours.decode(ids, skip_special_tokens=True)
    if layout == "gpt2":
        forced = shutil.copytree(folders[layout], tmp_path / "forced")
        config = json.loads((forced / "tokenizer_config.json").read_text())
        config["clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"] = True
        (forced / "tokenizer_config.json").write_text(json.dumps(config))
        ours, theirs = TextTokenizer.load(forced), _theirs(forced)
        assert ours.cleans_up_spaces and ours.decode(ids) == theirs.decode(ids) != library


def _roberta_like(folder: Path, config: dict | None = None) -> Path:
    """Byte-level BPE with RoBERTa's <mask> (lstrip) and added tokens that are not special, one per flag."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False, special=True)])
    tokenizer.add_tokens(
        [
            AddedToken("<sep>", lstrip=True, rstrip=True, normalized=False),  # eats the spaces on both sides
            AddedToken("[x]", rstrip=True, normalized=False),
            AddedToken("ok", single_word=True),  # only as a whole word: not inside "okay" or "book"
            AddedToken("HeLLo", normalized=False),
        ]
    )
    base = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "mask_token": "<mask>"}
    return _save(tokenizer, folder, base | (config or {}))


ADDED_TEXTS = ["hello <sep> world", "a<sep>b", "x  [x]   y", "ok okay ok, book ok", "HeLLo hello HELLO", "the <mask> fox", "a <mask><sep> b", "café <sep> 東京"]


def test_added_tokens_strip_and_match_as_transformers(tmp_path):
    """lstrip/rstrip/single_word/normalized are applied by the library itself, from the file's added tokens: tfcli's
    encode (special-token text as text) equals transformers' with split_special_tokens, and special-token text
    read as the tokens (as a chat template's markers are) equals transformers' default. This held before issue
    44's fix too; it pins it (a tokenizer rebuilt without the file's added tokens, or their flags, fails it)."""
    folder = _roberta_like(tmp_path / "roberta")
    ours, split, theirs = TextTokenizer.load(folder), _theirs(folder, split_special_tokens=True), _theirs(folder)
    sep = ours.hf.token_to_id("<sep>")
    assert sep in ours.encode("hello <sep> world") and " " not in ours.decode(ours.encode("a <sep> b"))  # both spaces went with it
    for text in ADDED_TEXTS:
        ids = ours.encode(text)
        assert ids == split(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids) == theirs.decode(ids)
        template = ChatTemplate("{% for m in messages %}" + text.replace("{", "") + "{{ m.content }}{% endfor %}", ours, "a test template")
        assert template.prompt_ids([Message("user", "!")]) == theirs(text + "!", add_special_tokens=False)["input_ids"], text
    mask = ours.hf.token_to_id("<mask>")
    read = ChatTemplate("the <mask> fox", ours, "t").prompt_ids([])
    assert read == [*ours.encode("the"), mask, *ours.encode(" fox")]  # <mask> took the space before it (lstrip)


@pytest.mark.parametrize("listed", [True, False])
def test_tokenizer_config_added_tokens_are_applied_over_the_file_as_transformers_applies_them(tmp_path, listed):
    """transformers adds tokenizer_config.json's added tokens again over tokenizer.json's (TokenizersBackend.
    __init__): every added_tokens_decoder entry (here: <sep> without its strips), or without that key every added
    token of tokenizer.json; then each named special token not added yet, as special (here: "the", an ordinary
    vocabulary token, as eos); a re-added entry a named token names turns special (here: "[x]", added but not
    special, as pad: special only where no added_tokens_decoder leaves it out). The library reads tokenizer.json only."""
    probe = _roberta_like(tmp_path / "probe")
    library = Tokenizer.from_file(str(probe / "tokenizer.json"))
    sep, the, x = library.token_to_id("<sep>"), library.token_to_id("the"), library.token_to_id("[x]")
    assert the is not None
    entry = {"content": "<sep>", "lstrip": False, "rstrip": False, "normalized": False, "single_word": False, "special": False}
    config = {"eos_token": "the", "pad_token": "[x]"} | ({"added_tokens_decoder": {str(sep): entry}} if listed else {})
    folder = _roberta_like(tmp_path / "over", config)
    ours, theirs = TextTokenizer.load(folder), _theirs(folder, split_special_tokens=True)
    for text in ADDED_TEXTS:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
    if listed:  # the entry's flags won: <sep> keeps the spaces around it
        assert ours.encode("hello <sep> world") != library.encode("hello <sep> world").ids
    assert ours.special_ids["eos"] == the and ours.vocab_size == library.get_vocab_size()  # no id added
    mixed = [*ours.encode("hello world"), the, *ours.encode(" fox"), x, *ours.encode(" dog")]
    for skip in (False, True):
        assert ours.decode(mixed, skip_special_tokens=skip) == theirs.decode(mixed, skip_special_tokens=skip)
        assert "".join(_streamed(ours, [], mixed, skip)) == theirs.decode(mixed, skip_special_tokens=skip)
    assert ours.decode(mixed, skip_special_tokens=True) == ("hello world fox[x] dog" if listed else "hello world fox dog")


def _bert_folder(folder: Path) -> Path:
    """An HF folder as sentence-transformers' all-MiniLM-L6-v2 has it: a BertModel, tokenizer.json padded
    and truncated, tokenizer_config.json naming BertTokenizer."""
    torch = pytest.importorskip("torch")
    minilm_like(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text()) | {"tokenizer_class": "BertTokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64
    )
    transformers.BertModel(hf_config).save_pretrained(str(folder), safe_serialization=True)
    return folder


def test_import_writes_the_tokenizer_without_padding_or_truncation(cli, tmp_path):
    source = _bert_folder(tmp_path / "hf")
    result = cli("import", source, "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    written = json.loads((tmp_path / "run" / "tokenizer.json").read_text(encoding="utf-8"))
    assert written["padding"] is None and written["truncation"] is None
    original = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in written.items() if k not in ("padding", "truncation")} == {k: v for k, v in original.items() if k not in ("padding", "truncation")}
    library = Tokenizer.from_file(str(tmp_path / "run" / "tokenizer.json"))  # any other tool reading the run's file
    assert library.encode("Hello world", add_special_tokens=False).ids == _theirs(source)("Hello world", add_special_tokens=False)["input_ids"]
    shown = cli("tokenize", "show", "Hello world", "-t", tmp_path / "run", "--json")
    ids = [token["id"] for token in json.loads(shown.stdout)["tokens"]]
    assert ids == _theirs(source)("Hello world", add_special_tokens=False)["input_ids"] and 0 not in ids
    assert _theirs(tmp_path / "run")("Hello world")["input_ids"] == _theirs(source)("Hello world")["input_ids"]
    # a tokenizer.json without padding or truncation is copied as it is, byte for byte
    plain = Tokenizer.from_file(str(source / "tokenizer.json"))
    plain.no_padding()
    plain.no_truncation()
    plain.save(str(source / "tokenizer.json"))
    assert cli("import", source, "-o", tmp_path / "plain").code == 0
    assert (tmp_path / "plain" / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
