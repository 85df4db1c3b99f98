"""`tfcli quantize`: a run's weights in llama.cpp's block formats, as a new run directory that decodes at that precision."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.common import stdout_console
from tfcli.cli.options import DecoderRun


def quantize(
    run: DecoderRun,
    output: Annotated[Path, typer.Option("--output", "-o", help="The new run directory.", show_default=False)],
    type_: Annotated[
        str, typer.Option("--type", help="bf16, q8_0, q4_0 or q4_k_m (llama-quantize's mixes); f32 writes a quantized run's weights back to f32.")
    ],
) -> None:
    """Quantize a decoder run's weights into a new run, as llama.cpp's quantizer does.

    The token embedding, the output head and the blocks' linear weights go into llama.cpp's block formats
    (q8_0, q4_0, q4_K, q6_K, bf16; norms, biases and position tables stay f32), each tensor's format chosen
    as llama-quantize chooses it for the type: q4_k_m gives the output head and, in some layers, the
    attention's v (tfcli's fused q/k/v) and the MLP's down projection q6_K, the rest q4_K. The bytes are
    ggml's blocks, so `tfcli export --to gguf` writes them out unchanged. generate, chat, serve and eval
    decode the quantized weights; inspect-* and fine-tuning read them dequantized (write them back to f32
    with --type f32 to fine-tune).

    \b
    Example: tfcli quantize runs/mine -o runs/mine-q4 --type q4_k_m
    """
    from collections import Counter

    from tfcli.checkpoint import quantize_run
    from tfcli.errors import TfcliError
    from tfcli.fsutil import nothing_left_on_failure
    from tfcli.quant.mix import FILE_TYPES

    if type_ not in (*FILE_TYPES, "f32"):
        raise TfcliError(f"--type {type_!r} is not a type tfcli quantizes to", hint=f"use one of {', '.join(FILE_TYPES)}, or f32 to dequantize")
    with nothing_left_on_failure(output, "quantizing into"):
        config = quantize_run(run, output, type_)
    counts = Counter((config.quantized or {}).values())
    formats = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "every tensor f32"
    size = (output / "model.safetensors").stat().st_size
    stdout_console().print(f"quantized {run} to {output} ({type_}: {formats}; {size:,} bytes)", markup=False, highlight=False, soft_wrap=True)
