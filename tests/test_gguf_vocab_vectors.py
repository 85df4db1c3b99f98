"""llama.cpp's own tokenizer test vectors as the oracle for the tokenizers tfcli rebuilds from GGUF metadata (issue 44).

The data: every vocabulary-only GGUF file in llama.cpp's models/ folder (ggml-vocab-*.gguf) with its .inp (inputs, each
followed by a "\\n__ggml_vocab_test__\\n" line) and .out (the expected ids, one line an input), taken at test time from
the llama-cpp-python sdist the lock pins (llama-cpp-python 0.3.36, sha256
832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e in requirements/test.txt; llama.cpp's files, MIT
licence, "Copyright (c) 2023-2026 The ggml authors"): the `llama_cpp_models` fixture, tests/llama_cpp_sdist.py. Nothing
of it is committed. They are read as llama.cpp's tests/test-tokenizer-0.cpp reads them, and encoded as it encodes them:
`common_tokenize(ctx, text, add_special=false, parse_special=false)`, so no bos and special-token text stays ordinary
text, which is what `TextTokenizer.encode` does. A vocabulary without vectors (aquila, baichuan, gpt-neox) is held to
the llama.cpp that llama-cpp-python ships (the same version, so the same code) on those inputs and more.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gguf_files import gguf_copy, new_gguf
from tests.helpers import require
from tests.llama_cpp_sdist import pinned, vectors
from tfcli.errors import TfcliError
from tfcli.gguf.reader import read_gguf
from tfcli.gguf.vocab import Vocab
from tfcli.tokenizer.core import TextTokenizer

# Strings that give llama.cpp's ids exactly, per vocabulary: its own vectors (46 strings each, qwen35 50), or for a
# vocabulary without them its inputs and tests/test_gguf.py's VARIED (53 strings) tokenized by the installed llama.cpp.
# A change here is a regression or an improvement: set it to the new count and say what differs.
MATCHED = {
    "aquila": 53,  # gpt2, no pre: llama.cpp's 'default' regexes (no vectors: the installed llama.cpp)
    "baichuan": 53,  # llama (SentencePiece-style, byte fallback; no vectors: the installed llama.cpp)
    "bert-bge": 46,  # bert (WordPiece: NFD, lowercased, accents stripped as llama.cpp's WPM strips them)
    "command-r": 46,  # gpt2, pre command-r (starcoder's split)
    "deepseek-coder": 46,  # gpt2, pre deepseek-coder
    "deepseek-llm": 46,  # gpt2, pre deepseek-llm
    "falcon": 46,  # gpt2, pre falcon
    "gemma-4": 46,  # gemma4: BPE over UTF-8, spaces as U+2581, split at newlines, byte fallback
    "gpt-2": 46,  # gpt2, pre gpt-2
    "gpt-neox": 53,  # gpt2, no pre: llama.cpp's 'default' regexes (no vectors: the installed llama.cpp)
    "llama-bpe": 46,  # gpt2, pre llama-bpe (Llama 3: ignore_merges)
    "llama-spm": 46,  # llama (SentencePiece-style, byte fallback)
    "mpt": 46,  # gpt2, pre mpt
    "nomic-bert-moe": 53,  # t5 (Unigram), <s> first and </s> last with special tokens (no vectors: the installed llama.cpp)
    "phi-3": 46,  # llama (SentencePiece-style)
    "qwen2": 46,  # gpt2, pre qwen2
    "qwen35": 50,  # gpt2, pre qwen35
    "refact": 46,  # gpt2, pre refact
    "starcoder": 46,  # gpt2, pre starcoder
}

# Vocabularies tfcli refuses: the words its one-line refusal must hold (none since add_eos_token is read: nomic-bert-moe).
REFUSED: dict[str, str] = {}


def _names(models: Path) -> list[str]:
    return sorted(path.name[len("ggml-vocab-") : -len(".gguf")] for path in models.glob("ggml-vocab-*.gguf"))


def _tokenizer(path: Path, folder: Path, block_size: int = 2048) -> tuple[TextTokenizer, Vocab]:
    vocab = Vocab(read_gguf(path).metadata, str(path))
    (folder / "tokenizer.json").write_text(vocab.tokenizer_json(), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(vocab.tokenizer_config(block_size)), encoding="utf-8")
    return TextTokenizer.load(folder), vocab


def test_every_vocabulary_is_accounted_for(llama_cpp_models):
    assert _names(llama_cpp_models) == sorted({*MATCHED, *REFUSED})
    assert (llama_cpp_models / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    version, hashes = pinned()
    assert f"llama-cpp-python {version}, sha256\n{hashes[0]}" in __doc__, "the docstring's provenance is not the lock's pin"


@pytest.mark.parametrize("name", sorted({*MATCHED, *REFUSED}))
def test_llama_cpp_vectors(tmp_path, llama_cpp_models, name):
    path = llama_cpp_models / f"ggml-vocab-{name}.gguf"
    try:
        tokenizer, vocab = _tokenizer(path, tmp_path)
    except TfcliError as exc:
        assert name in REFUSED, f"{name}: refused ({exc})"
        assert "\n" not in str(exc), f"{name}: the refusal is more than one line: {exc!r}"
        assert REFUSED[name] in str(exc), f"{name}: the refusal does not name the reason: {exc}"
        print(f"\n{name}: refused: {exc}")
        return
    assert name not in REFUSED, f"{name}: tfcli now rebuilds it; move it to MATCHED"
    given = vectors(llama_cpp_models, name)
    if given is None:  # no vectors: llama.cpp's common inputs and VARIED, tokenized by the installed llama.cpp
        from tests.test_gguf import VARIED, _llama_cpp

        llm = _llama_cpp().Llama(model_path=str(path), vocab_only=True, verbose=False)
        inputs = vectors(llama_cpp_models, "gpt-2")[0] + VARIED
        expected = [llm.tokenize(text.encode(), add_bos=False, special=False) for text in inputs]
        # with special tokens (llama_tokenize(add_special=true), what llama-cpp-python's completions feed the model): bos
        # and eos where the file asks, as tfcli puts them around a decoder's prompt and transformers around any text
        specials = [llm.tokenize(text.encode(), add_bos=True, special=False) for text in inputs]
        assert [tokenizer.prompt_ids(tokenizer.encode(text)) for text in inputs] == specials, name
        if vocab.add_eos:  # nomic-bert-moe: <s> first and </s> last (transformers' reading: the tiny files below)
            assert specials[0][0] == vocab.ids["bos"] and specials[0][-1] == vocab.ids["eos"]
        for text, ids in zip(inputs, expected):  # and decoded as llama.cpp's llama_detokenize decodes them, which for a
            # SentencePiece-style or Unigram vocabulary drops the space its tokenize put first (llama-cpp-python's detokenize
            # keeps it; SentencePiece's decode drops it, as tfcli does)
            theirs = llm.detokenize(ids).decode("utf-8", "replace")
            spaced = vocab.kind in ("llama", "t5") and vocab.add_space_prefix
            # (llama-cpp-python's detokenize writes no special token's text, unknown tokens' included: special=false)
            assert tokenizer.decode(ids, skip_special_tokens=True) == (theirs.removeprefix(" ") if spaced else theirs), (name, text)
    else:
        inputs, expected = given
    wrong = [(text, ids) for text, ids in zip(inputs, expected) if tokenizer.encode(text) != ids]
    matched = len(inputs) - len(wrong)
    print(f"\n{name}: {matched}/{len(inputs)} strings as llama.cpp tokenizes them")
    detail = "; ".join(f"{text!r}: {tokenizer.encode(text)} != {ids}" for text, ids in wrong[:3])
    assert matched == MATCHED[name] == len(inputs), f"{name}: {matched}/{len(inputs)} strings match, the table says {MATCHED[name]} ({detail})"


def test_the_wordpiece_vocabulary_tokenizes_as_the_installed_llama_cpp(tmp_path, llama_cpp_models):
    """bert-bge beyond its 46 vectors: varied text (accents, vowel signs, Hangul, CJK, full-width forms) tokenized by
    the llama.cpp that llama-cpp-python ships, whose NFD keeps a character's first code point (a Hangul syllable
    is its leading consonant) and which drops every mark."""
    from tests.test_gguf import VARIED, _llama_cpp

    llama_cpp = _llama_cpp()
    path = llama_cpp_models / "ggml-vocab-bert-bge.gguf"
    vocab = Vocab(read_gguf(path).metadata, str(path))
    (tmp_path / "tokenizer.json").write_text(vocab.tokenizer_json(), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(vocab.tokenizer_config(512)), encoding="utf-8")
    tokenizer = TextTokenizer.load(tmp_path)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    texts = [*VARIED, "한국어 텍스트 Führer Cửa Việt नमस्ते", "ẞ İstanbul ﬁne Ⅻ", "\u1112\u1161\u11ab"]
    for text in texts[:-1]:  # the last: conjoining jamo typed as such, which llama.cpp keeps and tfcli drops (see HANGUL_TAIL)
        assert tokenizer.encode(text) == llm.tokenize(text.encode(), add_bos=False, special=False), text
    assert tokenizer.decode(tokenizer.encode("Hello, world!")) == "hello , world !"
    # with special tokens llama.cpp's WPM puts [CLS] first and [SEP] last whatever the file says; the post-processor
    # tfcli writes says so to transformers
    transformers = require("transformers")
    theirs_hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in texts[:3]:
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        assert ids[0] == 101 and ids[-1] == 102 and theirs_hf(text).input_ids == ids, text


# --- Unigram (t5): no test vectors under 4 MiB in llama.cpp's repository, so a vocabulary is made at test time by the
# real tools: SentencePiece trains a Unigram model, which is written as llama.cpp's converter writes a T5's
# (convert_hf_to_gguf.py, T5Model.set_vocab: pieces, scores, types, the precompiled character map, add_space_prefix,
# remove_extra_whitespaces), and the llama.cpp that llama-cpp-python ships tokenizes it.

UNIGRAM_TEXTS = [
    "  leading and trailing  ",
    "a\tb\nc\r\nd",
    "x  y   z",
    "ﬁne ① ＡＢＣ Ⅻ",
    "snow ☃☃ and ∑ ⊕ ♞!",  # characters no piece holds: one unknown token for each run
    " ",
    "",
    "</s>",  # a control token's text: llama.cpp spells it out; tfcli's Unigram (as transformers' T5 tokenizer.json) takes the piece
]


def _unigram_gguf(path: Path, remove_extra_whitespaces: bool, byte_fallback: bool) -> bytes:
    """Write the vocabulary to `path`; returns SentencePiece's model."""
    import io

    import numpy as np

    require("gguf")
    from tests.conftest import TINY_TEXT
    from tests.test_gguf import VARIED

    spm = require("sentencepiece")
    from sentencepiece import sentencepiece_model_pb2

    text = (Path(__file__).parents[1] / "sample_data" / "corpus" / "stories.txt").read_text(encoding="utf-8")[:60_000]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([*text.splitlines(), TINY_TEXT, *VARIED]),
        model_writer=model,
        vocab_size=500,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
        user_defined_symbols=["<extra_id_0>"],
        hard_vocab_limit=False,
        remove_extra_whitespaces=remove_extra_whitespaces,
        byte_fallback=byte_fallback,
        num_threads=1,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    with new_gguf(path, "t5") as writer:
        writer.add_tokenizer_model("t5")
        writer.add_tokenizer_pre("default")
        writer.add_token_list([piece.piece for piece in proto.pieces])
        writer.add_token_scores([piece.score for piece in proto.pieces])
        writer.add_token_types([piece.type for piece in proto.pieces])  # SentencePiece's types are llama.cpp's numbers
        writer.add_add_space_prefix(proto.normalizer_spec.add_dummy_prefix)
        writer.add_remove_extra_whitespaces(proto.normalizer_spec.remove_extra_whitespaces)
        writer.add_precompiled_charsmap(np.frombuffer(proto.normalizer_spec.precompiled_charsmap, dtype=np.uint8).tobytes())
        writer.add_unk_token_id(proto.trainer_spec.unk_id)
        writer.add_eos_token_id(proto.trainer_spec.eos_id)
        writer.add_add_bos_token(False)
    return model.getvalue()


@pytest.mark.parametrize("remove_extra_whitespaces, byte_fallback", [(True, False), (False, True)])
def test_a_unigram_vocabulary_tokenizes_as_llama_cpp(tmp_path, remove_extra_whitespaces, byte_fallback):
    from tests.test_gguf import VARIED, _llama_cpp

    llama_cpp = _llama_cpp()
    import sentencepiece

    path = tmp_path / "t5.gguf"
    sentencepiece_model = sentencepiece.SentencePieceProcessor(model_proto=_unigram_gguf(path, remove_extra_whitespaces, byte_fallback))
    vocab = Vocab(read_gguf(path).metadata, str(path))
    (tmp_path / "tokenizer.json").write_text(vocab.tokenizer_json(), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(vocab.tokenizer_config(512)), encoding="utf-8")
    tokenizer = TextTokenizer.load(tmp_path)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    texts = [*VARIED, *UNIGRAM_TEXTS]
    theirs = {text: llm.tokenize(text.encode(), add_bos=False, special=False) for text in texts}
    wrong = [text for text in texts if tokenizer.encode(text) != theirs[text]]
    print(
        f"\nt5 (remove_extra_whitespaces={remove_extra_whitespaces}, byte pieces={byte_fallback}): {len(texts) - len(wrong)}/{len(texts)} strings as llama.cpp"
    )
    assert wrong == ["</s>"], [(text, tokenizer.encode(text), theirs[text]) for text in wrong]
    assert tokenizer.encode("</s>")[-1] == vocab.tokens.index("</s>")  # the one difference, as the comment above says
    assert "<unk>" in [vocab.tokens[i] for i in theirs["snow ☃☃ and ∑ ⊕ ♞!"]]  # unknown characters are exercised
    for text in (VARIED[0], VARIED[1], "x  y   z"):  # decoded as SentencePiece decodes the same ids
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == sentencepiece_model.decode(ids), text
    # with special tokens: the file does not say add_eos_token, and llama.cpp's default for a t5 tokenizer ends every text
    # with </s> (a T5's source, as transformers' T5 tokenizer ends it); tfcli's post-processor says so to transformers
    eos = vocab.ids["eos"]
    assert vocab.add_eos and not vocab.add_bos and vocab.tokens[eos] == "</s>"
    transformers = require("transformers")
    theirs_hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in texts[:-1]:
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        assert ids[-1:] == [eos] and theirs_hf(text).input_ids == ids == tokenizer.prompt_ids(tokenizer.encode(text)), text


# --- a decoder whose file says add_eos_token: llama.cpp's llama_tokenize(add_special=true) ends its prompt with eos, and
# so do llama-cpp-python's completions (create_completion tokenizes the prompt with add_bos=True, which is add_special);
# llama.cpp's own CLI refuses such a decoder (completion.cpp asserts !add_eos), its server and llama-cpp-python do not.


def _with_add_eos(src: Path, dst: Path) -> Path:
    """A copy of a GGUF file whose tokenizer.ggml.add_eos_token is true (a bool, as the converter writes it)."""
    require("gguf")
    with gguf_copy(src, dst, drop={"tokenizer.ggml.add_eos_token"}) as writer:
        writer.add_add_eos_token(True)
    return dst


def test_a_decoder_whose_file_adds_eos_reads_prompts_as_llama_cpp(cli, tmp_path, monkeypatch):
    """Import keeps add_eos_token (tokenizer_config.json and the post-processor transformers reads); generate ends the
    prompt with </s> as llama-cpp-python's completions do, then continues it greedily as llama.cpp does (no stop at the
    prompt's own </s>: only a generated one ends a text); export writes add_eos_token back."""
    from tests.test_gguf import PROMPT, _export, _llama, _llama_cpp, _llama_greedy, _sentencepiece_vocab, _suppressed, _tfcli_greedy, _write_converter_llama
    from tfcli.checkpoint import load_checkpoint

    llama_cpp = _llama_cpp()
    transformers = require("transformers")
    import torch

    tokens, scores, types = _sentencepiece_vocab(tmp_path)
    torch.manual_seed(3)
    config = transformers.LlamaConfig(
        vocab_size=len(tokens), hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    _write_converter_llama(hf, tmp_path / "plain.gguf", tokens, scores, types)
    path = _with_add_eos(tmp_path / "plain.gguf", tmp_path / "adds-eos.gguf")
    result = cli("import", path, "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    tokenizer = load_checkpoint(tmp_path / "run").tokenizer
    assert tokenizer.adds_bos and tokenizer.adds_eos
    llm = _llama(llama_cpp, path)
    prompt = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
    assert prompt[0] == 1 and prompt[-1] == 2 and prompt == tokenizer.prompt_ids(tokenizer.encode(PROMPT))
    assert tokenizer.prompt_ids(list(range(3, 103)), 64) == [1, *range(41, 103), 2]  # cropped to a context: the text's end kept
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "run")(PROMPT).input_ids == prompt
    assert llm.create_completion(PROMPT, max_tokens=1, temperature=0.0)["usage"]["prompt_tokens"] == len(prompt)  # eos included
    monkeypatch.setenv("TFCLI_ACCEL", "0")  # the prompt is the decoding loop's, whatever does the products (none built here)
    ours, completion = _tfcli_greedy(cli, tmp_path / "run", 16)
    assert completion["prompt_tokens"] == len(prompt)
    assert ours == _llama_greedy(llm, prompt, 16, _suppressed(tokenizer))
    again = _llama(llama_cpp, _export(cli, tmp_path / "run", tmp_path / "again.gguf"))
    assert again.metadata["tokenizer.ggml.add_eos_token"] == "true"
    assert again.tokenize(PROMPT.encode(), add_bos=True, special=False) == prompt
