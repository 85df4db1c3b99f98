"""llama.cpp's own tokenizer test vectors as the oracle for the tokenizers tfcli rebuilds from GGUF metadata (issue 44).

tests/data/llama_vocab/ holds llama.cpp's vocabulary-only GGUF files (models/ggml-vocab-*.gguf, those under 4 MiB that
have test vectors) with their .inp (inputs, each followed by a "\\n__ggml_vocab_test__\\n" line) and .out (the expected
ids, one line an input); PROVENANCE.md says where they come from. They are read as llama.cpp's
tests/test-tokenizer-0.cpp reads them, and encoded as it encodes them: `common_tokenize(ctx, text, add_special=false,
parse_special=false)`, so no bos and special-token text stays ordinary text, which is what `TextTokenizer.encode` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfcli.errors import TfcliError
from tfcli.gguf.reader import read_gguf
from tfcli.gguf.vocab import Vocab
from tfcli.tokenizer.core import TextTokenizer

DATA = Path(__file__).parent / "data" / "llama_vocab"
SEPARATOR = "\n__ggml_vocab_test__\n"  # test-tokenizer-0.cpp's read_tests

# Strings that give llama.cpp's ids exactly, per vocabulary (46 strings each). A change here is a regression or an
# improvement: set it to the new count and say what differs.
MATCHED = {
    "deepseek-coder": 46,  # gpt2, pre deepseek-coder
    "deepseek-llm": 46,  # gpt2, pre deepseek-llm
    "falcon": 46,  # gpt2, pre falcon
    "gpt-2": 46,  # gpt2, pre gpt-2
    "llama-spm": 46,  # llama (SentencePiece-style, byte fallback)
    "mpt": 46,  # gpt2, pre mpt
    "phi-3": 46,  # llama (SentencePiece-style)
    "refact": 46,  # gpt2, pre refact
    "starcoder": 46,  # gpt2, pre starcoder
}

# Vocabularies whose tokenizer model tfcli cannot express: the words its one-line refusal must hold.
REFUSED = {
    "bert-bge": "tokenizer.ggml.model is 'bert' (WordPiece)",  # WordPiece, which tfcli does not rebuild from GGUF
}


def _vectors(gguf: Path) -> tuple[list[str], list[list[int]]]:
    """The inputs and expected ids, split as test-tokenizer-0.cpp splits them."""
    raw = gguf.with_name(gguf.name + ".inp").read_bytes().decode("utf-8")
    inputs: list[str] = []
    pos = 0
    while pos < len(raw):
        end = raw.find(SEPARATOR, pos)
        if end < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:end])
        pos = end + len(SEPARATOR)
    lines = gguf.with_name(gguf.name + ".out").read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":  # getline gives no line after the last newline
        lines.pop()
    expected = [[int(token) for token in line.strip().split(" ") if token] for line in lines]
    assert len(inputs) == len(expected), f"{gguf.name}: {len(inputs)} inputs but {len(expected)} expected outputs"
    return inputs, expected


def _names() -> list[str]:
    return sorted(path.name[len("ggml-vocab-") : -len(".gguf")] for path in DATA.glob("ggml-vocab-*.gguf"))


def test_every_vocabulary_is_accounted_for():
    assert _names() == sorted({*MATCHED, *REFUSED})


@pytest.mark.parametrize("name", _names())
def test_llama_cpp_vectors(tmp_path, name):
    path = DATA / f"ggml-vocab-{name}.gguf"
    inputs, expected = _vectors(path)
    try:
        vocab = Vocab(read_gguf(path).metadata, str(path))
    except TfcliError as exc:
        assert name in REFUSED, f"{name}: refused ({exc})"
        assert "\n" not in str(exc), f"{name}: the refusal is more than one line: {exc!r}"
        assert REFUSED[name] in str(exc), f"{name}: the refusal does not name the reason: {exc}"
        print(f"\n{name}: refused: {exc}")
        return
    assert name not in REFUSED, f"{name}: tfcli now rebuilds it; move it to MATCHED"
    (tmp_path / "tokenizer.json").write_text(vocab.tokenizer_json(), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(vocab.tokenizer_config(2048)), encoding="utf-8")
    tokenizer = TextTokenizer.load(tmp_path)
    wrong = [(text, ids) for text, ids in zip(inputs, expected) if tokenizer.encode(text) != ids]
    matched = len(inputs) - len(wrong)
    print(f"\n{name}: {matched}/{len(inputs)} strings as llama.cpp tokenizes them")
    detail = "; ".join(f"{text!r}: {tokenizer.encode(text)} != {ids}" for text, ids in wrong[:3])
    assert matched == MATCHED[name], f"{name}: {matched}/{len(inputs)} strings match, the table says {MATCHED[name]} ({detail})"
