"""Which block format each tensor of a run gets for a file type (`bf16`, `q8_0`, `q4_0`, `q4_k_m`), chosen as
llama.cpp's quantizer chooses (src/llama-quant.cpp, `llama_tensor_get_type_impl`, without an importance matrix),
for tfcli's tensor names. Torch-free.

What is quantized: the token embedding, the untied output head and every block's linear weights (2-D, names
ending in `.weight`); norms, biases and the learned position table stay f32 (llama.cpp keeps 1-D tensors f32).
The rules llama.cpp applies on top of the file type's own format, for the types tfcli has:

- the output head (the token embedding where it is tied): q6_K for every quantized file type but q8_0 (q8_0:
  q8_0), q8_0 where its rows are not a whole number of 256-blocks;
- q4_k_m: `attn_v` and `ffn_down` in q6_K in the layers `use_more_bits` picks (the first and last eighth, and
  every third between), q4_K elsewhere. tfcli keeps q, k and v in one matrix (`attn.qkv`), which takes attn_v's
  format; llama.cpp gives a fused `attn_qkv` (GPT-2's) q5_K, a format tfcli lacks, so it gets q6_K there too;
- a row that is not a whole number of blocks falls back as llama.cpp's `tensor_type_fallback` does (q6_K to
  q8_0; q4_K to q8_0, where llama.cpp takes q5_0, which tfcli lacks: more bits, never fewer), and to f32 (left
  out) where even 32 does not divide it (llama.cpp: f16).
"""

from __future__ import annotations

import re

from tfcli.errors import TfcliError
from tfcli.quant.formats import FORMATS

FILE_TYPES = ("bf16", "q8_0", "q4_0", "q4_k_m")  # what `tfcli quantize --type` takes (llama-quantize's names, lower case)
BASE = {"bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_k_m": "q4_K"}
FALLBACK = {"q4_K": "q8_0", "q6_K": "q8_0"}

_BLOCK = re.compile(r"^decoder\.blocks\.(\d+)\.(attn\.qkv|attn\.out|mlp\.fc|mlp\.proj)\.weight$")


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers that get more bits in the _M mixes: the first and last eighth, and every
    third layer between. Example: [i for i in range(12) if use_more_bits(i, 12)] -> [0, 3, 6, 9, 10, 11]"""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _fit(name: str, columns: int) -> str | None:
    """`name`, or its fallback where a row is not a whole number of its blocks; None: stays f32."""
    while not FORMATS[name].fits(columns):
        if name not in FALLBACK:
            return None
        name = FALLBACK[name]
    return name


def plan(shapes: dict[str, tuple[int, ...]], file_type: str, layers: int, tied: bool) -> dict[str, str]:
    """Tensor name -> block format for the tensors of a decoder run (`shapes`: name -> shape of its state dict,
    the tied head left out) quantized to `file_type`; tensors not named stay f32."""
    if file_type not in FILE_TYPES:
        raise TfcliError(f"--type {file_type!r} is not a type tfcli quantizes to", hint=f"use one of {', '.join(FILE_TYPES)}")
    base = BASE[file_type]
    output = "lm_head.weight" if not tied else "tok_emb.weight"
    chosen: dict[str, str] = {}
    for name, shape in shapes.items():
        if len(shape) != 2:
            continue
        block = _BLOCK.match(name)
        if name not in ("tok_emb.weight", "lm_head.weight") and block is None:
            continue
        kind = base
        if name == output and base not in ("bf16", "q8_0"):
            kind = "q6_K" if shape[1] % FORMATS["q6_K"].block_size == 0 else "q8_0"
        elif block is not None and file_type == "q4_k_m" and block.group(2) in ("attn.qkv", "mlp.proj"):
            kind = "q6_K" if use_more_bits(int(block.group(1)), layers) else base
        fitted = _fit(kind, shape[1])
        if fitted is not None:
            chosen[name] = fitted
    return chosen


def gguf_format(file_type: str, planned: str, gguf_name: str, sliced: bool, columns: int) -> str:
    """The format of one GGUF tensor cut from a tfcli tensor `plan` gave `planned`: in q4_k_m, q and k cut from
    tfcli's fused q/k/v take the file type's own format (llama.cpp gives only attn_v more bits); every other
    tensor keeps its tensor's. Example: gguf_format("q4_k_m", "q6_K", "blk.3.attn_k.weight", True, 256) -> "q4_K"."""
    if file_type == "q4_k_m" and sliced and gguf_name.rsplit(".", 2)[-2] in ("attn_q", "attn_k"):
        return _fit(BASE[file_type], columns) or planned
    return planned
