"""The C structs that native.c's decoder_step reads, described once: `header()` writes them as layout.h,
which native.c includes, and `DecoderLayer` / `Decoder` are the same fields as ctypes structures for
decode_step.py to fill. Changing a field here changes both sides (and the build's cache key)."""

from __future__ import annotations

import ctypes

NORMS = ("layernorm", "rmsnorm")  # codes 0, 1: the C enum NORM_LAYER, NORM_RMS
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "swiglu")  # codes 0..3: ACTIVATION_GELU, ...

# (C type, name, comment). Pointers are addresses of fp32 tensors; NULL for a missing bias or table.
LAYER_FIELDS = [
    ("const float *", "attn_norm_weight", ""),
    ("const float *", "attn_norm_bias", ""),
    ("const float *", "qkv_weight", "(d + 2 * n_kv * hs, d): queries, then keys, then values"),
    ("const float *", "qkv_bias", ""),
    ("const float *", "out_weight", "(d, d)"),
    ("const float *", "out_bias", ""),
    ("const float *", "mlp_norm_weight", ""),
    ("const float *", "mlp_norm_bias", ""),
    ("const float *", "fc_weight", "(up, d), up = hidden (2 * hidden for SwiGLU: gate, then up)"),
    ("const float *", "fc_bias", ""),
    ("const float *", "proj_weight", "(d, hidden)"),
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
    ("const float *", "token_embedding", "(vocab, d)"),
    ("const float *", "position_table", "(block, d): learned or sinusoidal positions, added; NULL otherwise"),
    ("const float *", "rotary_cos", "(block, hs): rotary positions; NULL otherwise"),
    ("const float *", "rotary_sin", ""),
    ("const float *", "final_norm_weight", "pre-norm only: NULL means no final norm"),
    ("const float *", "final_norm_bias", ""),
    ("const float *", "head_weight", "(vocab, d)"),
    ("const decoder_layer *", "layers", "n_layers of them"),
]

_CTYPES = {"long": ctypes.c_long, "int": ctypes.c_int, "float": ctypes.c_float}


def _ctype(c_type: str):
    if c_type == "const decoder_layer *":
        return ctypes.POINTER(DecoderLayer)
    return ctypes.c_void_p if c_type.endswith("*") else _CTYPES[c_type]


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
    """layout.h: the codes and the two structs, as native.c includes them."""
    norms = ", ".join(f"NORM_{'LAYER' if name == 'layernorm' else 'RMS'} = {code}" for code, name in enumerate(NORMS))
    activations = ", ".join(f"ACTIVATION_{name.upper()} = {code}" for code, name in enumerate(ACTIVATIONS))
    lines = [
        "/* Written by tfcli/accel/layout.py for native.c; not to be edited. */",
        f"enum {{ {norms} }};",
        f"enum {{ {activations} }};",
        *_struct("decoder_layer", LAYER_FIELDS),
        *_struct("decoder", DECODER_FIELDS),
    ]
    return "\n".join(lines) + "\n"
