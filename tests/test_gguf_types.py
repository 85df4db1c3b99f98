"""Every tensor type llama.cpp writes comes in: files made at test time by llama.cpp's own quantizer
(`llama_cpp.llama_model_quantize`, what `llama-quantize` runs) from a tiny Llama-shaped run's f32 export import
with the types tfcli decodes natively (Q8_0, Q4_0, Q4_K, Q6_K, BF16) kept in their blocks and the others dequantized
to f32 (one note naming both and what the run costs), and decode as llama.cpp decodes the same file.

The run is d_model 256, d_ff 256 (K-quants and IQ types pack 256 values a block) and trained for a few seconds on
the tiny text, so that its greedy choices are clear: random weights give near-ties that any rounding flips.

How close is close: tfcli computes with the file's blocks through its own products (kept types) or with the
weights dequantized to f32, exactly as `gguf.quants.dequantize` (the reference port of ggml's dequantize_row_*)
gives them. llama.cpp computes with the same weights but rounds the
activations to 8 bits before each product (Q8_K blocks of 256 for K-quants and IQ types, Q8_0 blocks of 32 for
the others): each value moves by up to 1/254 of its block's largest, 0.2-0.4% of a typical one. Through two
layers that is 0.1-0.2% of the largest logit on average, measured (1.5% at the worst single logit, up to 3.5% on
one run); the test holds the mean within 0.5% and the worst within 5% of the largest logit, and the greedy ids
equal for the first 16 tokens at least (all 64 for most types). A weight read wrongly (a scale, a block, a row
order) moves the logits by the quantization error itself or more: several times those bounds."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TINY_TEXT
from tests.test_gguf import PROMPT, _llama, _llama_cpp, _llama_greedy, _llama_logits, _suppressed, _tfcli_greedy
from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.gguf.convert import NATIVE
from tfcli.loader import load_run
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer

gguf = pytest.importorskip("gguf")

# llama.cpp's file types (llama-quantize's names) and the tensor types each writes here
QUANTIZED = {
    "Q4_K_M": {"Q4_K", "Q6_K"},  # the file model pages offer first: Q6_K for some tensors
    "Q5_K_M": {"Q5_K", "Q6_K"},
    "Q6_K": {"Q6_K"},
    "Q2_K": {"Q2_K", "Q3_K", "Q6_K"},
    "Q8_0": {"Q8_0"},
    "Q4_0": {"Q4_0", "Q6_K"},
    "IQ4_XS": {"IQ4_XS", "Q6_K"},
    "TQ2_0": {"TQ2_0", "Q4_K", "Q6_K"},
}
NEEDS_IMATRIX = ("IQ2_XXS", "IQ3_XXS")  # the quantizer refuses these without an importance matrix: named, skipped
GREEDY, AGREED = 64, 16  # greedy tokens compared, and how many must be equal before the first difference


@pytest.fixture(scope="module")
def f32_file(tmp_path_factory, trained_tokenizer) -> tuple[Path, Path]:
    """A Llama-shaped run (256 wide, 4 heads of 64, 2 KV heads, untied head, vocabulary 512: 320 tokens and
    unused rows), trained 100 steps on the tiny text, and its f32 GGUF export."""
    from tfcli.gguf import export_gguf

    root = tmp_path_factory.mktemp("gguf-types")
    tokenizer = TextTokenizer.load(trained_tokenizer)
    config = ModelConfig(
        vocab_size=512,
        block_size=128,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_model=256,
        d_ff=256,
        positions="rotary",
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
        tie_embeddings=False,
    )
    torch.manual_seed(0)
    model = Transformer(config)
    data = torch.tensor(tokenizer.encode(TINY_TEXT * 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(100):
        starts = torch.randint(0, len(data) - 33, (8,))
        x = torch.stack([data[s : s + 32] for s in starts])  # (8, 32)
        y = torch.stack([data[s + 1 : s + 33] for s in starts])
        logits = model(x).logits  # (8, 32, vocab)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_checkpoint(root / "run", model.eval(), tokenizer)
    export_gguf(root / "run", root / "f32.gguf")
    return root / "run", root / "f32.gguf"


def _quantize(llama_cpp, src: Path, dst: Path, file_type: str) -> int:
    """llama.cpp's quantizer, as llama-quantize SRC DST TYPE runs it; 0 when it wrote the file."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.nthread = 2
    return llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))


@pytest.mark.parametrize("file_type", list(QUANTIZED))
def test_a_file_llama_cpp_quantized_imports_and_decodes_as_llama_cpp(cli, tmp_path, f32_file, file_type, capsys):
    llama_cpp = _llama_cpp()
    _, f32 = f32_file
    path = tmp_path / f"{file_type}.gguf"
    assert _quantize(llama_cpp, f32, path, file_type) == 0, f"llama.cpp's quantizer refused {file_type}"
    kinds = {t.tensor_type.name for t in gguf.GGUFReader(path).tensors} - {"F32"}
    assert kinds == QUANTIZED[file_type], kinds

    result = cli("import", path, "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    (note,) = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    native, widened = sorted(kinds & set(NATIVE)), sorted(kinds - set(NATIVE))
    formats = set(json.loads((tmp_path / "run" / "config.json").read_text())["quantized"].values()) if native else set()
    assert formats == {NATIVE[kind] for kind in native}, (formats, native)  # the native types stay in their blocks
    if native:
        assert note.startswith(f"note: kept the {', '.join(native)} tensors in their blocks"), note
    if widened:  # the others dequantized (with them a native part of a matrix fused with one of them: llama's gate/up)
        assert set(widened) <= set(note.split("dequantized the ")[1].split(" tensors")[0].split(", ")), note
    assert "x the file's" in note, note

    reader = gguf.GGUFReader(path)  # the weights are the file's, dequantized by llama.cpp's gguf package
    (down,) = [t for t in reader.tensors if t.name == "blk.1.ffn_down.weight"]
    expected = gguf.quants.dequantize(np.asarray(down.data), down.tensor_type).reshape(256, 256)
    state = load_checkpoint(tmp_path / "run").model.state_dict()
    assert np.array_equal(state["decoder.blocks.1.mlp.proj.weight"].numpy(), expected)
    del reader

    tokenizer = TextTokenizer.load(tmp_path / "run")
    llm = _llama(llama_cpp, path)
    ids = tokenizer.encode(TINY_TEXT)[:100]
    decoder = load_run(tmp_path / "run", "decode", "cpu").model  # the kept block bytes through tfcli's products, as generate runs them
    with torch.no_grad():
        theirs, ours = _llama_logits(llm, ids), decoder(torch.tensor([ids])).logits[0].numpy()
    largest, worst, mean = float(np.abs(theirs).max()), float(np.abs(theirs - ours).max()), float(np.abs(theirs - ours).mean())
    prompt = tokenizer.encode(PROMPT)
    mine, completion = _tfcli_greedy(cli, tmp_path / "run", GREEDY)
    assert completion["prompt_tokens"] == len(prompt)
    llama_ids = _llama_greedy(llm, prompt, GREEDY, _suppressed(tokenizer))
    first = next((i for i, (a, b) in enumerate(zip(mine, llama_ids)) if a != b), None)
    with capsys.disabled():
        print(
            f"\n{file_type} ({', '.join(sorted(kinds))}): logits up to {largest:.1f}, tfcli - llama.cpp mean {mean:.3f}, worst {worst:.3f}; "
            f"greedy ids {'equal for all ' + str(GREEDY) if first is None else 'first differ at ' + str(first)}"
        )
    assert mean < 0.005 * largest and worst < 0.05 * largest, (mean, worst, largest)
    assert first is None or first >= AGREED, (first, mine, llama_ids)
    assert len(set(mine)) > 8  # the text it learned, not one token over and over


@pytest.mark.parametrize("file_type", NEEDS_IMATRIX)
def test_types_the_quantizer_makes_only_with_an_importance_matrix_are_refused_by_it(tmp_path, f32_file, file_type):
    """Why the import test has no IQ2_XXS or IQ3_XXS file: llama.cpp's quantizer itself refuses them without an
    importance matrix (llama-imatrix). When it makes them, move them to QUANTIZED."""
    assert _quantize(_llama_cpp(), f32_file[1], tmp_path / "out.gguf", file_type) != 0


def test_every_type_gguf_dequantizes_is_read():
    """The reader takes every float type llama.cpp's gguf package dequantizes, and no integer type."""
    from gguf.constants import GGMLQuantizationType as T

    from tfcli.gguf.reader import READABLE_TYPES

    names = {kind.name for kind in READABLE_TYPES}
    assert {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "TQ1_0"} <= names
    assert "MXFP4" in names or not hasattr(T, "MXFP4")
    assert not names & {"I8", "I16", "I32", "I64", "F64", "Q8_K"}


def test_nan_scales_are_refused_in_one_line(cli, tmp_path, f32_file):
    """A Q4_K block whose scale is NaN: the tensor holds non-finite values once dequantized, and import says so."""
    llama_cpp = _llama_cpp()
    path = tmp_path / "q4_k_m.gguf"
    assert _quantize(llama_cpp, f32_file[1], path, "Q4_K_M") == 0
    reader = gguf.GGUFReader(path)
    (tensor,) = [t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight"]
    assert tensor.tensor_type.name == "Q4_K"
    data = bytearray(path.read_bytes())
    data[tensor.data_offset : tensor.data_offset + 2] = np.float16(np.nan).tobytes()  # the first block's d
    del reader
    bad = tmp_path / "nan.gguf"
    bad.write_bytes(bytes(data))
    result = cli("import", bad, "-o", tmp_path / "run")
    assert result.code == 2 and "blk.0.ffn_gate.weight holds non-finite values" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
