"""The C structs that native.c's decoder_step reads, described once: `header()` writes them as layout.h,
which native.c includes, and `Matrix` / `DecoderLayer` / `Decoder` are the same fields as ctypes structures for
decode_step.py to fill. Changing a field here changes both sides (and the build's cache key).

A weight matrix is a `matrix`: fp32 values (`format` FP32), or block-quantized rows in one of blocks.c's formats
with the product and the dequantizer (blocks.c's `quant_linear` / `quant_linear_int8` and `quant_dequantize`, as
tfcli.accel.quant chose them for this matrix) that the step calls for it."""

from __future__ import annotations

import ctypes

NORMS = ("layernorm", "rmsnorm")  # codes 0, 1: the C enum NORM_LAYER, NORM_RMS
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "swiglu")  # codes 0..3: ACTIVATION_GELU, ...

FP32 = -1  # a matrix's `format` when it holds fp32 values; blocks.c's codes (accel.quant.FORMAT_CODE) otherwise

# (C type, name, comment). The C function types of blocks.c's product and dequantizer, which a matrix points to.
FUNCTION_TYPES = [
    ("int (*quant_product)(int format, const void *w, const float *x, float *y, long m, long n, long k)", "y (m, n) = x (m, k) W^T"),
    ("int (*quant_expand)(int format, const void *w, float *out, long n, long k)", "out (n, k) = W as fp32"),
]
MATRIX_FIELDS = [
    ("const void *", "data", "fp32 (rows, k), or the block bytes (rows, row_bytes)"),
    ("int", "format", "FORMAT_FP32, or blocks.c's code of the block format"),
    ("long", "row_bytes", "block formats: the bytes of one row"),
    ("quant_product", "product", "block formats: the product chosen for this matrix (one row)"),
    ("quant_expand", "expand", "block formats: the dequantizer (the token embedding's rows)"),
]
# Pointers are addresses of fp32 tensors; NULL for a missing bias or table.
LAYER_FIELDS = [
    ("const float *", "attn_norm_weight", ""),
    ("const float *", "attn_norm_bias", ""),
    ("matrix", "qkv_weight", "(d + 2 * n_kv * hs, d): queries, then keys, then values"),
    ("const float *", "qkv_bias", ""),
    ("matrix", "out_weight", "(d, d)"),
    ("const float *", "out_bias", ""),
    ("const float *", "mlp_norm_weight", ""),
    ("const float *", "mlp_norm_bias", ""),
    ("matrix", "fc_weight", "(up, d), up = hidden (2 * hidden for SwiGLU: gate, then up)"),
    ("const float *", "fc_bias", ""),
    ("matrix", "proj_weight", "(d, hidden)"),
    ("const float *", "proj_bias", ""),
    ("float *", "keys", "(n_kv, capacity, hs): this layer's cache for the one row"),
    ("float *", "values", ""),
]
DECODER_FIELDS = [
    *(("long", name, "") for name in ("d_model", "n_heads", "n_kv_heads", "head_dim", "hidden", "vocab", "capacity", "n_layers")),
    ("int", "norm", "a NORM_ code"),
    ("int", "pre_norm", "1: x + f(norm(x)); 0: norm(x + f(x))"),
    ("int", "activation", "an ACTIVATION_ code"),
    ("float", "norm_eps", ""),
    ("matrix", "token_embedding", "(vocab, d)"),
    ("const float *", "position_table", "(block, d): learned or sinusoidal positions, added; NULL otherwise"),
    ("const float *", "rotary_cos", "(block, hs): rotary positions; NULL otherwise"),
    ("const float *", "rotary_sin", ""),
    ("const float *", "final_norm_weight", "pre-norm only: NULL means no final norm"),
    ("const float *", "final_norm_bias", ""),
    ("matrix", "head_weight", "(vocab, d)"),
    ("const decoder_layer *", "layers", "n_layers of them"),
]

_CTYPES = {"long": ctypes.c_long, "int": ctypes.c_int, "float": ctypes.c_float, "quant_product": ctypes.c_void_p, "quant_expand": ctypes.c_void_p}


def _ctype(c_type: str):
    if c_type == "const decoder_layer *":
        return ctypes.POINTER(DecoderLayer)
    if c_type == "matrix":
        return Matrix
    return ctypes.c_void_p if c_type.endswith("*") else _CTYPES[c_type]


class Matrix(ctypes.Structure):
    """native.c's matrix: one weight, fp32 or block-quantized, by address."""

    _fields_ = [(name, _ctype(c_type)) for c_type, name, _ in MATRIX_FIELDS]


class DecoderLayer(ctypes.Structure):
    """native.c's decoder_layer: one block's tensors, by address."""

    _fields_ = [(name, _ctype(c_type)) for c_type, name, _ in LAYER_FIELDS]


class Decoder(ctypes.Structure):
    """native.c's decoder: the shape, the settings and the tensors every step reads."""

    _fields_ = [(name, _ctype(c_type)) for c_type, name, _ in DECODER_FIELDS]


def _struct(name: str, fields: list[tuple[str, str, str]]) -> list[str]:
    lines = ["typedef struct {"]
    for c_type, field, comment in fields:
        declaration = f"    {c_type}{'' if c_type.endswith('*') else ' '}{field};"
        lines.append(f"{declaration}  /* {comment} */" if comment else declaration)
    return [*lines, f"}} {name};"]


def header() -> str:
    """layout.h: the codes, the function types and the three structs, as native.c includes them."""
    norms = ", ".join(f"NORM_{'LAYER' if name == 'layernorm' else 'RMS'} = {code}" for code, name in enumerate(NORMS))
    activations = ", ".join(f"ACTIVATION_{name.upper()} = {code}" for code, name in enumerate(ACTIVATIONS))
    lines = [
        "/* Written by tfcli/accel/layout.py for native.c; not to be edited. */",
        f"enum {{ {norms} }};",
        f"enum {{ {activations} }};",
        f"enum {{ FORMAT_FP32 = {FP32} }};",
        *(f"typedef {declaration};  /* {comment} */" for declaration, comment in FUNCTION_TYPES),
        *_struct("matrix", MATRIX_FIELDS),
        *_struct("decoder_layer", LAYER_FIELDS),
        *_struct("decoder", DECODER_FIELDS),
    ]
    return "\n".join(lines) + "\n"
