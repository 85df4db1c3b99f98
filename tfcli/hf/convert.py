"""Import a Hugging Face folder into a run directory, and export a run to a folder transformers loads.

Each family module (gpt2, llama, gemma3, bert) says how config.json maps to a ModelConfig and how each tfcli tensor
is made of the class's tensors; this module does the rest for all of them: it picks the family, reads the
weights one tensor at a time (checking each shape and value before it is kept), and writes atomically.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import safetensors.torch
import torch

from tfcli.checkpoint import model_from_tensors, save_checkpoint
from tfcli.errors import TfcliError
from tfcli.fsutil import (
    atomic_write_json,
    atomic_write_text,
    held_temp_folder,
    place_folder,
    prepare_output_dir,
    refuse_non_utf8_path,
    remove_abandoned_temps,
    removed_note,
    set_default_mode,
    temp_path_beside,
)
from tfcli.hf import bert, gemma3, gpt2, llama
from tfcli.hf.folder import HfConfig, WeightFiles, is_tfcli_run, read_hf_config
from tfcli.hf.mapping import TensorMap
from tfcli.hf.tokenizer import GENERATION_CONFIG_FILE, import_tokenizer, without_padding
from tfcli.loader import load_run
from tfcli.meta_device import on_meta_device
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.rundir import CONFIG_FILE, WEIGHTS_FILE, refuse_other_artifacts
from tfcli.tokenizer.chat_template import ChatTemplate
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from tfcli.tokenizer.specials import END_OF_GENERATION_KEY, end_of_generation_ids

FAMILIES: dict[str, ModuleType] = {name: family for family in (gpt2, llama, gemma3, bert) for name in family.CLASSES}
MODEL_TYPES = {"GPT2LMHeadModel": "gpt2", **llama.MODEL_TYPES, **gemma3.MODEL_TYPES, **{name: "bert" for name in bert.CLASSES}}
# The class a config.json without `architectures` is read as, by its model_type.
DEFAULT_CLASSES = {
    "gpt2": "GPT2LMHeadModel",
    **{model_type: name for name, model_type in (llama.MODEL_TYPES | gemma3.MODEL_TYPES).items()},
    "bert": "BertModel",
}


@dataclasses.dataclass
class Imported:
    config: ModelConfig
    hf_class: str
    parameters: int
    notes: list[str]


def _hf_class(hf: dict[str, Any], path: Path) -> str:
    """The transformers class config.json describes (its `architectures`, else its model_type's usual one)."""
    architectures = hf.get("architectures")
    model_type = hf.get("model_type")
    if isinstance(architectures, list) and architectures:
        name = architectures[0]
        if name not in FAMILIES:
            raise TfcliError(f"{path} describes {name!r}, which tfcli cannot import", hint=f"tfcli imports {', '.join(FAMILIES)}")
        if model_type is not None and model_type != MODEL_TYPES[name]:
            raise TfcliError(f"{path} describes model_type {model_type!r}, not {MODEL_TYPES[name]} as {name} is")
        return name
    if model_type in DEFAULT_CLASSES:
        return DEFAULT_CLASSES[model_type]
    raise TfcliError(f"{path} describes model_type {model_type!r} and no architectures tfcli knows", hint=f"tfcli imports {', '.join(FAMILIES)}")


def _refuse_quantized(hf: dict[str, Any], path: Path) -> None:
    """A folder quantized for transformers (FP8 with block scales, GPTQ, AWQ, bitsandbytes, ...) stores other
    tensors, or the same names in other units, beside their scales: read as plain weights they would be wrong."""
    quantization = hf.get("quantization_config")
    if quantization is None:
        return
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    method = f"{method!r}" if isinstance(method, str) else "a method tfcli does not know"
    raise TfcliError(
        f"{path} describes weights quantized by {method} (its quantization_config), which tfcli does not read",
        hint="import the model's full-precision folder (then `tfcli quantize` it), or a GGUF file of it",
    )


def _refuse_to_overwrite(folder: Path, what: str, verb: str, made: str) -> None:
    """Both directions write config.json, model.safetensors and the tokenizer's files (the `made` thing);
    what is already there is never replaced."""
    if any((folder / name).exists() for name in ("config.json", WEIGHTS_FILE)):
        held = "a tfcli run" if is_tfcli_run(folder) else what
        raise TfcliError(f"{folder} already holds {held}", hint=f"{verb} into another folder with -o, or delete that one first")
    refuse_other_artifacts(folder, made)


def _read_tensor(weights: WeightFiles, mapping: TensorMap, expected: tuple[int, ...], where: Path) -> torch.Tensor:
    """Our tensor `mapping.ours`, made of its Hugging Face parts, each checked against the shape the config implies."""
    parts = []
    sizes = mapping.split or (expected[0],)
    for theirs, size in zip(mapping.theirs, sizes):
        stored = weights.find(theirs)
        if stored is None:
            raise TfcliError(f"{where} lacks the tensor {theirs}", hint="use the weights that came with this config.json")
        want = (size, *expected[1:])
        want = tuple(reversed(want)) if mapping.transposed else want
        if weights.shape(stored) != want:
            raise TfcliError(
                f"tensor {stored} has shape {list(weights.shape(stored))} but config.json implies {list(want)}",
                hint="the weights and config.json do not belong together",
            )
        tensor = weights.read(stored)
        if not tensor.is_floating_point():
            raise TfcliError(f"tensor {stored} has dtype {tensor.dtype}, not a floating-point type")
        tensor = tensor.to(torch.float32)
        if not torch.isfinite(tensor).all():
            raise TfcliError(f"tensor {stored} holds non-finite values")
        parts.append(tensor.t() if mapping.transposed else tensor)
    tensor = torch.cat(parts) if len(parts) > 1 else parts[0]
    return (tensor + mapping.offset if mapping.offset else tensor).contiguous()


def import_hf(src: Path, run_dir: Path) -> Imported:
    """Read a Hugging Face folder (safetensors only, one tensor at a time) and save it as a tfcli run directory."""

    src, run_dir = Path(src), Path(run_dir)
    if not src.exists():
        raise TfcliError(f"{src} does not exist", hint="pass a Hugging Face model folder (config.json + model.safetensors + tokenizer) or a .gguf file")
    if not src.is_dir():
        if (src.parent / "config.json").is_file():  # model.safetensors, config.json, a shard: a file of the folder wanted
            raise TfcliError(
                f"{src} is a file of a Hugging Face model folder; tfcli imports the whole folder",
                hint=f"pass the folder: tfcli import {src.parent} -o {run_dir}",
            )
        raise TfcliError(f"{src} is not a folder", hint="pass a Hugging Face model folder (config.json + model.safetensors + tokenizer)")
    _refuse_to_overwrite(run_dir, "a model", "import", "imported run")
    if is_tfcli_run(src):
        raise TfcliError(f"{src} is a tfcli run already; there is nothing to import", hint="use it as it is, or copy the folder")
    data = read_hf_config(src)
    hf_class = _hf_class(data, src / "config.json")
    _refuse_quantized(data, src / "config.json")
    family = FAMILIES[hf_class]
    try:
        config, notes = family.model_config(HfConfig(data, src / "config.json"), hf_class)
    except TfcliError as error:
        if error.message.startswith("model "):  # ModelConfig's own check: say which file asked for it
            raise TfcliError(f"{src / 'config.json'} describes a model tfcli cannot build: {error.message}") from None
        raise
    with on_meta_device():
        expected = {name: tuple(t.shape) for name, t in Transformer(config).state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    with WeightFiles(src) as weights:
        for mapping in family.tensor_maps(config, hf_class):
            state[mapping.ours] = _read_tensor(weights, mapping, expected[mapping.ours], src)
    fresh = family.fresh_tensors(config, hf_class)  # what tfcli's model has and the class does not
    state.update(fresh)
    assert set(expected) - set(state) <= ({"lm_head.weight"} if config.tie_embeddings else set()), set(expected) - set(state)
    labels = family.labels(HfConfig(data, src / "config.json"), hf_class)
    refuse_non_utf8_path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise TfcliError(f"run path {run_dir} is a file, not a folder", hint="pass a folder path with -o")
    target = run_dir.absolute()
    prepare_output_dir(target.parent, "run")
    removed = remove_abandoned_temps(target)
    with held_temp_folder(target) as staged:  # the run is made whole here, then put in place: a kill -9 leaves no half run
        tokenizer, tokenizer_notes = import_tokenizer(src, staged)
        if tokenizer.vocab_size > config.vocab_size:  # fewer is fine: the model's vocabulary was padded (nanoGPT: 50,304)
            raise TfcliError(
                f"the tokenizer in {src} has {tokenizer.vocab_size:,} tokens but the model only {config.vocab_size:,}",
                hint="the tokenizer files do not belong to these weights",
            )
        model = model_from_tensors(config, state)
        save_checkpoint(staged, model, tokenizer, source=str(src), source_class=hf_class, training={"labels": labels} if labels is not None else None)
        place_folder(staged, target, last=(WEIGHTS_FILE, CONFIG_FILE))  # a folder holds a run once they are there
    parameters = model.parameter_count() - sum(t.numel() for t in fresh.values())
    return Imported(config, hf_class, parameters, ([removed_note(removed)] if removed else []) + notes + tokenizer_notes)


def export_class(config: ModelConfig, recorded: str | None) -> str:
    """The transformers class a run exports to, from its options (and the class it was imported from);
    when none can express it, the error names what each candidate cannot."""
    if config.arch == "encoder":
        candidates = [bert.choose_class(config, recorded)]
    elif gemma3.options(config):
        candidates = [gemma3.CLASS]
    else:
        candidates = [llama.choose_class(config, recorded), "GPT2LMHeadModel"]
        if config.positions != "rotary":
            candidates.reverse()
    problems = [(name, _option_beyond(config, name) or FAMILIES[name].incompatible(config, name)) for name in candidates]
    for name, problem in problems:
        if problem is None:
            return name
    raise TfcliError(
        "; ".join(f"{name} cannot express this model: {problem}" for name, problem in problems),
        hint="tfcli exports decoders as GPT-2, Llama, Qwen2, Qwen3, Mistral, Phi-3 or Gemma 3 and encoders as BERT, with their options",
    )


def _option_beyond(config: ModelConfig, hf_class: str) -> str | None:
    """An option the class's module leaves to others: Gemma 3's own (post_norms, scaled embeddings, local
    layers, ...) and the logits' soft cap (its final_logit_softcapping) for every other class; a norm on q
    and k and heads of their own width, which only the Llama-shaped classes and Gemma 3 express, for GPT-2
    and BERT, whose modules predate both. (ReLU², the speedrun's MLP, is refused by each class's own
    activation check; zero-initialised projections are an initialisation, which every class takes.)"""
    family = FAMILIES[hf_class]
    if family is not gemma3 and gemma3.options(config):
        return f"{gemma3.options(config)[0]} (only {gemma3.CLASS} has it)"
    if family is not gemma3 and config.logit_softcap is not None:
        return f"logit_softcap {config.logit_softcap:g} ({hf_class} does not soft-cap its logits; only {gemma3.CLASS}'s final_logit_softcapping does)"
    if family in (llama, gemma3):
        return None
    if config.qk_norm:
        return f"qk_norm ({hf_class} has no norm on q and k)"
    if config.q_width != config.d_model:
        return f"d_head {config.head_dim} ({hf_class}'s heads are d_model / n_heads wide)"
    return None


def export_hf(run_dir: Path, out_dir: Path) -> tuple[str, dict[str, Any]]:
    """Write OUT/config.json, OUT/model.safetensors and the tokenizer files for the transformers class
    that expresses this run; returns that class and its config."""
    _refuse_to_overwrite(Path(out_dir), "an exported model", "export", "exported model")
    checkpoint = load_run(run_dir, "export")  # an adapter run's adapter is merged (export_lora_hf keeps it apart)
    return write_hf_folder(checkpoint, checkpoint.model.state_dict(), out_dir)


def write_hf_folder(checkpoint, state: dict[str, torch.Tensor], out_dir: Path) -> tuple[str, dict[str, Any]]:
    """Write the weights `state` (tfcli names) of the checkpoint's model as the transformers class that expresses it."""
    config = checkpoint.config.model
    hf_class = export_class(config, checkpoint.config.source_class)
    family = FAMILIES[hf_class]
    refuse_non_utf8_path(out_dir)
    out_dir = prepare_output_dir(out_dir, "export")
    tensors = {}
    for mapping in family.tensor_maps(config, hf_class):
        tensor = state[mapping.ours].detach()
        tensor = tensor - mapping.offset if mapping.offset else tensor
        parts = tensor.split(list(mapping.split)) if mapping.split else (tensor,)
        for name, part in zip(mapping.theirs, parts):
            tensors[name] = (part.t() if mapping.transposed else part).contiguous()
    weights_tmp = temp_path_beside(out_dir / WEIGHTS_FILE)
    try:
        safetensors.torch.save_file(tensors, str(weights_tmp), metadata={"format": "pt"})
        set_default_mode(weights_tmp)
        weights_tmp.replace(out_dir / WEIGHTS_FILE)
    finally:
        weights_tmp.unlink(missing_ok=True)
    labels = (checkpoint.config.training or {}).get("labels")
    hf_config = family.hf_config(config, hf_class, checkpoint.tokenizer.special_ids)
    if config.n_classes:
        names = labels if isinstance(labels, list) else [f"LABEL_{i}" for i in range(config.n_classes)]
        hf_config.update(id2label={str(i): name for i, name in enumerate(names)}, label2id={name: i for i, name in enumerate(names)})
    atomic_write_json(out_dir / "config.json", hf_config)
    atomic_write_text(out_dir / TOKENIZER_FILE, without_padding(checkpoint.tokenizer.path.read_text(encoding="utf-8")))  # as the run encodes
    tokenizer_config_path = checkpoint.tokenizer.path.parent / TOKENIZER_CONFIG_FILE
    tokenizer_config = json.loads(tokenizer_config_path.read_text(encoding="utf-8")) if tokenizer_config_path.is_file() else {}
    if tokenizer_config or hf_class != "GPT2LMHeadModel":
        written = {key: value for key, value in tokenizer_config.items() if key != END_OF_GENERATION_KEY}  # generation_config.json says it
        written["model_max_length"] = config.block_size
        written.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        atomic_write_json(out_dir / TOKENIZER_CONFIG_FILE, written)
    generation = generation_config(hf_config, checkpoint.tokenizer, tokenizer_config, checkpoint.path)
    if generation is not None:
        atomic_write_json(out_dir / GENERATION_CONFIG_FILE, generation)
    return hf_class, hf_config


def generation_config(hf_config: dict[str, Any], tokenizer, tokenizer_config: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    """generation_config.json: transformers' generate stops at any id of eos_token_id, so the list holds every
    id the run ends a text at: those its files name (end_of_generation_ids: an imported Llama 3.1's three), a
    chat run's end-of-turn token (<|im_end|>), then the end-of-text token. None for a run without a chat template
    that ends at eos alone."""
    end_of_generation_ids(tokenizer_config, tokenizer.vocab_size, str(run_dir / TOKENIZER_CONFIG_FILE))  # checked
    ends = list(tokenizer_config.get(END_OF_GENERATION_KEY) or [])  # in the order the file lists them
    try:
        template = ChatTemplate.for_tokenizer(tokenizer, tokenizer_config, str(run_dir))
    except TfcliError:  # a template jinja2 cannot compile is exported as it is, as transformers would read it
        template = None
    if template is not None:
        ends += [tokenizer.hf.token_to_id(text) for text in template.end_of_turn_texts]
    if not ends and template is None:
        return None
    ends = list(dict.fromkeys(i for i in [*ends, hf_config.get("eos_token_id")] if i is not None))
    return {"bos_token_id": hf_config.get("bos_token_id"), "eos_token_id": ends}
