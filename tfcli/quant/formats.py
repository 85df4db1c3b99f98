"""llama.cpp's block formats in NumPy: quantize and dequantize, byte for byte in ggml's block layout, so a
tensor moves between a run directory and a GGUF file unchanged. Needs no `gguf` package (tested against it).

Each format is named as ggml names it (`q8_0`, `q4_0`, `q4_K`, `q6_K`, `bf16`) and laid out as ggml's block
struct (ggml-common.h), little-endian, a row of K values packed into K / block_size blocks:

- q8_0, 32 values in 34 bytes: `half d; int8 qs[32]`, value = d * q.
- q4_0, 32 values in 18 bytes: `half d; uint8 qs[16]`, value = d * (nibble - 8); byte i holds value i in its
  low nibble and value i + 16 in its high one.
- q4_K, 256 values in 144 bytes: `half d; half dmin; uint8 scales[12]; uint8 qs[128]`: eight sub-blocks of 32,
  each with a 6-bit scale and a 6-bit min (packed in `scales`), value = d * sc * nibble - dmin * m.
- q6_K, 256 values in 210 bytes: `uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d`: sixteen sub-blocks of
  16, value = d * scale * (q - 32), q's low 4 bits in ql and its high 2 in qh.
- bf16, one value in 2 bytes: the top half of the fp32, rounded to nearest even.

Quantizing follows ggml-quants.c's reference functions (`quantize_row_*_ref`, what llama.cpp's quantizer runs
without an importance matrix): q8_0 and q4_0 bit for bit; q4_K and q6_K the same search for each sub-block's
scale (in float32, sums in another order, so a rare block settles on a neighbouring scale), over twice ggml's
trial points (`SEARCH`), so that the error is no worse than llama.cpp's quantizer's on the same tensor.
Deterministic: no randomness, no threads.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfcli.errors import TfcliError

QK_K = 256  # values in a K-quant super-block
CHUNK_VALUES = 1 << 20  # values quantized at a time: memory bounded by this, never by the tensor
# the K formats' search for a sub-block's scale, (steps, step size): ggml's trial points (SEARCH_REFERENCE), and the
# ones tfcli searches, twice as many over the same range, ggml's among them, so that its error is no worse
SEARCH_REFERENCE = {"q4_K": (20, 0.1), "q6_K": (9, 0.1)}
SEARCH = {"q4_K": (40, 0.05), "q6_K": (18, 0.05)}


@dataclasses.dataclass(frozen=True)
class BlockFormat:
    """One ggml block type: `block_size` values stored in `type_size` bytes."""

    name: str  # as ggml names it: q8_0, q4_K
    block_size: int
    type_size: int
    gguf_type: int  # its GGMLQuantizationType value in a GGUF file

    def row_bytes(self, columns: int) -> int:
        """Bytes of one row of `columns` values (a whole number of blocks)."""
        return columns // self.block_size * self.type_size

    def fits(self, columns: int) -> bool:
        return columns > 0 and columns % self.block_size == 0


FORMATS: dict[str, BlockFormat] = {
    "bf16": BlockFormat("bf16", 1, 2, 30),
    "q8_0": BlockFormat("q8_0", 32, 34, 8),
    "q4_0": BlockFormat("q4_0", 32, 18, 2),
    "q4_K": BlockFormat("q4_K", QK_K, 144, 12),
    "q6_K": BlockFormat("q6_K", QK_K, 210, 14),
}


def block_format(name: str, where: str = "the tensor type") -> BlockFormat:
    """The format called `name`, or one line naming those there are."""
    if name not in FORMATS:
        raise TfcliError(f"{where} {name!r} is not a block format tfcli knows", hint=f"use one of {', '.join(FORMATS)}")
    return FORMATS[name]


def _f16(values: np.ndarray) -> np.ndarray:
    """float32 values as the bytes of their fp16 (2 per value)."""
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape[:-1], -1)


def _from_f16(data: np.ndarray) -> np.ndarray:
    """Bytes (..., 2) of fp16 values as float32 (..., 1)."""
    return np.ascontiguousarray(data).view(np.float16).astype(np.float32)


def _round_away(values: np.ndarray) -> np.ndarray:
    """roundf: halves away from zero (q8_0's reference rounds so)."""
    return np.sign(values) * np.floor(np.abs(values) + np.float32(0.5))


def _nearest(values: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: the nearest integer, halves to even (its float trick rounds in the FPU's mode)."""
    return np.rint(values)


# --- q8_0 and q4_0: one scale per 32 values --------------------------------------------------------------


def _quantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)  # (n, 1)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d)
    qs = _round_away(blocks * inverse).astype(np.int8).view(np.uint8)
    return np.concatenate([_f16(d), qs], axis=1)


def _dequantize_q8_0(data: np.ndarray) -> np.ndarray:
    return _from_f16(data[:, :2]) * data[:, 2:].view(np.int8).astype(np.float32)


def _quantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    largest = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1, keepdims=True), axis=1)  # signed, (n, 1)
    d = largest / np.float32(-8)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d)
    qs = np.minimum(np.trunc(blocks * inverse + np.float32(8.5)), 15).astype(np.uint8)  # (n, 32)
    return np.concatenate([_f16(d), qs[:, :16] | (qs[:, 16:] << 4)], axis=1)


def _dequantize_q4_0(data: np.ndarray) -> np.ndarray:
    qs = data[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8  # (n, 32)
    return _from_f16(data[:, :2]) * q


# --- q4_K: 8 sub-blocks of 32 with a scale and a min, both 6-bit ------------------------------------------


def _scale_and_min(x: np.ndarray, weights: np.ndarray, steps: int, delta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's make_qkx2_quants(32, 15, x, weights, ..., rmin=-1, rdelta=delta, nstep=steps, use_mad=false) for
    each row of x (n, 32): the levels 0..15, the scale and the min (returned positive, as `the_min`)."""
    nmax = np.float32(15)
    low = np.minimum(x.min(axis=1), 0)[:, None]  # (n, 1)
    high = x.max(axis=1)[:, None]
    flat = high == low
    span = np.where(flat, np.float32(1), high - low)
    sum_w = weights.sum(axis=1, keepdims=True)
    sum_x = (weights * x).sum(axis=1, keepdims=True)
    levels = np.clip(_nearest(nmax / span * (x - low)), 0, nmax)
    scale = span / nmax
    best = (weights * (scale * levels + low - x) ** 2).sum(axis=1, keepdims=True)
    minimum = low.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        for step in range(steps + 1):
            iscale = (np.float32(-1) + np.float32(delta) * np.float32(step) + nmax) / np.where(flat, np.float32(1), high - minimum)
            trial = np.clip(_nearest(iscale * (x - minimum)), 0, nmax)  # from the best min so far, as ggml's loop does
            sum_l = (weights * trial).sum(axis=1, keepdims=True)
            sum_l2 = (weights * trial * trial).sum(axis=1, keepdims=True)
            sum_xl = (weights * trial * x).sum(axis=1, keepdims=True)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            positive = this_min > 0
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
            this_min = np.where(positive, np.float32(0), this_min)
            error = (weights * (this_scale * trial + this_min - x) ** 2).sum(axis=1, keepdims=True)
            better = (D > 0) & (error < best)
            levels = np.where(better, trial, levels)
            best = np.where(better, error, best)
            scale = np.where(better, this_scale, scale)
            minimum = np.where(better, this_min, minimum)
    levels = np.where(flat, np.float32(0), levels)
    scale = np.where(flat, np.float32(0), scale)
    minimum = np.where(flat, low, minimum)
    return levels, scale[:, 0], -minimum[:, 0]


def _quantize_q4_K(blocks: np.ndarray, reference: bool) -> np.ndarray:
    n = blocks.shape[0]
    x = blocks.reshape(n * 8, 32)
    average = np.sqrt((x * x).sum(axis=1, keepdims=True) / np.float32(32))
    levels, scales, mins = _scale_and_min(x, average + np.abs(x), *(SEARCH_REFERENCE if reference else SEARCH)["q4_K"])
    levels, scales, mins = levels.reshape(n, 8, 32), scales.reshape(n, 8), mins.reshape(n, 8)
    max_scale = np.maximum(scales.max(axis=1, keepdims=True), 0)  # (n, 1)
    max_min = np.maximum(mins.max(axis=1, keepdims=True), 0)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, np.float32(63) / max_scale, np.float32(0))
        inv_min = np.where(max_min > 0, np.float32(63) / max_min, np.float32(0))
    ls = np.minimum(_nearest(inv_scale * scales), 63).astype(np.uint8)  # (n, 8)
    lm = np.minimum(_nearest(inv_min * mins), 63).astype(np.uint8)
    d = (max_scale / np.float32(63)).astype(np.float16)
    dmin = (max_min / np.float32(63)).astype(np.float16)
    if not reference:
        ls, lm = _refine_q4_K(blocks.reshape(n, 8, 32), d.astype(np.float32), dmin.astype(np.float32), ls, lm)
    packed = np.zeros((n, 12), dtype=np.uint8)
    packed[:, 0:4], packed[:, 4:8] = ls[:, :4], lm[:, :4]
    packed[:, 8:12] = (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)
    packed[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    packed[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    sub_d = d.astype(np.float32) * ls.astype(np.float32)  # (n, 8): what the file's bytes give back
    sub_m = dmin.astype(np.float32) * lm.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        requantized = np.clip(_nearest((blocks.reshape(n, 8, 32) + sub_m[..., None]) / sub_d[..., None]), 0, 15)
    levels = np.where(sub_d[..., None] != 0, requantized, levels).astype(np.uint8).reshape(n, 4, 2, 32)
    qs = (levels[:, :, 0] | (levels[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([d.view(np.uint8).reshape(n, 2), dmin.view(np.uint8).reshape(n, 2), packed, qs], axis=1)


def _refine_q4_K(x: np.ndarray, d: np.ndarray, dmin: np.ndarray, ls: np.ndarray, lm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each sub-block's 6-bit scale and min moved by one step where that lowers its squared error once its
    values are rounded to the levels of the scale and min the bytes hold (ggml rounds the two to 6 bits and
    keeps them). x (n, 8, 32); d, dmin (n, 1); ls, lm (n, 8). Ties keep ggml's."""
    best_ls, best_lm = ls, lm
    best = None
    for step_s, step_m in ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)):
        trial_s = np.clip(ls.astype(np.int16) + step_s, 0, 63).astype(np.uint8)
        trial_m = np.clip(lm.astype(np.int16) + step_m, 0, 63).astype(np.uint8)
        scale = (d * trial_s.astype(np.float32))[..., None]  # (n, 8, 1)
        minimum = (dmin * trial_m.astype(np.float32))[..., None]
        with np.errstate(divide="ignore", invalid="ignore"):
            levels = np.where(scale != 0, np.clip(_nearest((x + minimum) / scale), 0, 15), np.float32(0))
        error = ((scale * levels - minimum - x) ** 2).sum(axis=2)  # (n, 8)
        if best is None:
            best = error
            continue
        better = error < best
        best = np.where(better, error, best)
        best_ls, best_lm = np.where(better, trial_s, best_ls), np.where(better, trial_m, best_lm)
    return best_ls, best_lm


def _q4_K_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for j = 0..7: the sub-blocks' 6-bit scales and mins from the 12 bytes (n, 12)."""
    d, m, both = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([d & 0x3F, (both & 0x0F) | ((d >> 6) << 4)], axis=1)
    mins = np.concatenate([m & 0x3F, (both >> 4) | ((m >> 6) << 4)], axis=1)
    return scales, mins


def _dequantize_q4_K(data: np.ndarray) -> np.ndarray:
    n = data.shape[0]
    d, dmin = _from_f16(data[:, 0:2]), _from_f16(data[:, 2:4])  # (n, 1)
    scales, mins = _q4_K_scales(data[:, 4:16])
    qs = data[:, 16:].reshape(n, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    return ((d * scales)[..., None] * q - (dmin * mins)[..., None]).reshape(n, QK_K)


# --- q6_K: 16 sub-blocks of 16 with an 8-bit scale --------------------------------------------------------


def _scale_6bit(x: np.ndarray, steps: int, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_qx_quants(16, 32, x, L, rmse_type=1, NULL) for each row of x (n, 16): the levels 0..63
    (q + 32) and the scale, searched over trial scales -(32 + delta * i) / max, i = -steps..steps (ggml: 9, 0.1),
    weighted by x^2."""
    nmax = np.float32(32)
    first = np.abs(x).argmax(axis=1)[:, None]
    largest = np.take_along_axis(x, first, axis=1)  # signed, (n, 1)
    zero = np.abs(largest) < np.float32(1e-15)
    largest = np.where(zero, np.float32(1), largest)
    weights = x * x

    def trial(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        levels = np.clip(_nearest(iscale * x), -nmax, nmax - 1)
        return levels, (weights * x * levels).sum(axis=1, keepdims=True), (weights * levels * levels).sum(axis=1, keepdims=True)

    levels, sum_lx, sum_l2 = trial(-nmax / largest)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, np.float32(0))
        best = scale * sum_lx
        for step in (*range(-steps, 0), *range(1, steps + 1)):
            candidate, sum_lx, sum_l2 = trial(-(nmax + np.float32(delta) * np.float32(step)) / largest)
            better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
            levels = np.where(better, candidate, levels)
            scale = np.where(better, sum_lx / sum_l2, scale)
            best = np.where(better, scale * sum_lx, best)
    levels = np.where(zero, -nmax, levels) + nmax
    scale = np.where(zero, np.float32(0), scale)
    return levels, scale[:, 0]


def _quantize_q6_K(blocks: np.ndarray, reference: bool) -> np.ndarray:
    n = blocks.shape[0]
    levels, scales = _scale_6bit(blocks.reshape(n * 16, 16), *(SEARCH_REFERENCE if reference else SEARCH)["q6_K"])
    levels, scales = levels.reshape(n, 16, 16), scales.reshape(n, 16)
    first = np.abs(scales).argmax(axis=1)[:, None]
    max_scale = np.take_along_axis(scales, first, axis=1)  # signed, (n, 1)
    empty = np.abs(max_scale) < np.float32(1e-15)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(empty, np.float32(0), np.float32(-128) / max_scale)
        d = np.where(empty, np.float32(0), np.float32(1) / iscale).astype(np.float16)
    sub = np.minimum(_nearest(iscale * scales), 127).astype(np.int8)  # (n, 16)
    if not reference:
        sub = _refine_q6_K(blocks.reshape(n, 16, 16), d.astype(np.float32), sub)
    sub_d = d.astype(np.float32) * sub.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        requantized = np.clip(_nearest(blocks.reshape(n, 16, 16) / sub_d[..., None]), -32, 31) + 32
    levels = np.where(sub_d[..., None] != 0, requantized, levels)
    levels = np.where(empty[..., None], np.float32(0), levels).astype(np.uint8).reshape(n, 2, 4, 32)  # (n, half, quarter, l)
    low = levels & 0x0F
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2).reshape(n, 128)
    high = levels >> 4
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    sub = np.where(empty, np.int8(0), sub)
    return np.concatenate([ql, qh, sub.view(np.uint8), d.view(np.uint8).reshape(n, 2)], axis=1)


def _refine_q6_K(x: np.ndarray, d: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """Each sub-block's 8-bit scale moved by one step where that lowers its squared error once its values are
    rounded to that scale's levels (ggml rounds the scale and keeps it). x (n, 16, 16); d (n, 1); sub (n, 16).
    Ties keep ggml's."""
    best_sub, best = sub, None
    for step in (0, -1, 1):
        trial = np.clip(sub.astype(np.int16) + step, -128, 127).astype(np.int8)
        scale = (d * trial.astype(np.float32))[..., None]  # (n, 16, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            levels = np.where(scale != 0, np.clip(_nearest(x / scale), -32, 31), np.float32(0))
        error = ((scale * levels - x) ** 2).sum(axis=2)  # (n, 16)
        if best is None:
            best = error
            continue
        better = error < best
        best, best_sub = np.where(better, error, best), np.where(better, trial, best_sub)
    return best_sub


def _dequantize_q6_K(data: np.ndarray) -> np.ndarray:
    n = data.shape[0]
    ql = data[:, :128].reshape(n, 2, 1, 64)
    qh = data[:, 128:192].reshape(n, 2, 1, 32)
    scales = data[:, 192:208].view(np.int8).astype(np.float32)  # (n, 16)
    d = _from_f16(data[:, 208:210])  # (n, 1)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 4, 32)  # (n, half, quarter, l)
    high = np.concatenate([(qh >> shift) & 0x03 for shift in (0, 2, 4, 6)], axis=2)  # (n, half, quarter, l)
    q = (low | (high << 4)).astype(np.float32).reshape(n, 16, 16) - 32
    return ((d * scales)[..., None] * q).reshape(n, QK_K)


# --- bf16 ---------------------------------------------------------------------------------------------------


def _quantize_bf16(blocks: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(blocks).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet = ((bits & 0xFFFF0000) | (64 << 16)) >> 16
    return np.where(nan, quiet, rounded).astype(np.uint16).view(np.uint8).reshape(blocks.shape[0], -1)


def _dequantize_bf16(data: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


_QUANTIZE = {"bf16": _quantize_bf16, "q8_0": _quantize_q8_0, "q4_0": _quantize_q4_0, "q4_K": _quantize_q4_K, "q6_K": _quantize_q6_K}
_DEQUANTIZE = {"bf16": _dequantize_bf16, "q8_0": _dequantize_q8_0, "q4_0": _dequantize_q4_0, "q4_K": _dequantize_q4_K, "q6_K": _dequantize_q6_K}


def quantize(values: np.ndarray, name: str, *, reference: bool = False) -> np.ndarray:
    """A matrix (rows, columns) of float32 as blocks of format `name`: uint8 (rows, row_bytes). Example:
    quantize(np.ones((2, 32), np.float32), "q8_0").shape -> (2, 34). reference=True searches the K formats'
    scales over ggml's own trial points only (`SEARCH_REFERENCE`), for comparing bytes with llama.cpp."""
    fmt = FORMATS[name]
    values = np.ascontiguousarray(values, dtype=np.float32)
    rows, columns = values.shape
    if not fmt.fits(columns):
        raise ValueError(f"{columns} columns are not a whole number of {name} blocks of {fmt.block_size}")
    out = np.empty((rows, fmt.row_bytes(columns)), dtype=np.uint8)
    step = max(1, CHUNK_VALUES // columns)
    for start in range(0, rows, step):
        chunk = values[start : start + step]
        blocks = chunk.reshape(-1, fmt.block_size)
        quantized = _QUANTIZE[name](blocks, reference) if name in SEARCH else _QUANTIZE[name](blocks)
        out[start : start + step] = quantized.reshape(chunk.shape[0], -1)
    return out


def dequantize(data: np.ndarray, name: str, columns: int) -> np.ndarray:
    """Blocks uint8 (rows, row_bytes) of format `name` back to float32 (rows, columns)."""
    fmt = FORMATS[name]
    data = np.ascontiguousarray(data, dtype=np.uint8)
    rows = data.shape[0]
    out = np.empty((rows, columns), dtype=np.float32)
    step = max(1, CHUNK_VALUES // max(columns, 1))
    for start in range(0, rows, step):
        chunk = data[start : start + step]
        out[start : start + step] = _DEQUANTIZE[name](chunk.reshape(-1, fmt.type_size)).reshape(chunk.shape[0], columns)
    return out


# where each format keeps its fp16 scales, as (offset, count) in a block: what `scales_finite` reads
_SCALES = {"q8_0": (0, 1), "q4_0": (0, 1), "q4_K": (0, 2), "q6_K": (208, 1)}


def scales_finite(data: np.ndarray, name: str) -> bool:
    """Whether every block's fp16 scale(s) in `data` (rows, row_bytes) is finite (bf16: every value)."""
    fmt = FORMATS[name]
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, fmt.type_size)
    if name == "bf16":
        return bool(((blocks.view(np.uint16) & 0x7F80) != 0x7F80).all())
    offset, count = _SCALES[name]
    scales = blocks[:, offset : offset + 2 * count].view(np.uint16)
    return bool(((scales & 0x7C00) != 0x7C00).all())
