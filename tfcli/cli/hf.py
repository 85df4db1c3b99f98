"""`tfcli export` and `tfcli import`: run directories to and from Hugging Face GPT-2 folders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.common import stdout_console


def export(
    run: Annotated[Path, typer.Argument(help="The run directory to export.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for config.json, model.safetensors and the tokenizer.")],
    to: Annotated[str, typer.Option("--to", help="Target format: hf (a transformers GPT2LMHeadModel folder).")] = "hf",
) -> None:
    """Export a decoder run to a Hugging Face GPT-2 folder.

    The folder loads with transformers.GPT2LMHeadModel.from_pretrained(DIR); the model needs GPT-2's
    options (learned positions, pre-norm LayerNorm, multi-head attention, biases).

    \b
    Example: tfcli export runs/mine --to hf -o exported/
    """
    from tfcli.errors import TfcliError
    from tfcli.hf import export_gpt2

    if to != "hf":
        raise TfcliError(f"unknown export format {to!r}", hint="use --to hf")
    from tfcli.fsutil import nothing_left_on_failure

    with nothing_left_on_failure(output, "exporting to"):
        config = export_gpt2(run, output)
    stdout_console().print(f"exported {run} to {output} (GPT2LMHeadModel, {config['n_layer']} layers, vocab {config['vocab_size']:,})")


def import_(
    source: Annotated[Path, typer.Argument(help="A Hugging Face GPT-2 folder: config.json, model.safetensors, tokenizer.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="The run directory to create.")],
) -> None:
    """Import a Hugging Face GPT-2 folder into a tfcli run directory.

    Reads config.json, model.safetensors (pickle files are refused) and tokenizer.json (or vocab.json
    and merges.txt), so GPT-2 weights on disk can be inspected and fine-tuned with tfcli.

    \b
    Example: tfcli import ~/models/gpt2 -o runs/gpt2
    """
    from tfcli.fsutil import nothing_left_on_failure
    from tfcli.hf import import_gpt2

    with nothing_left_on_failure(output, "importing into"):
        config = import_gpt2(source, output)
    stdout_console().print(f"imported {source} into {output} ({config.parameter_estimate():,} parameters)")
