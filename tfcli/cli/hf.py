"""`tfcli export` and `tfcli import`: run directories to and from Hugging Face model folders and GGUF files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import stderr_console, stdout_console

# text, not a Path: --to gguf tells a folder by its trailing "/", which a Path drops
ExportOutput = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        metavar="<path>",
        help="Folder for config.json, model.safetensors and the tokenizer (--to gguf: the .gguf file, or a folder to write RUN-NAME.gguf into).",
    ),
]


def export(
    run: Annotated[Path, typer.Argument(help="The run directory to export.", show_default=False)],
    output: ExportOutput,
    to: Annotated[
        Optional[str],
        typer.Option(
            "--to",
            help="Target format: hf (a transformers model folder), gguf (one file for llama.cpp) or tfcli (a run directory, with --merge) [default: hf; tfcli with --merge].",
            show_default=False,
        ),
    ] = None,
    merge: Annotated[bool, typer.Option("--merge", help="A LoRA run: merge its adapter into the weights and write a full model.")] = False,
    type_: Annotated[
        Optional[str],
        typer.Option(
            "--type",
            help="--to gguf: the weights' type, f32, f16, q8_0, bf16, q4_0 or q4_k_m (mixed as llama-quantize mixes them; norms and biases stay f32; a quantized run's own blocks go out as they are) [default: f32; a quantized run: its own blocks].",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Export a run to a Hugging Face folder that transformers' from_pretrained loads.

    The class follows the run's options: GPT2LMHeadModel (learned positions, pre-norm LayerNorm, biases),
    LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM / Qwen3ForCausalLM (QK-norm) / Phi3ForCausalLM
    (rotary, RMSNorm, SwiGLU), or for an encoder
    BertForMaskedLM / BertModel / BertForSequenceClassification (post-norm, embedding LayerNorm, token
    types). An option the class cannot express is named, and nothing is written.

    --to gguf writes one GGUF file that llama.cpp, Ollama and LM Studio load: architecture llama for
    rotary runs (RMSNorm, SwiGLU, grouped-query attention), qwen3 with q/k norms, phi3 with longrope,
    gpt2 for learned positions (LayerNorm, GELU: llama.cpp computes its tanh form); an option the file
    cannot carry is named and nothing is written. With the tokenizer (byte-level BPE as gpt2, SentencePiece-style as llama), its special
    tokens, the chat template and the context length in the file's metadata. A LoRA run is merged first.

    A LoRA run (train finetune --lora-rank) exports as OUT/base, its parent as that class, and OUT/adapter,
    which PEFT's PeftModel.from_pretrained(base, OUT/adapter) loads onto it. With --merge the adapter is
    merged into the weights instead: a full tfcli run in OUT (tfcli export RUN --merge -o OUT), or with
    --to hf a full transformers folder.

    \b
    Example: tfcli export runs/mine --to hf -o exported/
    Or: tfcli export runs/mine --to gguf -o mine.gguf --type q8_0
    """
    from tfcli.errors import TfcliError
    from tfcli.fsutil import nothing_left_on_failure
    from tfcli.hf import export_hf
    from tfcli.rundir import read_run_config

    target = to if to is not None else ("tfcli" if merge else "hf")
    if target not in ("hf", "gguf", "tfcli"):
        raise TfcliError(f"unknown export format {target!r}", hint="use --to hf, --to gguf, or --merge --to tfcli")
    if type_ is not None and target != "gguf":
        raise TfcliError("--type is for --to gguf", hint="drop --type, or add --to gguf")
    if target == "gguf":
        _export_gguf(run, output, type_ or _gguf().default_type(run))
        return
    folder = Path(output)
    adapter = read_run_config(run).adapter
    if merge and adapter is None:
        raise TfcliError(f"{run} is not a LoRA run; there is nothing to merge", hint="drop --merge")
    if target == "tfcli" and not merge:
        raise TfcliError("--to tfcli writes a LoRA run merged into a full run", hint="add --merge, or copy the run directory as it is")
    if target == "tfcli":
        _export_merged(run, folder, adapter)
        return
    if adapter is not None and not merge:
        _export_adapter(run, folder)
        return
    with nothing_left_on_failure(folder, "exporting to"):
        hf_class, config = export_hf(run, folder)
    layers = config.get("n_layer", config.get("num_hidden_layers"))
    merged = " with its LoRA adapter merged" if adapter is not None else ""
    stdout_console().print(f"exported {run}{merged} to {folder} ({hf_class}, {layers} layers, vocab {config['vocab_size']:,})")


def _export_gguf(run: Path, given: str, type_: str) -> None:
    from tfcli.fsutil import no_empty_folder_left, removed_note

    output = _gguf().gguf_path(run, given)
    existed = output.exists()  # export refuses a file that is there; one there after a failure is its own
    with no_empty_folder_left(output.parent):  # a folder -o made for a file that was not written
        try:
            exported = _gguf().export_gguf(run, output, type_)
        except BaseException:
            if not existed and output.is_file() and not output.is_symlink():
                output.unlink()  # a signal that came after the rename: an interrupted export leaves nothing
            raise
    if exported.removed:
        stderr_console().print(f"note: {removed_note(exported.removed)}", markup=False, highlight=False, soft_wrap=True)
    for note in exported.notes:
        stderr_console().print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    stdout_console().print(
        f"exported {run} to {output} (GGUF {exported.arch}, {type_}, {exported.tensors} tensors, {exported.bytes:,} bytes, tokenizer {exported.tokenizer_model}); run it with llama-cli -m {output}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _export_merged(run: Path, output: Path, adapter) -> None:
    """--merge --to tfcli: the LoRA run merged into a full run."""
    from tfcli.checkpoint import save_merged
    from tfcli.fsutil import nothing_left_on_failure

    with nothing_left_on_failure(output, "merging into"):
        config = save_merged(run, output)
    stdout_console().print(
        f"merged the LoRA adapter of {run} (rank {adapter.rank}, {len(adapter.modules)} layers) into a full run in {output} ({config.weights_bytes:,} bytes of weights)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _export_adapter(run: Path, output: Path) -> None:
    """A LoRA run to transformers and PEFT: its parent as OUT/base, the adapter as OUT/adapter."""
    from tfcli.fsutil import nothing_left_on_failure
    from tfcli.hf.adapter import ADAPTER_DIR, BASE_DIR, export_lora_hf

    with nothing_left_on_failure(output, "exporting to"):
        hf_class, config, adapter_config = export_lora_hf(run, output)
    stdout_console().print(
        f"exported the parent of {run} to {output / BASE_DIR} ({hf_class}) and its LoRA adapter to {output / ADAPTER_DIR} "
        f"(rank {adapter_config['r']}, {len(adapter_config['target_modules'])} {hf_class} modules); load it with PeftModel.from_pretrained(model, {str(output / ADAPTER_DIR)!r})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def import_(
    source: Annotated[
        Path, typer.Argument(help="A Hugging Face model folder (config.json, safetensors weights, tokenizer) or a .gguf file.", show_default=False)
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="The run directory to create.")],
) -> None:
    """Import a Hugging Face model folder or a GGUF file into a tfcli run directory.

    Classes: GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, Qwen3ForCausalLM,
    Phi3ForCausalLM, BertForMaskedLM,
    BertModel, BertForSequenceClassification. Reads config.json, model.safetensors or its shards with
    model.safetensors.index.json (pickle files are refused, never opened), and the tokenizer: tokenizer.json,
    vocab.json + merges.txt, or vocab.txt, with the special tokens tokenizer_config.json and
    special_tokens_map.json name. tfcli never downloads: fetch the folder first (huggingface-cli download).

    A GGUF file (llama.cpp's format) of architecture llama, qwen2, qwen3, phi3 or gpt2, with tensors of
    any type llama.cpp writes (Q8_0, Q4_0, Q4_K, Q6_K and BF16 kept in their blocks, the others dequantized to
    f32, with a note): its tokenizer
    is rebuilt as a tokenizer.json that encodes as llama.cpp does. Nothing in the file is executed; every
    tensor is checked to lie inside it.

    \b
    Example: tfcli import ~/models/SmolLM2-135M -o runs/smollm2
    Or: tfcli import ~/models/smollm2-135m-instruct-q8_0.gguf -o runs/smollm2
    """
    from tfcli.fsutil import nothing_left_on_failure, removed_note

    if source.is_file() and (source.suffix.lower() == ".gguf" or _starts_with_gguf_magic(source)):
        gguf = _gguf()
        with nothing_left_on_failure(output, "importing into"):
            done = gguf.import_gguf(source, output)
        if done.removed:
            stderr_console().print(f"note: {removed_note(done.removed)}", markup=False, highlight=False, soft_wrap=True)
        for note in done.notes:
            stderr_console().print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(done.types.items()))
        stdout_console().print(
            f"imported {source} into {output} (GGUF {done.arch}, {done.parameters:,} parameters; tensors: {kinds})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return
    from tfcli.hf import import_hf

    with nothing_left_on_failure(output, "importing into"):
        imported = import_hf(source, output)
    for note in imported.notes:
        stderr_console().print(f"note: {note}", markup=False, highlight=False)
    stdout_console().print(f"imported {source} into {output} ({imported.hf_class}, {imported.parameters:,} parameters)", markup=False, highlight=False)


def _gguf():
    """tfcli.gguf, or a clear error when llama.cpp's gguf package (the gguf extra) is not installed."""
    from tfcli.errors import TfcliError

    try:
        import tfcli.gguf
    except ModuleNotFoundError as exc:
        if exc.name != "gguf":
            raise
        raise TfcliError("GGUF files need llama.cpp's gguf package, which is not installed", hint="pip install 'tfcli[gguf]'") from None
    return tfcli.gguf


def _starts_with_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"GGUF"
    except OSError:
        return False
