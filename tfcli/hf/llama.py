"""The Llama family: LlamaForCausalLM, Qwen2ForCausalLM (biases on q, k and v), Qwen3ForCausalLM (an RMSNorm
on each head's q and k, heads of their own width), MistralForCausalLM and Phi3ForCausalLM (longrope; partial rotary,
Phi-4-mini's partial_rotary_factor). A sliding window shorter than the context is tfcli's local layers: every
layer of Mistral and Phi-3, Qwen2's and Qwen3's from max_window_layers on (with use_sliding_window).

Each is a pre-norm RMSNorm decoder with rotary positions, grouped-query attention and a SwiGLU MLP, which
tfcli's model has: the mapping only stacks q/k/v into one projection and gate/up into one (gate first), as
Phi-3 stores them already (qkv_proj, gate_up_proj). All rotate the halves of each head ([x1, x2] -> [-x2, x1]),
so no permutation is needed.
"""

from __future__ import annotations

import math
from typing import Any

from tfcli.errors import TfcliError
from tfcli.hf.folder import HfConfig
from tfcli.hf.mapping import TensorMap, incompatibility
from tfcli.model.config import ModelConfig, RopeScaling

CLASSES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM", "Phi3ForCausalLM")
MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
    "Phi3ForCausalLM": "phi3",
}
FUSED = "Phi3ForCausalLM"  # stores q/k/v as one qkv_proj and gate/up as one gate_up_proj, as tfcli does
QWENS = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")  # a sliding window on the layers from max_window_layers on
LOCAL, GLOBAL = "sliding_attention", "full_attention"  # transformers' layer_types


def rope_fraction(hf: HfConfig, hf_class: str) -> float:
    """partial_rotary_factor (in rope_parameters or beside it): the share of each head rotary turns, which of these
    classes Phi3ForCausalLM (Phi-4-mini) alone applies; 1 for the others, which refuse another."""
    parameters = hf.get("rope_parameters", dict, None) or {}
    fraction = HfConfig(parameters, hf.path).get("partial_rotary_factor", float, hf.get("partial_rotary_factor", float, 1.0))
    if fraction != 1.0 and hf_class != FUSED:
        raise TfcliError(f"{hf.path} rotates only part of each head (partial_rotary_factor {fraction:g}); tfcli reads that for {FUSED} only")
    return fraction


def rope_settings(hf: HfConfig, hf_class: str) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling, from transformers 5's rope_parameters or the older rope_theta + rope_scaling."""
    rope_fraction(hf, hf_class)
    parameters = hf.get("rope_parameters", dict, None)
    if parameters is None:
        parameters = dict(hf.get("rope_scaling", dict, None) or {})
        parameters.setdefault("rope_theta", hf.get("rope_theta", float, 10000.0))
    values = HfConfig(parameters, hf.path)
    theta = values.get("rope_theta", float, 10000.0)
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if hf_class == FUSED and kind in ("su", "yarn"):
        kind = "longrope"  # Phi-3's older names for it, as transformers' Phi3Config reads them
    if kind in ("default", "dynamic"):  # dynamic NTK turns as default up to max_position_embeddings, where tfcli's context ends
        return theta, None
    if kind == "linear":
        return theta, RopeScaling("linear", values.get("factor", float))
    if kind == "llama3":
        return theta, RopeScaling(
            "llama3",
            values.get("factor", float),
            values.get("low_freq_factor", float),
            values.get("high_freq_factor", float),
            values.get("original_max_position_embeddings", int),
        )
    if kind == "longrope":
        return theta, _longrope(hf, values)
    raise TfcliError(
        f"{hf.path} asks for rope scaling {kind!r}, which tfcli does not implement (it implements default, linear, llama3, longrope and dynamic)",
        hint="a model released without it (Qwen's YaRN is added by hand for long texts) imports as released once rope_scaling is removed from config.json",
    )


def _longrope(hf: HfConfig, values: HfConfig) -> RopeScaling:
    """Phi-3's longrope up to its original context (short_factor; long_factor is what transformers switches to
    past it), with the attention factor transformers computes when config.json gives none."""
    original = values.get("original_max_position_embeddings", int, None) or hf.get("original_max_position_embeddings", int)
    short = values.get("short_factor", list)
    if not isinstance(short, list) or not all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in short):
        raise TfcliError(f"{hf.path} has a longrope short_factor that is not a list of numbers")
    factor = values.get("factor", float, None) or hf.get("max_position_embeddings", int) / original
    attention = values.get("attention_factor", float, None)
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling("longrope", max(factor, 1.0), original_context=original, short_factor=tuple(map(float, short)), attention_factor=attention)


def model_config(hf: HfConfig, hf_class: str) -> tuple[ModelConfig, list[str]]:
    """The tfcli config of this Hugging Face config, and notes on what was adapted."""
    notes = []
    d, heads = hf.get("hidden_size", int), hf.get("num_attention_heads", int)
    if hf.get("hidden_act", str, "silu") != "silu":
        raise TfcliError(f"{hf.path} has hidden_act {hf.data['hidden_act']!r}; tfcli's SwiGLU uses silu")
    head_dim = hf.get("head_dim", int, None)  # Qwen3's heads have a width of their own; the others' are d / heads
    d_head = head_dim if head_dim is not None and (heads < 1 or head_dim * heads != d) else None
    block_size = hf.get("max_position_embeddings", int)
    rope_base, rope_scaling = rope_settings(hf, hf_class)
    if rope_scaling is not None and rope_scaling.kind == "longrope" and rope_scaling.original_context < block_size:
        notes.append(
            f"context {rope_scaling.original_context:,} (longrope's original context; past it transformers switches to long_factor, "
            "which tfcli does not implement)"
        )
        block_size = rope_scaling.original_context
    window = hf.get("sliding_window", int, None)
    local_layers = _local_layers(hf, hf_class) if window is not None and window < block_size else ()
    if hf_class == "Qwen2ForCausalLM":
        bias, qkv_bias, mlp_bias = False, True, None  # Qwen2: biases on q, k and v only
    elif hf_class in ("MistralForCausalLM", FUSED):
        bias, qkv_bias, mlp_bias = False, None, None
    else:  # Llama, Qwen3
        bias, mlp = hf.get("attention_bias", bool, False), hf.get("mlp_bias", bool, False)
        qkv_bias, mlp_bias = None, (None if mlp == bias else mlp)  # attention_bias covers q, k, v and o
    config = ModelConfig(
        arch="decoder",
        vocab_size=hf.get("vocab_size", int),
        block_size=block_size,
        n_layers=hf.get("num_hidden_layers", int),
        n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads", int, heads),
        d_model=d,
        d_head=d_head,
        d_ff=hf.get("intermediate_size", int),
        positions="rotary",
        rope_base=rope_base,
        rope_scaling=rope_scaling,
        norm="rmsnorm",
        norm_placement="pre",
        norm_eps=hf.get("rms_norm_eps", float, 1e-6),
        activation="swiglu",
        dropout=hf.get("attention_dropout", float, 0.0),
        bias=bias,
        qk_norm=hf_class == "Qwen3ForCausalLM",
        qkv_bias=qkv_bias,
        mlp_bias=mlp_bias,
        tie_embeddings=hf.get("tie_word_embeddings", bool, False),
        init_std=hf.get("initializer_range", float, 0.02),
        rope_fraction=rope_fraction(hf, hf_class),
        sliding_window=window if local_layers else None,
        local_layers=local_layers,
    )
    return config, notes


def _local_layers(hf: HfConfig, hf_class: str) -> tuple[int, ...]:
    """The layers that attend within sliding_window, as transformers reads config.json: every layer of Mistral
    and Phi-3; Qwen2's and Qwen3's only with use_sliding_window, those its layer_types mark, else those from
    max_window_layers on; none of Llama's."""
    n_layers = hf.get("num_hidden_layers", int)
    if hf_class in ("MistralForCausalLM", FUSED):
        return tuple(range(n_layers))
    if hf_class not in QWENS or not hf.get("use_sliding_window", bool, False):
        return ()
    types = hf.get("layer_types", list, None)
    if types is None:
        first = hf.get("max_window_layers", int, 28)  # Qwen2Config's default
        return tuple(range(max(first, 0), n_layers))
    if len(types) != n_layers or any(t not in (LOCAL, GLOBAL) for t in types):
        raise TfcliError(f"{hf.path} has layer_types that are not {n_layers} of {LOCAL!r} and {GLOBAL!r}")
    return tuple(i for i, kind in enumerate(types) if kind == LOCAL)


def window_classes(config: ModelConfig) -> tuple[str, ...]:
    """The classes of this module whose config.json can say which layers attend within the sliding window:
    Mistral and Phi-3 all of them, Qwen2 and Qwen3 the last ones (from max_window_layers on); all when there is none."""
    if config.sliding_window is None:
        return CLASSES
    layers = config.local_layers
    if layers != tuple(range(layers[0], config.n_layers)):
        return ()
    return ("MistralForCausalLM", FUSED, *QWENS) if layers[0] == 0 else QWENS


def tensor_maps(config: ModelConfig, hf_class: str) -> list[TensorMap]:
    q, kv, hidden = config.q_width, config.kv_heads * config.head_dim, config.hidden_dim
    maps = [TensorMap("tok_emb.weight", ("model.embed_tokens.weight",))]
    for i in range(config.n_layers):
        ours, theirs = f"decoder.blocks.{i}", f"model.layers.{i}"
        maps += [
            TensorMap(f"{ours}.attn_norm.weight", (f"{theirs}.input_layernorm.weight",)),
            TensorMap(f"{ours}.attn.out.weight", (f"{theirs}.self_attn.o_proj.weight",)),
            TensorMap(f"{ours}.mlp_norm.weight", (f"{theirs}.post_attention_layernorm.weight",)),
            TensorMap(f"{ours}.mlp.proj.weight", (f"{theirs}.mlp.down_proj.weight",)),
        ]
        if hf_class == FUSED:  # stacked as tfcli's already, and without biases
            maps.append(TensorMap(f"{ours}.attn.qkv.weight", (f"{theirs}.self_attn.qkv_proj.weight",)))
            maps.append(TensorMap(f"{ours}.mlp.fc.weight", (f"{theirs}.mlp.gate_up_proj.weight",)))
        else:
            kinds = ["weight", "bias"] if config.has_qkv_bias else ["weight"]
            maps += [TensorMap(f"{ours}.attn.qkv.{kind}", tuple(f"{theirs}.self_attn.{p}_proj.{kind}" for p in "qkv"), (q, kv, kv)) for kind in kinds]
            kinds = ["weight", "bias"] if config.has_mlp_bias else ["weight"]
            maps += [TensorMap(f"{ours}.mlp.fc.{kind}", (f"{theirs}.mlp.gate_proj.{kind}", f"{theirs}.mlp.up_proj.{kind}"), (hidden, hidden)) for kind in kinds]
        if config.qk_norm:
            maps += [TensorMap(f"{ours}.attn.{p}_norm.weight", (f"{theirs}.self_attn.{p}_norm.weight",)) for p in "qk"]
        if config.has_mlp_bias:
            maps.append(TensorMap(f"{ours}.mlp.proj.bias", (f"{theirs}.mlp.down_proj.bias",)))
        if config.bias:
            maps.append(TensorMap(f"{ours}.attn.out.bias", (f"{theirs}.self_attn.o_proj.bias",)))
    maps.append(TensorMap("decoder.norm.weight", ("model.norm.weight",)))
    if not config.tie_embeddings:
        maps.append(TensorMap("lm_head.weight", ("lm_head.weight",)))
    return maps


def choose_class(config: ModelConfig, recorded: str | None) -> str:
    """Qwen3 for a norm on q and k; Qwen2 for biases on q, k and v alone; the class a run was imported from
    when it still fits; Phi-3 for longrope or partial rotary; else Llama."""
    if config.qk_norm:
        return "Qwen3ForCausalLM"
    qwen2_biases = config.has_qkv_bias and not config.bias and not config.has_mlp_bias
    if qwen2_biases:
        return "Qwen2ForCausalLM"
    if recorded in ("MistralForCausalLM", FUSED) and not (config.has_qkv_bias or config.bias or config.has_mlp_bias):
        return recorded
    if (config.rope_scaling is not None and config.rope_scaling.kind == "longrope") or config.rope_fraction != 1:
        return FUSED
    if config.sliding_window is not None:  # Llama has none; Mistral is Llama with one on every layer
        return "MistralForCausalLM"
    return "LlamaForCausalLM"


def fresh_tensors(config: ModelConfig, hf_class: str) -> dict:
    return {}  # every tensor comes from the checkpoint


def labels(hf: HfConfig, hf_class: str) -> list[str] | None:
    return None


def incompatible(config: ModelConfig, hf_class: str) -> str | None:
    checks = [
        (config.arch == "decoder", f"arch {config.arch!r} ({hf_class} is a decoder)"),
        (config.positions == "rotary", f"positions {config.positions!r} ({hf_class} uses rotary positions)"),
        (config.norm == "rmsnorm", f"norm {config.norm!r} ({hf_class} uses RMSNorm)"),
        (config.norm_placement == "pre", f"norm_placement {config.norm_placement!r} ({hf_class} is pre-norm)"),
        (config.activation == "swiglu", f"activation {config.activation!r} ({hf_class} has a SwiGLU MLP)"),
        (config.n_classes == 0, f"a classification head ({hf_class} has none)"),
        (
            hf_class not in ("LlamaForCausalLM", "Qwen3ForCausalLM") or config.has_qkv_bias == config.bias,
            f"biases on q, k and v but not on the attention output ({hf_class}'s attention_bias covers all four)",
        ),
        (hf_class != "Qwen3ForCausalLM" or not config.has_mlp_bias, "biases in the MLP (Qwen3ForCausalLM has none)"),
        (hf_class != FUSED or not (config.bias or config.has_qkv_bias or config.has_mlp_bias), f"biases ({FUSED} has none)"),
        (config.qk_norm or hf_class != "Qwen3ForCausalLM", "no qk_norm (Qwen3ForCausalLM normalises each head's q and k)"),
        (not config.qk_norm or hf_class == "Qwen3ForCausalLM", f"qk_norm ({hf_class} has no norm on q and k)"),
        (config.rope_scaling is None or config.rope_scaling.kind != "longrope" or hf_class == FUSED, f"rope_scaling longrope (tfcli writes it as {FUSED})"),
        (config.rope_fraction == 1 or hf_class == FUSED, f"rope_fraction {config.rope_fraction:g} (partial rotary: tfcli writes it as {FUSED})"),
        (
            hf_class in window_classes(config),
            f"sliding_window {config.sliding_window} on layers {list(config.local_layers)} ({hf_class} "
            + ("has no sliding window)" if hf_class == "LlamaForCausalLM" else "cannot put it on these layers)"),
        ),
    ]
    return incompatibility(checks)


def hf_config(config: ModelConfig, hf_class: str, special_ids: dict[str, int]) -> dict[str, Any]:
    hf: dict[str, Any] = {
        "architectures": [hf_class],
        "model_type": MODEL_TYPES[hf_class],
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.hidden_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.block_size,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_base,
        "rope_scaling": rope_scaling_json(config),
        "attention_dropout": config.dropout,
        "initializer_range": config.init_std,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": special_ids.get("bos"),
        "eos_token_id": special_ids.get("eos"),
        "pad_token_id": special_ids.get("pad"),
        "torch_dtype": "float32",
    }
    window = config.sliding_window
    if hf_class == "LlamaForCausalLM":
        hf.update(attention_bias=config.bias, mlp_bias=config.has_mlp_bias)
    elif hf_class == FUSED:
        scaling = config.rope_scaling
        original = scaling.original_context if scaling is not None and scaling.kind == "longrope" else config.block_size
        hf.update(sliding_window=window, original_max_position_embeddings=original, resid_pdrop=config.dropout, embd_pdrop=config.dropout)
        hf.update(partial_rotary_factor=config.rope_fraction)
    elif hf_class == "MistralForCausalLM":
        hf.update(sliding_window=window)
    else:
        first = config.local_layers[0] if window is not None else config.n_layers
        layer_types = [LOCAL if i in config.local_layers else GLOBAL for i in range(config.n_layers)]
        hf.update(sliding_window=window, use_sliding_window=window is not None, max_window_layers=first, layer_types=layer_types)
        if hf_class == "Qwen3ForCausalLM":
            hf.update(attention_bias=config.bias)
    return hf


def rope_scaling_json(config: ModelConfig) -> dict[str, Any] | None:
    scaling = config.rope_scaling
    if scaling is None:
        return None
    if scaling.kind == "linear":
        return {"rope_type": "linear", "factor": scaling.factor}
    if scaling.kind == "longrope":  # tfcli's context ends at original_context, where long_factor would start
        return {
            "rope_type": "longrope",
            "short_factor": list(scaling.short_factor),
            "long_factor": list(scaling.short_factor),
            "attention_factor": scaling.attention_factor,
            "original_max_position_embeddings": scaling.original_context,
        }
    return {
        "rope_type": "llama3",
        "factor": scaling.factor,
        "low_freq_factor": scaling.low_freq_factor,
        "high_freq_factor": scaling.high_freq_factor,
        "original_max_position_embeddings": scaling.original_context,
    }
