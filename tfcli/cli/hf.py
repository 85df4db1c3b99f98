"""`tfcli export` and `tfcli import`: run directories to and from Hugging Face model folders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import stdout_console


def export(
    run: Annotated[Path, typer.Argument(help="The run directory to export.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for config.json, model.safetensors and the tokenizer.")],
    to: Annotated[
        Optional[str],
        typer.Option(
            "--to",
            help="Target format: hf (a transformers model folder) or tfcli (a run directory, with --merge) [default: hf; tfcli with --merge].",
            show_default=False,
        ),
    ] = None,
    merge: Annotated[bool, typer.Option("--merge", help="A LoRA run: merge its adapter into the weights and write a full model.")] = False,
) -> None:
    """Export a run to a Hugging Face folder that transformers' from_pretrained loads.

    The class follows the run's options: GPT2LMHeadModel (learned positions, pre-norm LayerNorm, biases),
    LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM (rotary, RMSNorm, SwiGLU), or for an encoder
    BertForMaskedLM / BertModel / BertForSequenceClassification (post-norm, embedding LayerNorm, token
    types). An option the class cannot express is named, and nothing is written.

    A LoRA run (train finetune --lora-rank) exports as OUT/base, its parent as that class, and OUT/adapter,
    which PEFT's PeftModel.from_pretrained(base, OUT/adapter) loads onto it. With --merge the adapter is
    merged into the weights instead: a full tfcli run in OUT (tfcli export RUN --merge -o OUT), or with
    --to hf a full transformers folder.

    \b
    Example: tfcli export runs/mine --to hf -o exported/
    """
    from tfcli.checkpoint import read_run_config
    from tfcli.errors import TfcliError
    from tfcli.fsutil import nothing_left_on_failure
    from tfcli.hf import export_hf

    target = to if to is not None else ("tfcli" if merge else "hf")
    if target not in ("hf", "tfcli"):
        raise TfcliError(f"unknown export format {target!r}", hint="use --to hf, or --merge --to tfcli")
    adapter = read_run_config(run).adapter
    if merge and adapter is None:
        raise TfcliError(f"{run} is not a LoRA run; there is nothing to merge", hint="drop --merge")
    if target == "tfcli" and not merge:
        raise TfcliError("--to tfcli writes a LoRA run merged into a full run", hint="add --merge, or copy the run directory as it is")
    out = stdout_console()
    if target == "tfcli":
        from tfcli.checkpoint import save_merged

        with nothing_left_on_failure(output, "merging into"):
            config = save_merged(run, output)
        out.print(
            f"merged the LoRA adapter of {run} (rank {adapter.rank}, {len(adapter.modules)} layers) into a full run in {output} ({config.weights_bytes:,} bytes of weights)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return
    if adapter is not None and not merge:
        from tfcli.hf.adapter import ADAPTER_DIR, BASE_DIR, export_lora_hf

        with nothing_left_on_failure(output, "exporting to"):
            hf_class, config, adapter_config = export_lora_hf(run, output)
        out.print(
            f"exported the parent of {run} to {output / BASE_DIR} ({hf_class}) and its LoRA adapter to {output / ADAPTER_DIR} "
            f"(rank {adapter_config['r']}, {len(adapter_config['target_modules'])} {hf_class} modules); load it with PeftModel.from_pretrained(model, {str(output / ADAPTER_DIR)!r})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return
    with nothing_left_on_failure(output, "exporting to"):
        hf_class, config = export_hf(run, output)
    layers = config.get("n_layer", config.get("num_hidden_layers"))
    merged = " with its LoRA adapter merged" if adapter is not None else ""
    out.print(f"exported {run}{merged} to {output} ({hf_class}, {layers} layers, vocab {config['vocab_size']:,})")


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
