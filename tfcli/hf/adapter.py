"""Export a LoRA run for PEFT: OUT/base, the parent's model as a transformers folder (with the run's new
head, if it trained one), and OUT/adapter, the adapter in PEFT's layout under the class's module names, so
that `PeftModel.from_pretrained(AutoModel...from_pretrained(OUT/base), OUT/adapter)` computes what tfcli does.
A run that grew the vocabulary (a chat template's tokens) trained the embedding whole: the adapter holds it as
PEFT's modules_to_save, and OUT/base is the parent with the vocabulary already grown, so PEFT needs no
`resize_token_embeddings` first.

The names come from each family's tensor map. Where tfcli fuses layers the class keeps apart (Llama's and
BERT's q, k and v; Llama's gate and up), one LoRA on the fused layer is the same function as one per part
with the same A and B's rows split: delta = B A, so delta's rows for q are B_q A. GPT-2 stores its layers
as Conv1D (in, out): PEFT reads them with fan_in_fan_out, its A and B keep the usual shapes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors.torch

from tfcli.adapters import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, PEFT_PREFIX, find_parent, peft_config
from tfcli.adapters.lora import base_state
from tfcli.adapters.vocabulary import VOCABULARY_TENSORS, grow_vocabulary, vocabulary_modules
from tfcli.checkpoint import TIED_KEY
from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_write_text, prepare_output_dir, set_default_mode
from tfcli.hf.convert import FAMILIES, export_class, write_hf_folder
from tfcli.loader import load_run
from tfcli.rundir import read_run_config

if TYPE_CHECKING:
    import torch

BASE_DIR, ADAPTER_DIR = "base", "adapter"
TIED_OUTPUT = "lm_head.weight"  # the output layer of GPT2LMHeadModel and LlamaForCausalLM
PEFT_TIES = ("embed_tokens", "lm_head")  # the module names PEFT's ensure_weight_tying acts on (its EMBEDDING_LAYER_NAMES)


def export_lora_hf(run_dir: Path, out_dir: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Write OUT/base (a transformers folder) and OUT/adapter (adapter_config.json, adapter_model.safetensors);
    returns the class, its config and the adapter's config."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if read_run_config(run_dir).adapter is None:
        raise TfcliError(f"{run_dir} is not an adapter run", hint="export it with tfcli export RUN --to hf")
    for sub in (BASE_DIR, ADAPTER_DIR):
        if (out_dir / sub).exists():
            raise TfcliError(f"{out_dir / sub} already exists", hint="export into another folder with -o, or delete that one first")
    checkpoint = load_run(run_dir, "export-adapter")
    record, config, model = checkpoint.config.adapter, checkpoint.config.model, checkpoint.model
    hf_class = export_class(config, checkpoint.config.source_class)
    maps = {m.ours: m for m in FAMILIES[hf_class].tensor_maps(config, hf_class)}
    tensors, targets, saved, conv1d = {}, [], [], set()
    for name in record.modules:
        mapping = maps.get(f"{name}.weight")
        if mapping is None:
            raise TfcliError(
                f"{hf_class} has no layer for tfcli's {name}, so its LoRA adapter cannot be exported", hint="merge it: tfcli export RUN --merge --to hf"
            )
        layer = model.get_submodule(name)
        a, b = layer.lora_A.weight.detach(), layer.lora_B.weight.detach()
        parts = b.split(list(mapping.split)) if mapping.split else (b,)
        for theirs, part in zip(mapping.theirs, parts):
            module = theirs.removesuffix(".weight")
            tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = a.clone().contiguous()
            tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = part.clone().contiguous()
            targets.append(module)
        conv1d.add(mapping.transposed)
    if len(conv1d) > 1:
        raise TfcliError(f"the adapter wraps both Conv1D and linear layers of {hf_class}; PEFT sets fan_in_fan_out for all of them at once")
    for name in record.modules_to_save:
        for key, tensor in model.get_submodule(name).state_dict().items():
            mapping = maps.get(f"{name}.{key}")
            if mapping is None or len(mapping.theirs) != 1:
                raise TfcliError(
                    f"{hf_class} has no single tensor for tfcli's {name}.{key}, so the adapter cannot be exported",
                    hint="merge it: tfcli export RUN --merge --to hf",
                )
            tensors[PEFT_PREFIX + mapping.theirs[0]] = (tensor.t() if mapping.transposed else tensor).detach().clone().contiguous()
            saved.append(mapping.theirs[0].rpartition(".")[0])
    tied = config.tie_embeddings and "tok_emb" in record.modules_to_save
    if tied:  # PEFT keeps the tied output layer's copy too (ensure_weight_tying): the same matrix
        tensors[PEFT_PREFIX + TIED_OUTPUT] = model.tok_emb.weight.detach().clone().contiguous()
    hf_class, hf_config = write_hf_folder(checkpoint, _base_weights(run_dir, checkpoint), out_dir / BASE_DIR)
    adapter_dir = prepare_output_dir(out_dir / ADAPTER_DIR, "export")
    # PEFT ties only an embedding it knows by name (embed_tokens); for another (GPT-2's wte) the flag would
    # only warn, and the lm_head copy above, loaded into the tied matrix, keeps both sides the same
    ensure_tying = tied and any(name.rpartition(".")[2] in PEFT_TIES for name in saved)
    adapter_config = peft_config(
        record, targets, list(dict.fromkeys(saved)), str((out_dir / BASE_DIR).resolve()), fan_in_fan_out=conv1d == {True}, ensure_weight_tying=ensure_tying
    )
    safetensors.torch.save_file(tensors, str(adapter_dir / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
    set_default_mode(adapter_dir / ADAPTER_WEIGHTS_FILE)
    atomic_write_text(adapter_dir / ADAPTER_CONFIG_FILE, json.dumps(adapter_config, indent=2) + "\n")
    return hf_class, hf_config, adapter_config


def _base_weights(run_dir: Path, checkpoint) -> dict[str, torch.Tensor]:
    """base/'s weights (tfcli names): the frozen base with the run's new head, and where the run grew the
    vocabulary, the parent's embedding (and output layer) grown as training began, new rows at the mean: the
    trained ones are the adapter's."""
    record, config = checkpoint.config.adapter, checkpoint.config.model
    state = base_state(checkpoint.model)
    if not set(vocabulary_modules(config)) & set(record.modules_to_save):
        return state
    parent = load_run(find_parent(run_dir, record), "export").model.state_dict()
    names = [n for n in VOCABULARY_TENSORS if n in parent and not (n == TIED_KEY and config.tie_embeddings)]
    state.update(grow_vocabulary({n: parent[n] for n in names}, config.vocab_size))
    if config.tie_embeddings:
        state[TIED_KEY] = state["tok_emb.weight"]
    return state
