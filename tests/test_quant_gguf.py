"""Quantized runs out to GGUF: `tfcli export --to gguf --type` writes llama.cpp's tensor types as llama.cpp's own
quantizer picks them for the same model, a quantized run's block bytes unchanged, and llama.cpp
(llama-cpp-python) decodes the file as tfcli decodes the run: the same greedy tokens, logits within the bounds
tests/test_gguf_types.py explains (llama.cpp rounds the activations to 8 bits before each product; tfcli
multiplies them in fp32)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch

from tests import test_gguf_types
from tests.conftest import TINY_TEXT
from tests.test_gguf import PROMPT, _llama, _llama_cpp, _llama_greedy, _llama_logits, _suppressed, _tfcli_greedy
from tests.test_gguf_types import AGREED, GREEDY
from tfcli.loader import load_run
from tfcli.tokenizer.core import TextTokenizer

gguf = pytest.importorskip("gguf")
f32_file = test_gguf_types.f32_file  # the fixture: a Llama-shaped run trained to clear greedy choices, and its f32 GGUF export


def _tensor_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q4_0", "BF16"])
def test_export_type_gives_the_tensor_types_llama_cpp_quantizer_gives(cli, tmp_path, f32_file, file_type):
    run, f32 = f32_file
    llama_cpp = _llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(str(f32).encode(), str(tmp_path / "theirs.gguf").encode(), ctypes.byref(params)) == 0
    result = cli("export", run, "--to", "gguf", "-o", tmp_path / "ours.gguf", "--type", file_type.lower())
    assert result.code == 0, result.stderr
    assert _tensor_types(tmp_path / "ours.gguf") == _tensor_types(tmp_path / "theirs.gguf")


@pytest.mark.parametrize("file_type", ["q4_k_m", "q8_0"])
def test_a_quantized_run_exports_its_bytes_and_llama_cpp_decodes_it_as_tfcli(cli, tmp_path, f32_file, file_type, capsys):
    run, _ = f32_file
    assert cli("quantize", run, "-o", tmp_path / "run", "--type", file_type).code == 0
    result = cli("export", tmp_path / "run", "--to", "gguf", "-o", tmp_path / "q.gguf", "--type", file_type)
    assert result.code == 0, result.stderr
    from safetensors.numpy import load_file

    stored = load_file(tmp_path / "run" / "model.safetensors")["decoder.blocks.1.mlp.proj.weight"]
    (down,) = [t for t in gguf.GGUFReader(tmp_path / "q.gguf").tensors if t.name == "blk.1.ffn_down.weight"]
    assert np.array_equal(np.asarray(down.data).reshape(stored.shape), stored)  # the block bytes as they are

    tokenizer = TextTokenizer.load(tmp_path / "run")
    llm = _llama(_llama_cpp(), tmp_path / "q.gguf")
    ids = tokenizer.encode(TINY_TEXT)[:100]
    theirs = _llama_logits(llm, ids)
    model = load_run(tmp_path / "run", "decode", "cpu").model  # the block bytes, through tfcli's C products
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].numpy()
    largest, worst, mean = float(np.abs(theirs).max()), float(np.abs(theirs - ours).max()), float(np.abs(theirs - ours).mean())
    mine, _ = _tfcli_greedy(cli, tmp_path / "run", GREEDY)
    llama_ids = _llama_greedy(llm, tokenizer.encode(PROMPT), GREEDY, _suppressed(tokenizer))
    first = next((i for i, (a, b) in enumerate(zip(mine, llama_ids)) if a != b), None)
    with capsys.disabled():
        print(
            f"\n{file_type}: logits up to {largest:.1f}, tfcli - llama.cpp mean {mean:.4f}, worst {worst:.3f}; "
            f"greedy ids {'equal for all ' + str(GREEDY) if first is None else 'first differ at ' + str(first)}"
        )
    assert mean < 0.005 * largest and worst < 0.05 * largest, (mean, worst, largest)
    assert first is None or first >= AGREED, (first, mine, llama_ids)


def _tensor_info_offset(path: Path, name: str) -> tuple[int, int]:
    """Where tensor `name`'s entry in the header holds its first dimension and its type (byte offsets)."""
    reader = gguf.GGUFReader(path)
    (tensor,) = [t for t in reader.tensors if t.name == name]
    start, dims = tensor.field.offset, len(tensor.shape)
    first_dim = start + 8 + len(name.encode()) + 4  # the name's length and bytes, the dimension count
    return first_dim, first_dim + 8 * dims


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"type": 9999}, "tensor output_norm.weight has the unknown type 9999"),
        ({"type": 12, "dim": 48}, "tensor output_norm.weight has dimensions [48], which Q4_K cannot hold (rows in blocks of 256)"),
    ],
    ids=["unknown-type", "row-not-whole-blocks"],
)
def test_a_bad_tensor_entry_is_refused_in_one_line(cli, tmp_path, f32_file, edit, message):
    """A tensor type no one knows, or a row that is not a whole number of its type's blocks: one line, exit 2,
    no run left behind."""
    import struct

    path = f32_file[1]
    first_dim, kind = _tensor_info_offset(path, "output_norm.weight")
    data = bytearray(path.read_bytes())
    data[kind : kind + 4] = struct.pack("<I", edit["type"])
    if "dim" in edit:
        data[first_dim : first_dim + 8] = struct.pack("<Q", edit["dim"])
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    result = cli("import", bad, "-o", tmp_path / "run")
    assert result.code == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_q8_0_file_imports_in_its_blocks_byte_for_byte(cli, tmp_path, f32_file):
    """llama.cpp's Q8_0 file: the run holds the file's bytes (q/k/v joined row by row, llama.cpp's row order in
    each head undone), as much memory as the file's tensors, and one note saying so."""
    from safetensors.numpy import load_file

    from tests.test_gguf_types import _quantize
    from tfcli.gguf.layout import unpermute_heads

    path = tmp_path / "q8_0.gguf"
    assert _quantize(_llama_cpp(), f32_file[1], path, "Q8_0") == 0
    result = cli("import", path, "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    (note,) = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert note.startswith("note: kept the Q8_0 tensors in their blocks: the run holds 1.0x the file's"), note
    stored = load_file(tmp_path / "run" / "model.safetensors")
    tensors = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}
    q = unpermute_heads(torch.from_numpy(tensors["blk.0.attn_q.weight"].copy()), 4).numpy()
    k = unpermute_heads(torch.from_numpy(tensors["blk.0.attn_k.weight"].copy()), 2).numpy()
    joined = np.concatenate([q, k, tensors["blk.0.attn_v.weight"]])
    assert np.array_equal(stored["decoder.blocks.0.attn.qkv.weight"], joined)
    assert stored["decoder.blocks.0.attn.qkv.weight"].dtype == np.uint8
