"""CPU time of one decoded token's products over block-quantized weights, by tfcli's C kernels (tfcli/accel/blocks.c)
on each SIMD path, at a model's shapes: every layer's weights its own random blocks (so they come from memory, as
in decoding, not from the cache), the kernels called directly (no PyTorch step, no Python layer around them).

    python3 scripts/bench_quant_kernels.py [--preset gpt2-small] [--paths avx512,avx512_vnni] [--types q8_0,q4_0,q4_k_m,bf16] [--rows 1]

One thread; CPU seconds (time.process_time), the median of --repeat tokens: on a shared machine wall time includes
the time others ran. Prints one line a type and path: ms a token, the weights' bytes and the bandwidth that is.
The mixes: q4_0 with a q6_K head, q4_k_m as q4_K with q6_K for the head and for the qkv and down projections of
two layers in three (an approximation of llama-quantize's use_more_bits).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from tfcli.accel import quant
from tfcli.model.config import preset
from tfcli.quant.formats import FORMATS
from tfcli.quant.linear import QuantLinear
from tfcli.quant.tensors import Blocks

SCALES = {"q8_0": (0,), "q4_0": (0,), "q4_K": (0, 2), "q6_K": (208,)}  # the fp16 scales' byte offsets in a block


def random_blocks(fmt: str, rows: int, columns: int, seed: int) -> torch.Tensor:
    """Random block bytes with finite fp16 scales (rows, bytes per row)."""
    spec, rng = FORMATS[fmt], np.random.default_rng(seed)
    n = rows * columns // spec.block_size
    if fmt == "bf16":
        values = rng.standard_normal(n * spec.block_size).astype(np.float32)
        return torch.from_numpy((values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1).copy())
    data = rng.integers(0, 256, size=(n, spec.type_size), dtype=np.uint8)
    for offset in SCALES[fmt]:
        data[:, offset : offset + 2] = rng.uniform(-2, 2, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return torch.from_numpy(data.reshape(rows, -1))


def layers(model: str, kind: str) -> list[QuantLinear]:
    config = preset(model)
    d, ff = config.d_model, config.d_ff or 4 * config.d_model
    shapes = [(3 * d, d), (d, d), (ff, d), (d, ff)]  # qkv, out, up, down (gpt2-shaped blocks)
    built = []
    for layer in range(config.n_layers):
        for j, (n, k) in enumerate(shapes):
            fmt = {"q4_0": "q4_0", "q8_0": "q8_0", "bf16": "bf16"}.get(kind) or ("q6_K" if j in (0, 3) and layer % 3 != 1 else "q4_K")
            built.append(QuantLinear(Blocks(random_blocks(fmt, n, k, 4 * layer + j), fmt, (n, k))))
    head = {"q8_0": "q8_0", "bf16": "bf16"}.get(kind, "q6_K")
    built.append(QuantLinear(Blocks(random_blocks(head, config.vocab_size, d, 99), head, (config.vocab_size, d))))
    return built


def token(function, model: list[QuantLinear], inputs: dict[int, torch.Tensor]) -> None:
    for layer in model:
        quant.run(function, layer, inputs[layer.in_features])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--paths", default=",".join(path for path in quant.PATHS if quant.runnable(path)))
    parser.add_argument("--types", default="q8_0,q4_0,q4_k_m,bf16")
    parser.add_argument("--rows", type=int, default=1, help="input rows (1: decoding; more: a served batch)")
    parser.add_argument("--repeat", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for kind in args.types.split(","):
        model = layers(args.preset, kind)
        size = sum(layer.blocks.numel() for layer in model)
        inputs = {k: torch.randn(args.rows, k) for k in {layer.in_features for layer in model}}
        for path in args.paths.split(","):
            function = quant.kernel(path)
            if function is None:
                print(f"{kind:7} {path:12} unavailable: {quant.problem(path)}")
                continue

            token(function, model, inputs)
            seconds = []
            for _ in range(args.repeat):
                started = time.process_time()
                token(function, model, inputs)
                seconds.append(time.process_time() - started)
            median = statistics.median(seconds)
            print(f"{kind:7} {path:12} rows {args.rows}: {median * 1e3:6.2f} ms a token, {size / 1e6:.1f} MB, {size / median / 1e9:.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
