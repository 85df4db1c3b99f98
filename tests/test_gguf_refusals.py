"""The refusals issue 44 added to GGUF import, each one line and exit 2 with nothing written: a WordPiece or Unigram
vocabulary tfcli cannot rebuild as llama.cpp reads it, and a rotary width llama.cpp's architecture does not turn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.gguf_files import new_gguf
from tests.test_gguf import _with_keys, exported_llama, runs  # noqa: F401  (module fixtures, shared with test_gguf)
from tfcli.errors import TfcliError
from tfcli.gguf.vocab import Vocab

gguf = pytest.importorskip("gguf")


def _vocab_only(path: Path, model: str, tokens: list[str], **extra) -> Path:
    """A llama file holding a tokenizer and nothing else: import reads the tokenizer before the model."""
    with new_gguf(path, "llama") as writer:
        writer.add_tokenizer_model(model)
        writer.add_token_list(tokens)
        writer.add_token_types([1] * len(tokens))
        writer.add_token_scores([-float(i) for i in range(len(tokens))])
        for key, value in extra.items():
            writer.add_key_value(key.replace("__", "."), value.tolist(), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT8)
    return path


def _refused(cli, tmp_path, path: Path, words: str) -> None:
    result = cli("import", path, "-o", tmp_path / "run")
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert words in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_small_wordpiece_vocabulary_without_an_unknown_token_is_refused(cli, tmp_path):
    """llama.cpp falls back to id 100 ([UNK] in BERT's vocabulary); a vocabulary of 5 pieces has none."""
    path = _vocab_only(tmp_path / "bert.gguf", "bert", ["[PAD]", "▁hello", "▁world", "s", "▁!"])
    _refused(cli, tmp_path, path, "a bert vocabulary needs metadata tokenizer.ggml.unknown_token_id")


def test_a_unigram_character_map_cut_short_is_refused(cli, tmp_path):
    """llama.cpp: "Index out of array bounds in precompiled charsmap!"; tfcli says the same before it builds anything."""
    charsmap = np.frombuffer((1000).to_bytes(4, "little") + bytes(16), dtype=np.uint8)
    path = _vocab_only(tmp_path / "t5.gguf", "t5", ["<pad>", "</s>", "<unk>", "▁a"], tokenizer__ggml__precompiled_charsmap=charsmap)
    _refused(cli, tmp_path, path, "tokenizer.ggml.precompiled_charsmap is cut short (its table claims 1,000 of 20 bytes)")


@pytest.mark.parametrize(
    "model, tokens, words",
    [
        # a word "[x]" (written "▁[x]") and a bracketed piece "[x]", which the converter writes as it is
        ("bert", ["[UNK]", "▁[x]", "[x]"], "spells the WordPiece piece '[x]' twice (ids 1 and 2)"),
        ("t5", ["<pad>", "</s>", "<unk>", "▁a", "▁a"], "lists '▁a' twice"),
    ],
)
def test_a_vocabulary_that_spells_a_piece_twice_is_refused(tmp_path, model, tokens, words):
    metadata = {
        "tokenizer.ggml.model": model,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.unknown_token_id": tokens.index("[UNK]" if model == "bert" else "<unk>"),
    }
    with pytest.raises(TfcliError) as refused:
        Vocab(metadata, "x.gguf").tokenizer_json()
    assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "arch, keys, words",
    [
        ("llama", dict(llama__rope__dimension_count=8), "llama.rope.dimension_count is 8; tfcli turns all 16 features of each head in a llama model"),
        ("phi3", dict(phi3__rope__dimension_count=7), "phi3.rope.dimension_count is 7; tfcli turns all 16 features of each head, or an even number"),
    ],
)
def test_a_rotary_width_llama_cpps_architecture_does_not_turn_is_refused(cli, tmp_path, exported_llama, arch, keys, words):  # noqa: F811
    _refused(cli, tmp_path, _with_keys(exported_llama, tmp_path / "bad.gguf", arch=arch, **keys), words)


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(activation="swiglu", qk_norm=True), "GGUF's qwen3 architecture cannot express this model: rope_fraction 0.5 with qwen3's options"),
        (
            dict(activation="geglu", post_norms=True, qk_norm=True, scale_embeddings=True, sliding_window=8, local_layers=(0,)),
            "GGUF's gemma3 architecture cannot express this model: rope_fraction 0.5 (tfcli writes partial rotary as phi3 only)",
        ),
    ],
)
def test_partial_rotary_goes_out_as_phi3_only(options, words):
    from tfcli.gguf.layout import export_arch
    from tfcli.model.config import ModelConfig

    shape = dict(vocab_size=50, block_size=32, n_layers=1, n_heads=2, d_model=32, d_head=16, positions="rotary", norm="rmsnorm", bias=False)
    with pytest.raises(TfcliError) as refused:
        export_arch(ModelConfig(**shape, **options, rope_fraction=0.5))
    assert words in refused.value.message
    assert export_arch(ModelConfig(**{**shape, "n_heads": 4, "d_head": None}, activation="swiglu", rope_fraction=0.5)) == "phi3"
