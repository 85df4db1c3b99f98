"""llama.cpp's block formats (tfcli.quant.formats) held to llama.cpp itself: dequantizing random blocks gives what
`gguf.quants.dequantize` gives, bit for bit; quantizing q8_0, q4_0 and bf16 gives `gguf.quants.quantize`'s bytes;
q4_K and q6_K are held to ggml's own `quantize_row_*_ref` (called in the libggml-base that llama-cpp-python
ships, what llama-quantize runs without an importance matrix): the same bytes for nearly every block (sums in
another order move a rare one to a neighbouring scale) and an RMS error no worse than llama.cpp's.

Random blocks: bytes drawn uniformly (every bit pattern of levels and packed scales), fp16 scales drawn finite, so
a slip in an offset, a nibble order or a 6-bit scale unpacking shows."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from tests.test_gguf import _llama_cpp
from tfcli.quant.formats import FORMATS, dequantize, quantize, scales_finite

gguf = pytest.importorskip("gguf")

SCALE_OFFSETS = {"q8_0": [0], "q4_0": [0], "q4_K": [0, 2], "q6_K": [208]}  # where each block's fp16 scales sit


def _random_blocks(name: str, n_blocks: int, seed: int) -> np.ndarray:
    fmt = FORMATS[name]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n_blocks, fmt.type_size), dtype=np.uint8)
    if name == "bf16":
        values = rng.standard_normal(n_blocks).astype(np.float32)
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)
    for offset in SCALE_OFFSETS[name]:
        data[:, offset : offset + 2] = rng.uniform(-2, 2, n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return data


def _gguf_type(name: str):
    return getattr(gguf.GGMLQuantizationType, name.upper())


def _matrix(rows: int, columns: int, seed: int) -> np.ndarray:
    """Weights as trained matrices have them: rows of different scales, some outliers, a zero block, a flat one."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, columns)).astype(np.float32) * rng.uniform(0.01, 2, (rows, 1)).astype(np.float32)
    x[rng.random(x.shape) < 0.002] *= 12
    x[0, :256] = 0
    x[1, :] = 0.5
    x[2, :256] = rng.uniform(0, 1, 256)  # no negative value: the min clamps at 0
    return x


@pytest.mark.parametrize("name", list(FORMATS))
def test_dequantize_matches_gguf_on_random_blocks(name):
    fmt = FORMATS[name]
    data = _random_blocks(name, 512, seed=1)
    columns = 4 * fmt.block_size if fmt.block_size > 1 else 256
    rows = data.size // fmt.row_bytes(columns)
    matrix = data.reshape(rows, -1)
    ours = dequantize(matrix, name, columns)
    theirs = gguf.quants.dequantize(matrix.reshape(-1), _gguf_type(name)).reshape(rows, columns)
    assert ours.shape == (rows, columns) and np.isfinite(ours).all()
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "bf16"])
def test_quantize_is_gguf_bit_for_bit(name):
    x = _matrix(24, 512, seed=2)
    ours = quantize(x, name)
    assert ours.shape == (24, FORMATS[name].row_bytes(512))
    assert np.array_equal(ours, gguf.quants.quantize(x, _gguf_type(name)).reshape(24, -1))


def _ggml_reference(x: np.ndarray, name: str) -> np.ndarray:
    """llama.cpp's own quantizer for `name` (ggml's quantize_row_<name>_ref) over x."""
    library = ctypes.CDLL(os.path.join(os.path.dirname(_llama_cpp().__file__), "lib", "libggml-base.so"))
    function = getattr(library, f"quantize_row_{name}_ref")
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((x.shape[0], FORMATS[name].row_bytes(x.shape[1])), dtype=np.uint8)
    function(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.size))
    return out


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_K", "q6_K"])
def test_quantize_as_llama_cpp_does_with_no_more_error(name):
    """ggml's search (reference=True) gives ggml's bytes (q8_0, q4_0: every block; q4_K, q6_K: nearly every one);
    tfcli's own search errs less than llama.cpp's quantizer on the same matrix, and is deterministic."""
    x = _matrix(48, 768, seed=3)
    fmt = FORMATS[name]
    theirs = _ggml_reference(x, name)
    same = (quantize(x, name, reference=True).reshape(-1, fmt.type_size) == theirs.reshape(-1, fmt.type_size)).all(axis=1)
    assert same.mean() >= (1.0 if name in ("q8_0", "q4_0") else 0.9), same.mean()
    ours = quantize(x, name)
    ours_rms = float(np.sqrt(((dequantize(ours, name, 768) - x) ** 2).mean()))
    theirs_rms = float(np.sqrt(((dequantize(theirs, name, 768) - x) ** 2).mean()))
    assert ours_rms <= theirs_rms, (ours_rms, theirs_rms)
    if name in ("q4_K", "q6_K"):
        assert ours_rms < 0.995 * theirs_rms, (ours_rms, theirs_rms)  # the refined scales: a margin, not rounding luck
    assert 0 < ours_rms < {"q8_0": 0.01, "q4_0": 0.2, "q4_K": 0.15, "q6_K": 0.05}[name] * float(np.sqrt((x**2).mean()))
    assert np.array_equal(quantize(x, name), ours)  # deterministic


def test_a_zero_matrix_quantizes_to_zeros_and_back():
    zeros = np.zeros((2, 256), dtype=np.float32)
    for name in FORMATS:
        assert np.array_equal(dequantize(quantize(zeros, name), name, 256), zeros), name


def test_scales_finite_finds_a_nan_or_infinite_scale():
    for name in ("q8_0", "q4_0", "q4_K", "q6_K"):
        data = quantize(_matrix(4, 256, seed=4), name)
        assert scales_finite(data, name)
        for offset in SCALE_OFFSETS[name]:
            for bad in (np.nan, np.inf):
                broken = data.copy()
                last_block = FORMATS[name].row_bytes(256) - FORMATS[name].type_size
                broken[3, last_block + offset : last_block + offset + 2] = np.array([bad], dtype=np.float16).view(np.uint8)
                assert not scales_finite(broken, name), (name, offset, bad)
    bf16 = quantize(np.array([[1.0, np.inf]], dtype=np.float32), "bf16")
    assert not scales_finite(bf16, "bf16")


def test_a_row_that_is_not_whole_blocks_is_refused():
    with pytest.raises(ValueError, match="not a whole number of q4_K blocks"):
        quantize(np.ones((2, 96), dtype=np.float32), "q4_K")
