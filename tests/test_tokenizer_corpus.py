"""Real tokenizer.json files of many model families (issue 44), read by tfcli and by transformers and compared.

Nothing here is committed: the files are made at test time from legitimate sources, once per test cache.
- Real vocabularies: llama.cpp's vocabulary-only GGUF files (models/ggml-vocab-*.gguf, with its test vectors), taken from
  the llama-cpp-python sdist the lock pins (llama-cpp-python 0.3.36, sha256
  832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e in requirements/test.txt; llama.cpp's files, MIT
  licence; the `llama_cpp_models` fixture, tests/llama_cpp_sdist.py), each turned into a tokenizer.json by transformers'
  own GGUF converter and written by its save_pretrained (`tests.llama_cpp_sdist.converted`).
- Built with the `tokenizers` library for what the fixes need: a CLIP tokenizer (transformers' CLIPTokenizer over a
  BPE trained with the end-of-word suffix "</w>" on sample_data), a sentence-transformers style WordPiece file (BERT
  uncased's vocabulary, from llama.cpp's bert-bge GGUF, saved with padding and truncation on), a Phi-3 file whose
  tokenizer_config.json names LlamaTokenizer (as Phi-3's own does), and a Phi-3 file with "<s>" marked normalized.

Each folder is loaded once: by tfcli as a run loads a tokenizer.json (`TextTokenizer.load`), by tfcli through an
imported Hugging Face folder (`import_tokenizer`, the files a run gets), and by `transformers.AutoTokenizer`. On varied
text (ASCII, accents, CJK, emoji, code, whitespace runs, each file's special tokens in the text) the ids, the decoded
text with and without special tokens, and streamed pieces joined must be equal.

Where transformers disagrees with the file and llama.cpp, tfcli follows the file, and the test says so:
- A file whose tokenizer_config.json names `LlamaTokenizer` (Phi-3's, every Llama-2-style file): transformers 5 does
  not read the file's pipeline; LlamaTokenizer.__init__ rebuilds the tokenizer from its vocabulary and merges with a
  Metaspace pre-tokenizer (prepend_scheme "first", split off), which prepends no "▁" to a text that starts with a
  space. SentencePiece, the file's own normalizer (Prepend "▁", then Replace " " by "▁") and llama.cpp always prepend
  it: "   hi" is "▁▁▁▁hi" to them and "▁▁▁hi" to transformers. llama.cpp's test vectors for Phi-3 are the oracle: tfcli
  matches all 46, transformers 31 (`LLAMA_CPP_MATCHED`).
- transformers' GGUF converter writes Llama 2's vocabulary (llama-spm) with that same Metaspace (its file says so, so
  tfcli and transformers agree on it), a byte-level file of a pre-tokenizer it has no regex for (falcon, starcoder,
  deepseek-coder, ...) with GPT-2's, and Llama 3's without its ignore_merges: those files differ from llama.cpp on
  some strings (`LLAMA_CPP_MATCHED`), which tfcli's own GGUF import does not (tests/test_gguf_vocab_vectors.py).
Where the file alone is not what transformers gives, tfcli follows transformers:
- CLIP: the file's decoder (ByteLevel) leaves the end-of-word "</w>" in the text; transformers' CLIPTokenizer wraps
  decode to make it a space and strip the text. tfcli gives the file that decoder when it loads it and writes it
  into an imported run's tokenizer.json (`tfcli.tokenizer.core.decoder_for_word_suffix`).
- Special tokens marked `normalized` in a file with a normalizer (Llama 2's legacy files): the library's
  decode(skip_special_tokens=True) keeps them ("<s> Hello"), transformers' rebuilt Llama tokenizer leaves them out,
  and so does tfcli (`TextTokenizer.kept_ids`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tests.llama_cpp_sdist import converted, vectors
from tfcli.errors import TfcliError
from tfcli.hf.tokenizer import import_tokenizer
from tfcli.tokenizer.chat_template import ChatTemplate
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.detokenize import IncrementalDecoder

transformers = pytest.importorskip("transformers")

SAMPLE_TEXT = Path(__file__).parents[1] / "sample_data" / "corpus" / "stories.txt"

# llama.cpp's vocabulary (ggml-vocab-NAME.gguf) as transformers' GGUF converter writes it -> the family it stands for
CONVERTED = {
    "gpt-2": "GPT-2: byte-level BPE",
    "llama-bpe": "Llama 3: byte-level BPE, its regex, 128k pieces",
    "phi-3": "Phi-3: SentencePiece-style BPE with byte fallback, Prepend and Replace normalizer, added tokens",
    "llama-spm": "Llama 2: SentencePiece-style BPE with byte fallback, Metaspace (transformers' LlamaTokenizer)",
    "deepseek-coder": "DeepSeek Coder: byte-level BPE, fill-in-the-middle tokens",
}
# More families, each a few seconds of CPU to read three times: with TFCLI_TOKENIZER_CORPUS=all (they passed on
# 2026-11-28 with transformers 5.24.0)
MORE = {
    "qwen2": "Qwen2: byte-level BPE, digits one by one, 151k pieces",
    "baichuan": "Baichuan: SentencePiece-style BPE with byte fallback, 64k pieces",
    "falcon": "Falcon: byte-level BPE (GPT-2's regex in transformers' converter)",
    "starcoder": "StarCoder 2: byte-level BPE with code's special tokens",
    "gemma-4": "Gemma 4: BPE over UTF-8 with spaces as ▁, byte fallback, 262k pieces (transformers' GemmaTokenizer)",
    "nomic-bert-moe": "nomic-embed (XLM-R's): Unigram (SentencePiece), 250k pieces (transformers' T5Tokenizer)",
}
# Converted files tfcli refuses, and the words of its one-line refusal. transformers' converter respells a token
# outside the byte-level alphabet by its bytes, and some respelled tokens land on tokens already there, so the file's
# ids have holes: MPT's run to 50,431 over 50,409 entries, Command-R's to 255,999 over 255,957. transformers loads such
# a file and reads a hole as a missing id (decoded as ""). tfcli keeps its refusal, because the holes are tokens the
# converter lost, not ids nobody uses: MPT's whitespace runs ("ĠĠ", id 245 in the GGUF) now spell the added tokens at
# 50,276 and up, so the file no longer tokenizes as the model was trained: transformers gives llama.cpp's ids on 41 of
# its 46 MPT vectors ("  Hello": [209, 24387] for [50276, 12092]), 45 of 46 for Command-R, where tfcli's own GGUF import
# of the same vocabulary gives all 46 (tests/test_gguf_vocab_vectors.py). A tokenizer whose ids have holes would also
# need a model sized past its vocabulary, which tfcli sizes by the tokenizer. (name -> the refusal's words, and the
# vectors transformers matches)
REFUSED = {"mpt": ("gives the token id 50,431, past its vocabulary of 50,409 tokens", 41)}
if os.environ.get("TFCLI_TOKENIZER_CORPUS") == "all":
    CONVERTED |= MORE
    REFUSED["command-r"] = ("gives the token id 255,999, past its vocabulary of 255,957 tokens", 45)
# Files built at test time (the module docstring) -> what they stand for
BUILT = {
    "clip": "CLIP: lower-cased byte-level BPE with an end-of-word suffix",
    "all-minilm-style": "sentence-transformers (all-MiniLM-L6-v2's layout): WordPiece saved with padding and truncation on",
    "phi-3-llama-class": "Phi-3 as its repository saves it: tokenizer_config.json names LlamaTokenizer",
}
CORPUS = {**CONVERTED, **BUILT}
# Files whose tokenizer_class transformers 5 rebuilds with a pipeline other than the file's (see the module docstring).
REBUILT_BY_TRANSFORMERS = {"phi-3-llama-class"}
# corpus file -> (llama.cpp's vocabulary, strings of its vectors the file gives as llama.cpp does: tfcli, transformers)
LLAMA_CPP_MATCHED = {
    "phi-3": ("phi-3", 46, 46),
    "phi-3-llama-class": ("phi-3", 46, 31),
    "gpt-2": ("gpt-2", 46, 46),
    "llama-bpe": ("llama-bpe", 45, 45),  # no ignore_merges in the converter's file, which Llama 3's has: "Cửa Việt"
    "qwen2": ("qwen2", 46, 46),
    "gemma-4": ("gemma-4", 46, 46),
    "llama-spm": ("llama-spm", 31, 31),  # Metaspace "first": no "▁" before a text that starts with a space
    "falcon": ("falcon", 37, 37),  # GPT-2's regex, not Falcon's (punctuation runs, digits by three)
    "starcoder": ("starcoder", 45, 45),  # GPT-2's regex, not StarCoder's digits one by one: "ied 4 ½ months"
    "deepseek-coder": ("deepseek-coder", 45, 45),  # GPT-2's regex, not DeepSeek Coder's: "ied 4 ½ months"
}

TEXTS = [
    "Hello world",
    "Don't stop , ok ? It's 3.5 ... yes ! They're here , we've won . I 'm sure n't",
    "The café was naïve; the résumé said déjà vu. Ωμέγα, straße, ÅNGSTRÖM.",
    "東京へ行きました。你好，世界！ 한국어",
    "emoji 😀👍🏽🦊🎉 ok",
    "def f(x):\n\treturn {'a': x  +  1}  # code, [1, 2]\n        if y:\n            pass",
    "   whitespace   runs\n\n\t  end   ",
    " leading space and trailing ",
    "dash ... ellipsis -- «quotes» „Anführung“ — 1,234.56 €",
]


@dataclasses.dataclass
class Loaded:
    """One corpus file as the three readers have it."""

    folder: Path  # the source folder
    ours: TextTokenizer  # tfcli, the file read as a run reads it
    run: TextTokenizer  # tfcli, the tokenizer an imported run got
    theirs: object  # transformers.AutoTokenizer

    def specials(self) -> list[str]:
        """A few of the file's special tokens: those tokenizer_config.json names, then the file's own."""
        named = [token for token in self.theirs.all_special_tokens if token]
        added = self.ours.hf.get_added_tokens_decoder()
        marked = [added[i].content for i in sorted(added) if added[i].special]
        return list(dict.fromkeys(named[:4] + marked[:4]))

    def texts(self) -> list[str]:
        return TEXTS + [f"a {token} b{token}c" for token in self.specials()]


def _clip(folder: Path) -> None:
    """transformers' CLIPTokenizer over a BPE trained with CLIP's pipeline on sample_data, saved by save_pretrained."""
    from tokenizers import pre_tokenizers, trainers

    probe = transformers.CLIPTokenizer()  # CLIP's normalizer, split and byte-level pre-tokenizer, "</w>" BPE
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=["<|startoftext|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        end_of_word_suffix="</w>",
        show_progress=False,
    )
    backend = probe.backend_tokenizer
    backend.train_from_iterator(SAMPLE_TEXT.read_text(encoding="utf-8")[:40_000].splitlines() + TEXTS, trainer)
    spec = json.loads(backend.to_str())
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]]
    transformers.CLIPTokenizer(vocab=spec["model"]["vocab"], merges=merges).save_pretrained(str(folder))


def _all_minilm_style(models: Path, folder: Path) -> None:
    """BERT uncased's WordPiece (llama.cpp's bert-bge vocabulary, spelled back as BERT's vocab.txt spells it: a word's
    start without its "▁", a continuation after "##") saved as sentence-transformers saves all-MiniLM-L6-v2's:
    padded to a multiple of 8 and cut at 256 ids, no tokenizer_config.json."""
    from tokenizers.implementations import BertWordPieceTokenizer

    from tfcli.gguf.reader import read_gguf

    metadata = read_gguf(models / "ggml-vocab-bert-bge.gguf").metadata
    vocab = {}
    for i, token in enumerate(metadata["tokenizer.ggml.tokens"]):
        bracketed = token.startswith("[") and token.endswith("]")
        vocab.setdefault(token if bracketed else token[1:] if token.startswith("\u2581") else f"##{token}", i)
    tokenizer = BertWordPieceTokenizer(vocab, lowercase=True)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=8)
    tokenizer.enable_truncation(max_length=256)
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))


def _source(name: str, models: Path, cache: Path, root: Path) -> Path:
    if name in CONVERTED:
        return converted(models, name, cache)
    folder = root / name
    if name == "clip":
        _clip(folder)
    elif name == "all-minilm-style":
        _all_minilm_style(models, folder)
    else:  # phi-3-llama-class
        shutil.copytree(converted(models, "phi-3", cache), folder)
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizer"}), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def corpus(llama_cpp_models, tmp_path_factory) -> dict[str, Loaded]:
    """Every corpus file made (or taken from the cache) and loaded once, by each reader."""
    cache = Path(os.environ["TFCLI_CACHE_DIR"])
    root = tmp_path_factory.mktemp("corpus")
    loaded = {}
    for name in CORPUS:
        folder = _source(name, llama_cpp_models, cache, root / "source")
        run_dir = root / "runs" / name
        run_dir.mkdir(parents=True)
        run, _ = import_tokenizer(folder, run_dir)
        loaded[name] = Loaded(folder, TextTokenizer.load(folder), run, transformers.AutoTokenizer.from_pretrained(str(folder)))
    return loaded


def streamed(tokenizer: TextTokenizer, context: list[int], ids: list[int], skip: bool) -> str:
    decoder = IncrementalDecoder(tokenizer, context, skip_special_tokens=skip)
    return "".join([decoder.extend([i]) for i in ids] + [decoder.finish()])


def test_every_converted_file_is_the_converters(corpus):
    """The converted folders are transformers' (its save_pretrained's files), and the built ones are what they say."""
    for name in CONVERTED:
        config = json.loads((corpus[name].folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        assert config["tokenizer_class"] == "TokenizersBackend", name
    assert json.loads((corpus["clip"].folder / "tokenizer_config.json").read_text(encoding="utf-8"))["tokenizer_class"] == "CLIPTokenizer"
    assert type(corpus["phi-3-llama-class"].theirs).__name__ == "LlamaTokenizer"
    if "nomic-bert-moe" in corpus:  # TFCLI_TOKENIZER_CORPUS=all
        assert json.loads((corpus["nomic-bert-moe"].folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["type"] == "Unigram"


@pytest.mark.parametrize("name", list(CORPUS))
def test_ids_equal_transformers(corpus, name):
    """Special-token text in user text is ordinary text (tfcli's encode): transformers with split_special_tokens."""
    case = corpus[name]
    differ = []
    for text in case.texts():
        ours = case.ours.encode(text)
        theirs = case.theirs(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert case.run.encode(text) == ours, text  # the imported run encodes as the file does
        if ours != theirs:
            differ.append(text)
            library = Tokenizer.from_file(str(case.folder / "tokenizer.json"))
            library.encode_special_tokens = True
            assert ours == library.encode(text, add_special_tokens=False).ids, text  # tfcli follows the file
    if name in REBUILT_BY_TRANSFORMERS:  # exactly the texts that start with a space: no "▁" prepended by transformers
        assert differ == [text for text in case.texts() if text[:1].isspace()]
    else:
        assert differ == []


@pytest.mark.parametrize("name", list(CORPUS))
def test_special_tokens_read_as_tokens_equal_transformers(corpus, name):
    """Special-token text read as the tokens (as a chat template's markers are), with each token's lstrip/rstrip/
    single_word/normalized as the file and tokenizer_config.json give them: transformers' default encode."""
    case = corpus[name]
    for text in case.texts()[len(TEXTS) :] + ["x " + "".join(case.specials()) + " y"]:
        ids = ChatTemplate(text, case.ours, "a test template").prompt_ids([])
        theirs = case.theirs(text, add_special_tokens=False)["input_ids"]
        if name in REBUILT_BY_TRANSFORMERS:  # the text after a special token starts anew: "▁" or not, as above
            library = Tokenizer.from_file(str(case.folder / "tokenizer.json"))
            assert ids == library.encode(text, add_special_tokens=False).ids, text
        else:
            assert ids == theirs, text


@pytest.mark.parametrize("name", list(CORPUS))
def test_decode_and_streamed_decode_equal_transformers(corpus, name):
    """The ids transformers gives (its post-processor's special tokens, special tokens in the text read as tokens)
    decode to transformers' text, with and without special tokens; streamed pieces, from the start and after a
    context, join to the same text; the imported run decodes alike."""
    case = corpus[name]
    for text in case.texts():
        ids = case.theirs(text)["input_ids"]
        for skip in (False, True):
            whole = case.theirs.decode(ids, skip_special_tokens=skip)
            assert case.ours.decode(ids, skip_special_tokens=skip) == whole, (text, skip)
            assert case.run.decode(ids, skip_special_tokens=skip) == whole, (text, skip)
            assert case.ours.decode_batch([ids, ids[:2]], skip_special_tokens=skip)[0] == whole
            assert streamed(case.ours, [], ids, skip) == whole, (text, skip)
            for cut in sorted({1, len(ids) // 2, len(ids) - 1} - {0}):
                prompt = case.theirs.decode(ids[:cut], skip_special_tokens=skip)
                if whole.startswith(prompt):  # else a decoder rule at the start of a text (Strip, clean-up) moves the seam
                    assert streamed(case.ours, ids[:cut], ids[cut:], skip) == whole[len(prompt) :], (text, cut, skip)


@pytest.mark.parametrize("name", list(CORPUS))
def test_the_imported_run_carries_the_tokenizer_it_uses(corpus, name):
    """The run's tokenizer.json has no padding or truncation, and the library alone (any other tool) reads it as tfcli
    does: the same ids, and the same text where transformers' space clean-up does not apply."""
    case = corpus[name]
    written = json.loads((case.run.path).read_text(encoding="utf-8"))
    assert written["padding"] is None and written["truncation"] is None
    library = Tokenizer.from_file(str(case.run.path))
    for text in TEXTS:
        ids = case.run.encode(text)
        assert library.encode(text, add_special_tokens=False).ids == ids
        if not case.run.cleans_up_spaces:
            assert library.decode(ids, skip_special_tokens=False) == case.run.decode(ids), text


def test_padding_and_truncation_in_a_real_file_are_off(corpus):
    """The sentence-transformers layout: padded to a multiple of 8, cut at 256 ids. The library pads "Hello world"
    to 8 ids; tfcli and transformers give its 2, and a thousand words all their ids."""
    case = corpus["all-minilm-style"]
    saved = json.loads((case.folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert saved["padding"] and saved["truncation"]
    library = Tokenizer.from_file(str(case.folder / "tokenizer.json"))
    assert len(library.encode("Hello world", add_special_tokens=False).ids) > 2
    assert case.ours.encode("Hello world") == case.theirs("Hello world", add_special_tokens=False)["input_ids"] == [7592, 2088]
    long = " ".join(["hello", "world", "fox", "café"] * 250)
    assert len(case.ours.encode(long)) == 1000 == len(case.theirs(long, add_special_tokens=False)["input_ids"])


def test_tokenize_show_on_the_issues_file(cli, corpus):
    """The issue's example: `tfcli tokenize show "Hello world"` on all-MiniLM-L6-v2's file gave [7592, 2088, 0, 0, 0, 0, 0, 0]."""
    result = cli("tokenize", "show", "Hello world", "-t", corpus["all-minilm-style"].folder, "--json")
    assert result.code == 0, result.stderr
    assert [token["id"] for token in json.loads(result.stdout)["tokens"]] == [7592, 2088]


def test_clip_decodes_without_its_end_of_word_suffix(corpus):
    """The fix for CLIP's file (module docstring): the library alone leaves "</w>" in the text."""
    case = corpus["clip"]
    ids = case.theirs("a little fox in the park")["input_ids"]
    assert "</w>" in Tokenizer.from_file(str(case.folder / "tokenizer.json")).decode(ids)
    want = "a little fox in the park"
    assert case.ours.decode(ids, skip_special_tokens=True) == case.theirs.decode(ids, skip_special_tokens=True) == want
    assert Tokenizer.from_file(str(case.run.path)).decode(ids, skip_special_tokens=True) == want  # the run's file
    from_run = transformers.AutoTokenizer.from_pretrained(str(case.run.path.parent))  # and transformers reading the run
    assert from_run(want)["input_ids"] == ids and from_run.decode(ids) == case.theirs.decode(ids)


def test_normalized_special_tokens_are_skipped_as_transformers_skips_them(corpus, tmp_path):
    """Phi-3's file with "<s>" marked normalized, as Llama 2's legacy files have it: the library's
    decode(skip_special_tokens=True) keeps it, transformers (and tfcli, by id) leaves it out."""
    source = corpus["phi-3-llama-class"].folder
    folder = shutil.copytree(source, tmp_path / "legacy")
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    for token in spec["added_tokens"]:
        if token["content"] == "<s>":
            token["normalized"] = True
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    ours, theirs = TextTokenizer.load(folder), corpus["phi-3-llama-class"].theirs  # transformers rebuilds it: the flag is not read
    ids = [1, *ours.encode("Hello world")]
    assert Tokenizer.from_file(str(folder / "tokenizer.json")).decode(ids, skip_special_tokens=True).startswith("<s>")
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True) == "Hello world"
    assert streamed(ours, [], ids, True) == "Hello world"


@pytest.mark.parametrize("name", [name for name in LLAMA_CPP_MATCHED if name in CORPUS])
def test_llama_cpp_test_vectors_are_the_oracle(corpus, llama_cpp_models, name):
    """llama.cpp's ids for its own copy of the vocabulary: how many strings the file gives as llama.cpp does, read by
    tfcli and by transformers (the module docstring says where and why they fall short)."""
    case = corpus[name]
    vocab, ours_matched, theirs_matched = LLAMA_CPP_MATCHED[name]
    inputs, expected = vectors(llama_cpp_models, vocab)
    ours = [case.ours.encode(text) == want for text, want in zip(inputs, expected)]
    theirs = [case.theirs(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] == want for text, want in zip(inputs, expected)]
    print(f"\n{name}: llama.cpp's {vocab} vectors: tfcli {sum(ours)}/{len(inputs)}, transformers {sum(theirs)}/{len(inputs)}")
    assert (sum(ours), sum(theirs)) == (ours_matched, theirs_matched)
    if name in REBUILT_BY_TRANSFORMERS or name == "llama-spm":  # Metaspace "first": exactly the texts that start with " "
        assert [text for text, ok in zip(inputs, theirs) if not ok] == [text for text in inputs if text.startswith(" ")]


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_converted_file_tfcli_refuses_is_one_line(cli, llama_cpp_models, name):
    """A file whose ids have holes: transformers loads it, and its ids are not llama.cpp's (the REFUSED comment)."""
    folder = converted(llama_cpp_models, name, Path(os.environ["TFCLI_CACHE_DIR"]))
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    inputs, expected = vectors(llama_cpp_models, name)
    matched = sum(theirs(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] == ids for text, ids in zip(inputs, expected))
    words, transformers_matched = REFUSED[name]
    assert (matched, len(inputs)) == (transformers_matched, 46), f"transformers now matches {matched}/{len(inputs)} of llama.cpp's {name} vectors"
    result = cli("tokenize", "show", "Hello", "-t", folder)
    assert result.code == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2 and words in result.stderr


def test_the_converted_file_is_what_auto_tokenizer_builds(corpus, llama_cpp_models):
    """`converted` calls transformers' GGUF converter through PreTrainedTokenizerFast; AutoTokenizer, the usual door,
    builds the same tokenizer (after reading the file's model config, which takes it seconds on a large vocabulary)."""
    auto = transformers.AutoTokenizer.from_pretrained(str(llama_cpp_models), gguf_file="ggml-vocab-deepseek-coder.gguf")
    assert json.loads(auto.backend_tokenizer.to_str()) == json.loads(corpus["deepseek-coder"].theirs.backend_tokenizer.to_str())


def test_a_file_the_library_refuses_is_one_line(cli, corpus, tmp_path):
    """A file `tokenizers` cannot read (its merges written as {}, an object, as Microsoft's trimmed Phi-3 test file has
    them): tfcli refuses it in one line; transformers' LlamaTokenizer rebuilds it from the vocabulary alone, without
    merges, and encodes "Hello world" a character a piece."""
    folder = shutil.copytree(corpus["phi-3-llama-class"].folder, tmp_path / "no-merges")
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["merges"] = {}
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    words = "data did not match any variant"
    with pytest.raises(TfcliError, match=words):
        TextTokenizer.load(folder)
    with pytest.raises(Exception, match=words):  # noqa: PT011 - the library's plain Exception
        Tokenizer.from_file(str(folder / "tokenizer.json"))
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert theirs.convert_ids_to_tokens(theirs("Hello world", add_special_tokens=False)["input_ids"]) == list("▁Hello▁world")
    result = cli("tokenize", "show", "Hello", "-t", folder)
    assert result.code == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2 and words in result.stderr
