"""`tfcli export` and `tfcli import`: run directories to and from Hugging Face model folders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.common import stdout_console


def export(
    run: Annotated[Path, typer.Argument(help="The run directory to export.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for config.json, model.safetensors and the tokenizer.")],
    to: Annotated[str, typer.Option("--to", help="Target format: hf (a transformers model folder).")] = "hf",
) -> None:
    """Export a run to a Hugging Face folder that transformers' from_pretrained loads.

    The class follows the run's options: GPT2LMHeadModel (learned positions, pre-norm LayerNorm, biases),
    LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM (rotary, RMSNorm, SwiGLU), or for an encoder
    BertForMaskedLM / BertModel / BertForSequenceClassification (post-norm, embedding LayerNorm, token
    types). An option the class cannot express is named, and nothing is written.

    \b
    Example: tfcli export runs/mine --to hf -o exported/
    """
    from tfcli.errors import TfcliError
    from tfcli.fsutil import nothing_left_on_failure
    from tfcli.hf import export_hf

    if to != "hf":
        raise TfcliError(f"unknown export format {to!r}", hint="use --to hf")
    with nothing_left_on_failure(output, "exporting to"):
        hf_class, config = export_hf(run, output)
    layers = config.get("n_layer", config.get("num_hidden_layers"))
    stdout_console().print(f"exported {run} to {output} ({hf_class}, {layers} layers, vocab {config['vocab_size']:,})")


def import_(
    source: Annotated[Path, typer.Argument(help="A Hugging Face model folder: config.json, safetensors weights, tokenizer.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="The run directory to create.")],
) -> None:
    """Import a Hugging Face model folder into a tfcli run directory.

    Classes: GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, BertForMaskedLM,
    BertModel, BertForSequenceClassification. Reads config.json, model.safetensors or its shards with
    model.safetensors.index.json (pickle files are refused, never opened), and the tokenizer: tokenizer.json,
    vocab.json + merges.txt, or vocab.txt, with the special tokens tokenizer_config.json and
    special_tokens_map.json name. tfcli never downloads: fetch the folder first (huggingface-cli download).

    \b
    Example: tfcli import ~/models/SmolLM2-135M -o runs/smollm2
    """
    from tfcli.cli.common import stderr_console
    from tfcli.fsutil import nothing_left_on_failure
    from tfcli.hf import import_hf

    with nothing_left_on_failure(output, "importing into"):
        imported = import_hf(source, output)
    for note in imported.notes:
        stderr_console().print(f"note: {note}", markup=False, highlight=False)
    stdout_console().print(f"imported {source} into {output} ({imported.hf_class}, {imported.parameters:,} parameters)", markup=False, highlight=False)
