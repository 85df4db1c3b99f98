"""The one loader: a run (model, tokenizer, config) made ready for what a command does with it. Device, dtype,
threads and this machine's faster paths (`tfcli.accel`) are decided here, by purpose, and nowhere else."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tfcli.accel import accelerate, decode_step, enabled, fused_loss, memory, products
from tfcli.adapters import MAX_CHAIN, AdapterRecord, find_parent
from tfcli.checkpoint import Checkpoint, load_checkpoint
from tfcli.errors import TfcliError
from tfcli.rundir import read_run_config
from tfcli.runtime import resolve_device

_log = logging.getLogger("tfcli.loader")  # what the loader did that the user should know (the CLI prints it dim on stderr)
SMALL_MODEL = 5_000_000  # parameters under which a CPU decodes on one thread


@dataclasses.dataclass(frozen=True)
class Purpose:
    """What one use of a model asks of it."""

    accelerated: bool  # this machine's measured products and fused loss attached (TFCLI_ACCEL=0: plain all the same)
    decodes: bool = False  # one thread for a small model on the CPU, bf16 on a GPU that has it, the C decoder step ready
    merge_adapter: bool = True  # an adapter run's adapter merged into its weights; False: wrapped, as it trains
    training: bool = False  # train mode (dropout on) rather than eval mode
    default_device: str = "auto"  # where the model goes when the caller names no device
    says_dequantized: bool = True  # a note where a quantized run's own weights were dequantized (export to GGUF says what it wrote itself)
    quantized: str = "dequantize"  # a quantized run's weights: "keep" (decoding on the CPU), "hold" (kept on the CPU whatever TFCLI_ACCEL says: a frozen QLoRA base), "dequantize" (to f32), "refuse" (training from them)


PURPOSES: dict[str, Purpose] = {
    "decode": Purpose(accelerated=True, decodes=True, quantized="keep"),  # generate, serve, the lm-eval harness, bench generate
    "evaluate": Purpose(accelerated=True, quantized="keep"),  # eval: the loss and metrics on a data set, fp32
    "inspect": Purpose(accelerated=True),  # every inspect-* command, inspect-embeddings, the notebook helpers: fp32
    "export": Purpose(accelerated=False, default_device="cpu"),  # export to hf: the saved weights, fp32
    "export-gguf": Purpose(accelerated=False, default_device="cpu", says_dequantized=False),  # export to gguf: a quantized run's blocks are read from its file
    "export-adapter": Purpose(accelerated=False, merge_adapter=False, default_device="cpu"),  # a LoRA run for PEFT, kept apart
    "parent": Purpose(accelerated=False, default_device="cpu", quantized="refuse"),  # a finetune's starting weights (the trainer prepares its model)
    "lora-parent": Purpose(accelerated=False, default_device="cpu", quantized="hold"),  # a LoRA finetune's base: kept in its blocks (QLoRA)
    "resume": Purpose(accelerated=False, merge_adapter=False, default_device="cpu", quantized="hold"),  # train --resume's weights, as they train
    "train": Purpose(accelerated=True, training=True),  # prepare() only: the model a trainer steps
}


def load_run(run: Path | str, purpose: str, device: str | None = None, threads: int = 0) -> Checkpoint:
    """The run's checkpoint, its model ready for `purpose` (a key of PURPOSES) on `device` (auto, cpu, cuda,
    cuda:N or mps; None: the purpose's default), with `threads` threads (0: the purpose's choice)."""
    use = PURPOSES[purpose]
    device = resolve_device(device or use.default_device)
    config = read_run_config(Path(run))
    formats = sorted(set((config.quantized or {}).values()))
    if formats and use.quantized == "refuse":
        raise TfcliError(
            f"{run} holds quantized weights ({', '.join(formats)}); training starts from f32 weights (only LoRA adapters train over blocks)",
            hint=f"train LoRA adapters over it with --lora-rank R, or dequantize it first: tfcli quantize {run} -o RUN-f32 --type f32, and train from RUN-f32",
        )
    depth, below = _quantized_ancestor(Path(run), config.adapter) if not formats else (0, [])  # an adapter run over a quantized run (QLoRA)
    on_cpu = torch.device(device).type == "cpu"
    keep = bool(formats or below) and on_cpu and (use.quantized == "hold" or (use.quantized == "keep" and enabled()))
    if below and ((use.quantized == "hold" and use.merge_adapter) or depth > 1):
        # a LoRA finetune from an adapter run starts from its merged weights, which no block format holds; and in a
        # chain of adapter runs only a QLoRA run's own parent stays in blocks, the rest is merged into f32
        keep = False
    checkpoint = load_checkpoint(Path(run), device, merge_adapter=use.merge_adapter, keep_quantized=keep)
    if (below or (formats and use.says_dequantized)) and not keep:
        whose = f"{run}'s" if formats else f"{run}'s parent's" if depth == 1 else f"{run}'s quantized ancestor's"
        reason = "TFCLI_ACCEL=0" if use.quantized == "keep" and not enabled() else f"for {purpose.removesuffix('-gguf')}" if on_cpu else f"on {device}"
        checkpoint.notes.append(f"{whose} {', '.join(formats or below)} weights were dequantized to f32 ({reason})")
    for note in checkpoint.notes:  # said once, here, for every command: the command line shows the `tfcli.loader` logger's lines
        _log.warning("%s", note)
    prepare(checkpoint.model, purpose, device, threads)
    return checkpoint


def _quantized_ancestor(run: Path, adapter: AdapterRecord | None) -> tuple[int, list[str]]:
    """How many parents up an adapter run's chain its quantized base is (1: its own parent, a QLoRA run's) and that
    base's block formats; (0, []) for a run with none."""
    for depth in range(1, MAX_CHAIN + 1):
        if adapter is None:
            break
        run = find_parent(run, adapter)
        config = read_run_config(run)
        if config.quantized:
            return depth, sorted(set(config.quantized.values()))
        adapter = config.adapter
    return 0, []


def prepare(model: nn.Module, purpose: str, device: str | torch.device | None = None, threads: int = 0) -> nn.Module:
    """Make a built model ready for `purpose`, in place (returned): on `device` (None: where it is), in train or
    eval mode, its threads, dtype and accelerated paths chosen; on the CPU a decoding model's C step is built,
    checked and measured now, before any clock starts."""
    use = PURPOSES[purpose]
    if device is not None:
        model.to(device)
    model.train(use.training)
    on = next(model.parameters()).device
    if threads:
        torch.set_num_threads(threads)
    elif use.decodes and on.type == "cpu" and model.parameter_count() < SMALL_MODEL:
        torch.set_num_threads(1)  # a small model's steps are too short to share between threads
    if use.decodes and on.type == "cuda" and torch.cuda.is_bf16_supported():
        model.to(torch.bfloat16)  # decoding reads every weight per token: half the bytes, twice the speed
    if use.decodes and on.type == "cpu" and enabled():
        memory.use_huge_pages(model)  # the weights streamed once a token: fewer TLB misses
    if use.accelerated:
        accelerate(model)
    if use.decodes and on.type == "cpu":
        decode_step.describe(model)  # builds, checks and measures what decodes one row
    return model


def describe(model: nn.Module) -> dict[str, Any]:
    """What the loader decided for a model: where it is, its dtype, the threads, its mode and which of
    tfcli.accel's pieces it carries. Example: {"device": "cpu", "dtype": "float32", "threads": 1,
    "training": False, "accel": ["decode_step", "fused_loss", "products"]}"""
    parameter = next(model.parameters())
    pieces = {
        "products": any(isinstance(m, products.Linear) for m in model.modules()),
        "fused_loss": isinstance(model.vocabulary_loss, fused_loss.VocabularyLoss),
        "decode_step": model.fast_decode_step is not None,
    }
    return {
        "device": parameter.device.type,
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "training": model.training,
        "accel": sorted(name for name, attached in pieces.items() if attached),
    }
