"""The run directory: config.json, model.safetensors and a copy of the tokenizer. Saved atomically,
validated completely before use, and never unpickled.

A save writes every file to a temp path in the run directory first (fsynced), then renames them into
place with config.json last: a crash while writing leaves the previous checkpoint as it was. A load
checks the config (unknown keys, types, absurd sizes) before allocating anything, then the weight file's
header against the shapes the config implies, the tokenizer against the vocabulary, and every tensor for
non-finite values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from tfcli import __version__
from tfcli.adapters import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, MAX_CHAIN, PEFT_PREFIX, check_parent_weights, find_parent, peft_config
from tfcli.adapters.lora import adapter_tensors, apply_lora, attached, expected_adapter_shapes, load_adapter, merged_state, saved_module_keys
from tfcli.errors import TfcliError
from tfcli.fsutil import commit_staged, prepare_output_dir, stage_copy, stage_json, stage_written, staging
from tfcli.meta_device import on_meta_device
from tfcli.model.config import ModelConfig
from tfcli.model.layers import RotaryEmbedding, sinusoidal_table
from tfcli.model.transformer import Transformer
from tfcli.quant.linear import QuantEmbedding, QuantLinear, held_tensors
from tfcli.quant.mix import plan
from tfcli.quant.tensors import Blocks, quantized_bytes, read_quantized
from tfcli.rundir import (
    CHECKPOINT_FORMAT,
    CONFIG_FILE,
    WEIGHTS_FILE,
    RunConfig,
    read_run_config,
    refuse_other_artifacts,
    run_file_problems,
    weights_path,
)
from tfcli.tensorfile import read_tensors
from tfcli.tokenizer.core import TOKENIZER_FILE, TextTokenizer

TIED_KEY = "lm_head.weight"


@dataclasses.dataclass
class Checkpoint:
    model: Transformer
    config: RunConfig
    tokenizer: TextTokenizer
    path: Path
    notes: list[str] = dataclasses.field(default_factory=list)  # what the loader did that a command should say (weights dequantized)


def _tensors_to_save(model: Transformer) -> dict[str, torch.Tensor]:
    tensors = {}
    adapter = attached(model) is not None
    for name, tensor in (adapter_tensors(model) if adapter else model.state_dict()).items():
        if name == TIED_KEY and model.config.tie_embeddings and not adapter:
            continue  # the same tensor as tok_emb.weight: saved once, re-tied on load
        if not torch.isfinite(tensor).all():
            raise TfcliError(f"tensor {name} holds non-finite values; not saving a broken checkpoint")
        tensors[name] = tensor.detach().to("cpu").contiguous()
    return tensors


def save_checkpoint(
    run_dir: Path,
    model: Transformer,
    tokenizer: TextTokenizer,
    *,
    training: dict[str, Any] | None = None,
    source: str | None = None,
    source_class: str | None = None,
    before_commit: Callable[[Path], None] | None = None,
    after_commit: Callable[[], None] | None = None,
    quantized: tuple[dict[str, str], dict[str, torch.Tensor]] | None = None,
) -> RunConfig:
    """Write RUN/config.json, RUN/model.safetensors and RUN/tokenizer.json (+ tokenizer_config.json).
    `before_commit(staged_weights_path)` runs once everything is staged and before anything is renamed
    (the trainer records the weights' checksum there); `after_commit()` right after the renames, before a
    signal that came during them is delivered (the trainer swaps its state in there). A model with LoRA adapters
    (`tfcli.adapters.lora`) saves the adapters only: adapter_model.safetensors and adapter_config.json, its
    parent named in config.json. `quantized` (types, tensors): the tensors to write instead of the model's,
    some of them block bytes whose format `types` names (`quantize_run`)."""
    if tokenizer.vocab_size > model.config.vocab_size:  # a larger model vocabulary is padding (nanoGPT's 50,304)
        raise TfcliError(f"the tokenizer has {tokenizer.vocab_size:,} tokens but the model only {model.config.vocab_size:,}")
    run_dir = prepare_output_dir(Path(run_dir), "run")
    adapter = attached(model)
    if adapter is not None:
        adapter = adapter.placed_in(run_dir)
    with staging(sweep=run_dir) as staged:  # (temp, final), renamed in this order
        weights_name = ADAPTER_WEIGHTS_FILE if adapter is not None else WEIGHTS_FILE
        tensors = _tensors_to_save(model) if quantized is None else quantized[1]
        weights_tmp = stage_written(run_dir / weights_name, lambda tmp: safetensors.torch.save_file(tensors, str(tmp), metadata={"format": "pt"}))
        staged.append((weights_tmp, run_dir / weights_name))
        if adapter is not None:
            tied = model.config.tie_embeddings and "tok_emb" in adapter.modules_to_save
            settings = peft_config(adapter, adapter.modules, adapter.modules_to_save, adapter.parent_path, ensure_weight_tying=tied)
            staged.append((stage_json(run_dir / ADAPTER_CONFIG_FILE, settings), run_dir / ADAPTER_CONFIG_FILE))
        staged += [(stage_copy(origin, final), final) for origin, final in tokenizer.copies_into(run_dir)]
        config = RunConfig(
            format_version=CHECKPOINT_FORMAT,
            model=model.config,
            tokenizer_sha256=tokenizer.sha256,
            weights_bytes=weights_tmp.stat().st_size,
            tfcli_version=__version__,
            training=training,
            source=source,
            source_class=source_class,
            adapter=adapter,
            quantized=None if quantized is None else dict(sorted(quantized[0].items())),
        )
        staged.append((stage_json(run_dir / CONFIG_FILE, config.to_json()), run_dir / CONFIG_FILE))
        if before_commit is not None:
            before_commit(weights_tmp)
    commit_staged(staged, then=after_commit)
    return config


def load_checkpoint(run_dir: Path, device: str = "cpu", *, merge_adapter: bool = True, keep_quantized: bool = False, _depth: int = 0) -> Checkpoint:
    """Load a run directory, checking everything before the model is used. An adapter run loads its parent
    and applies the adapter: merged into the weights (a plain model, as every command but training wants
    it), or with merge_adapter=False wrapped as it trains (`tfcli.adapters.lora`). A quantized run's linear
    layers stay quantized with keep_quantized=True (`QuantLinear`, on the CPU), else every tensor is dequantized
    to f32."""

    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    tokenizer = TextTokenizer.load(run_dir / TOKENIZER_FILE)
    problems = run_file_problems(run_dir, config, tokenizer)
    if problems:
        raise problems[0]
    if config.adapter is not None:
        model = _load_adapter_run(run_dir, config, merge_adapter, _depth, keep_quantized and torch.device(device).type == "cpu")
        return Checkpoint(model=model.to(device).eval(), config=config, tokenizer=tokenizer, path=run_dir)

    with on_meta_device():
        expected = {name: tuple(t.shape) for name, t in Transformer(config.model).state_dict().items()}
    if config.model.tie_embeddings:
        expected.pop(TIED_KEY, None)
    if config.quantized:
        tensors = read_quantized(run_dir / WEIGHTS_FILE, expected, config.quantized, run_dir / CONFIG_FILE)
        model = _quantized_model(config.model, tensors, keep=keep_quantized and torch.device(device).type == "cpu")
        return Checkpoint(model=model.to(device).eval(), config=config, tokenizer=tokenizer, path=run_dir)
    tensors = read_tensors(run_dir / WEIGHTS_FILE, expected)
    model = model_from_tensors(config.model, tensors)
    return Checkpoint(model=model.to(device).eval(), config=config, tokenizer=tokenizer, path=run_dir)


def _quantized_model(model_config: ModelConfig, tensors: dict[str, torch.Tensor | Blocks], keep: bool) -> Transformer:
    """A model over a quantized run's tensors: with `keep`, its linear layers over the block bytes (QuantLinear)
    and its token embedding too (QuantEmbedding, its rows dequantized as they are looked up; a tied head shares
    its bytes); every tensor dequantized to f32 otherwise, and those of no block format always."""
    kept = {name: t for name, t in tensors.items() if keep and isinstance(t, Blocks)}
    plain = {name: t.dequantized() if isinstance(t, Blocks) else t for name, t in tensors.items() if name not in kept}
    if not kept:
        return model_from_tensors(model_config, plain)
    tied = model_config.tie_embeddings
    if tied and "tok_emb.weight" in plain:
        plain[TIED_KEY] = plain["tok_emb.weight"]
    with on_meta_device():
        model = Transformer(model_config)
    missing, unexpected = model.load_state_dict(plain, strict=False, assign=True)
    assert not unexpected and set(missing) == set(kept) | ({TIED_KEY} if tied and "tok_emb.weight" in kept else set()), (missing, unexpected)
    for name, blocks in kept.items():
        parent_name, _, child = name.removesuffix(".weight").rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if name == "tok_emb.weight":
            model.tok_emb = QuantEmbedding(blocks)
            continue
        linear = getattr(parent, child)
        assert isinstance(linear, torch.nn.Linear), name
        setattr(parent, child, QuantLinear(blocks, linear.bias.data if linear.bias is not None else None))
    if tied and "tok_emb.weight" in kept:
        model.lm_head = QuantLinear(tensors["tok_emb.weight"], model.lm_head.bias.data if model.lm_head.bias is not None else None)  # the same bytes
    elif tied:
        model.lm_head.weight = model.tok_emb.weight
    _rebuild_position_tables(model)
    return model


def quantize_run(run_dir: Path, out_dir: Path, file_type: str) -> RunConfig:
    """Write OUT as RUN's weights quantized to `file_type` (bf16, q8_0, q4_0, q4_k_m: each tensor's format as
    llama.cpp's quantizer mixes them, `tfcli.quant.mix`), or with `f32` a quantized run's weights dequantized.
    The tokenizer and the training record come along; OUT is written atomically (config.json last)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    config = read_run_config(run_dir)
    if config.model.arch != "decoder":
        raise TfcliError(f"{run_dir} is {config.model.arch} model; tfcli quantizes decoder runs", hint="quantize a decoder (GPT-style) run")
    if config.quantized and file_type != "f32":
        formats = ", ".join(sorted(set(config.quantized.values())))
        raise TfcliError(f"{run_dir} is already quantized ({formats})", hint="quantize the run it was made from, or write it back to f32 with --type f32")
    if not config.quantized and file_type == "f32":
        raise TfcliError(f"{run_dir} holds f32 weights already; there is nothing to dequantize", hint="pick a type: bf16, q8_0, q4_0, q4_k_m")
    if (out_dir / CONFIG_FILE).exists() or (out_dir / WEIGHTS_FILE).exists():
        raise TfcliError(f"{out_dir} already holds a run", hint="write to another folder with -o, or delete that one first")
    refuse_other_artifacts(out_dir, "quantized run")
    checkpoint = load_checkpoint(run_dir)
    model = checkpoint.model
    if file_type == "f32":
        return save_checkpoint(out_dir, model, checkpoint.tokenizer, training=config.training, source=str(run_dir), source_class=config.source_class)
    tensors = _tensors_to_save(model)
    types = plan({name: tuple(t.shape) for name, t in tensors.items()}, file_type, config.model.decoder_layers, config.model.tie_embeddings)
    for name, kind in types.items():
        tensors[name] = quantized_bytes(tensors[name], kind)
    return save_checkpoint(
        out_dir, model, checkpoint.tokenizer, training=config.training, source=str(run_dir), source_class=config.source_class, quantized=(types, tensors)
    )


def _load_adapter_run(run_dir: Path, config: RunConfig, merge: bool, depth: int, keep_quantized: bool = False) -> Transformer:
    """The parent's weights (loaded as any run is, an adapter run's merged) with this run's adapter. Over a
    quantized parent kept quantized (QLoRA), the adapter stays wrapped beside the blocks, merged or not."""

    record = config.adapter
    assert record is not None
    if depth >= MAX_CHAIN:
        raise TfcliError(f"{run_dir} is an adapter on an adapter on ... more than {MAX_CHAIN} deep", hint="its config.json's adapter.parent loops back")
    parent_dir = find_parent(run_dir, record)
    check_parent_weights(parent_dir, weights_path(parent_dir), record)
    keep = keep_quantized and bool(read_run_config(parent_dir).quantized)
    parent = load_checkpoint(parent_dir, keep_quantized=keep, _depth=depth + 1).model
    adapter = read_tensors(run_dir / ADAPTER_WEIGHTS_FILE, expected_adapter_shapes(config.model, record))
    with on_meta_device():
        expected = {name: tuple(t.shape) for name, t in Transformer(config.model).state_dict().items()}
    if config.model.tie_embeddings:
        expected.pop(TIED_KEY, None)  # the embedding's matrix, which may be the adapter's own (a grown vocabulary)
    state = held_tensors(parent) if keep else parent.state_dict()  # kept quantized: the blocks as they are
    own = saved_module_keys(record, expected)  # the adapter's whole modules (a new head): the parent need not have them
    for name, shape in expected.items():
        if name in own:
            continue
        if name not in state or tuple(state[name].shape) != shape:
            raise TfcliError(
                f"the parent run {parent_dir} does not fit the adapter in {run_dir} (tensor {name})", hint="an adapter fits only the model it was trained on"
            )
    state = {name: state[name] for name in expected if name not in own}
    if merge and not keep:
        return model_from_tensors(config.model, merged_state(state, record, adapter))
    state.update({key: adapter[PEFT_PREFIX + key] for key in own})
    model = apply_lora(model_from_tensors(config.model, state), record)
    load_adapter(model, adapter)
    return model


def save_merged(run_dir: Path, out_dir: Path) -> RunConfig:
    """Write OUT as a full run: an adapter run's parent weights with the adapter merged into them (its
    training record kept, `source` naming the adapter run)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if read_run_config(run_dir).adapter is None:
        raise TfcliError(f"{run_dir} is not an adapter run; there is nothing to merge", hint="drop --merge")
    if (out_dir / CONFIG_FILE).exists() or (out_dir / WEIGHTS_FILE).exists():
        raise TfcliError(f"{out_dir} already holds a run", hint="merge into another folder with -o, or delete that one first")
    refuse_other_artifacts(out_dir, "merged run")
    checkpoint = load_checkpoint(run_dir)
    return save_checkpoint(
        out_dir, checkpoint.model, checkpoint.tokenizer, training=checkpoint.config.training, source=str(run_dir), source_class=checkpoint.config.source_class
    )


def model_from_tensors(model_config: ModelConfig, tensors: dict[str, torch.Tensor | Blocks]) -> Transformer:
    """A model over these tensors, used as they are (no copy, no random initialisation first); the tied
    output weight may be absent. Blocks among them (a quantized base, `held_tensors`) stay quantized."""

    if any(isinstance(t, Blocks) for t in tensors.values()):
        return _quantized_model(model_config, tensors, keep=True)
    tensors = dict(tensors)
    if model_config.tie_embeddings:
        tensors[TIED_KEY] = tensors["tok_emb.weight"]
    with on_meta_device():
        model = Transformer(model_config)
    model.load_state_dict(tensors, strict=True, assign=True)
    if model_config.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    _rebuild_position_tables(model)
    return model


def _rebuild_position_tables(model: Transformer) -> None:
    """The sinusoid and rotary tables are computed, not saved; a model built on the meta device needs them made."""
    config = model.config
    if config.positions == "sinusoidal":
        model.sinusoid = sinusoidal_table(config.block_size, config.d_model)
    elif config.positions == "rotary":
        tables = RotaryEmbedding(config.rotary_dim, config.block_size, config.rope_base, config.rope_scaling)
        model.rotary.cos, model.rotary.sin = tables.cos, tables.sin  # in place: every self-attention holds this module
        if model.local_rotary is not None:  # the local layers' own (Gemma 3's rope_local_base)
            tables = RotaryEmbedding(config.rotary_dim, config.block_size, config.rope_local_base)
            model.local_rotary.cos, model.local_rotary.sin = tables.cos, tables.sin
