"""Gemma 3's text decoder, Gemma3ForCausalLM (model_type gemma3_text): Llama's shape with Gemma's options.

- token embeddings times sqrt(hidden_size) (`scale_embeddings`);
- RMSNorms that scale by 1 + weight: tfcli's weight is 1 + theirs, mapped both ways (`TensorMap.offset`);
- a norm on each sublayer's output too, before the residual add (`post_norms`): post_attention_layernorm is
  the attention's out_norm, pre_feedforward_layernorm the MLP's input norm, post_feedforward_layernorm its
  out_norm;
- a norm on each head's q and k (`qk_norm`, Qwen3's), a GeGLU MLP (`activation = geglu`: tanh GELU on the
  gate), scores scaled by query_pre_attn_scalar ** -0.5 (`attn_scale`);
- local layers (layer_types' sliding_attention) that attend to the last `sliding_window` positions and turn
  q and k by rotary tables of their own base, unscaled (`local_layers`, `sliding_window`, `rope_local_base`);
  the global layers see the whole context with rope_theta and its scaling.
The final logits' soft cap that Gemma 2 had (None in Gemma 3's own configs; transformers' Gemma 3 still
applies it) is `logit_softcap`, both ways; the soft-capping of attention scores is refused.
"""

from __future__ import annotations

from typing import Any

from tfcli.errors import TfcliError
from tfcli.hf import llama
from tfcli.hf.folder import HfConfig
from tfcli.hf.mapping import TensorMap, incompatibility
from tfcli.model.config import ModelConfig, RopeScaling

CLASS = "Gemma3ForCausalLM"
CLASSES = (CLASS,)
MODEL_TYPES = {CLASS: "gemma3_text"}
LOCAL, GLOBAL = "sliding_attention", "full_attention"  # transformers' layer_types
ACTIVATION = "gelu_pytorch_tanh"
NORM_OFFSET = 1.0  # Gemma's RMSNorm scales by 1 + weight


def options(config: ModelConfig) -> list[str]:
    """The options of `config` that, among the classes tfcli writes, only Gemma3ForCausalLM expresses."""
    named = [
        ("post_norms", config.post_norms),
        ("scale_embeddings", config.scale_embeddings),
        ("activation 'geglu'", config.activation == "geglu"),
        ("attn_scale", config.attn_scale is not None),
        ("sliding_window", config.sliding_window is not None and not llama.window_classes(config)),  # Mistral's, Qwen2's: theirs
        ("rope_local_base", config.rope_local_base is not None),
    ]
    return [name for name, present in named if present]


def _layer_types(hf: HfConfig) -> list[str]:
    """Each layer's attention, local (sliding_attention) or global: layer_types, else the older
    sliding_window_pattern (every pattern-th layer global), as transformers' Gemma3TextConfig reads them."""
    n_layers = hf.get("num_hidden_layers", int)
    types = hf.get("layer_types", list, None)
    if types is None:
        pattern = hf.get("sliding_window_pattern", int, 6)
        if pattern < 1:
            raise TfcliError(f"{hf.path} has sliding_window_pattern {pattern}, which is not a positive number")
        return [LOCAL if (i + 1) % pattern else GLOBAL for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(t not in (LOCAL, GLOBAL) for t in types):
        raise TfcliError(f"{hf.path} has layer_types that are not {n_layers} of {LOCAL!r} and {GLOBAL!r}")
    return types


def _ropes(hf: HfConfig) -> tuple[float, RopeScaling | None, float]:
    """The global layers' rotary base and scaling, and the local layers' base: transformers 5's rope_parameters
    (one set per layer type), or the hub's older rope_theta, rope_scaling and rope_local_base_freq."""
    parameters = hf.get("rope_parameters", dict, None)
    if parameters is not None and {GLOBAL, LOCAL} & parameters.keys():
        full, local = dict(parameters.get(GLOBAL) or {}), dict(parameters.get(LOCAL) or {})
    else:
        full = dict(parameters or hf.get("rope_scaling", dict, None) or {})
        full.setdefault("rope_theta", hf.get("rope_theta", float, 1_000_000.0))
        local = {"rope_theta": hf.get("rope_local_base_freq", float, 10_000.0)}
    full.setdefault("rope_theta", 1_000_000.0)  # Gemma3TextConfig's defaults
    local.setdefault("rope_theta", 10_000.0)
    base, scaling = llama.rope_settings(HfConfig({"rope_parameters": full}, hf.path), CLASS)
    local_base, local_scaling = llama.rope_settings(HfConfig({"rope_parameters": local}, hf.path), CLASS)
    if local_scaling is not None:
        raise TfcliError(f"{hf.path} scales the local layers' rotary frequencies ({local_scaling.kind}); tfcli's local tables are unscaled")
    return base, scaling, local_base


def model_config(hf: HfConfig, hf_class: str) -> tuple[ModelConfig, list[str]]:
    """The tfcli config of this Hugging Face config, and notes on what was adapted (none: it is exact)."""
    if hf.get("attn_logit_softcapping", float, None) is not None:
        raise TfcliError(f"{hf.path} has attn_logit_softcapping {hf.data['attn_logit_softcapping']}; tfcli does not soft-cap attention scores")
    softcap = hf.get("final_logit_softcapping", float, None)
    if softcap is not None and not softcap > 0:
        raise TfcliError(f"{hf.path} has final_logit_softcapping {softcap:g}, which is not positive")
    if hf.get("use_bidirectional_attention", bool, False):
        raise TfcliError(f"{hf.path} has use_bidirectional_attention true; tfcli's Gemma 3 is the causal decoder")
    if hf.get("hidden_activation", str, ACTIVATION) != ACTIVATION:
        raise TfcliError(f"{hf.path} has hidden_activation {hf.data['hidden_activation']!r}; tfcli's GeGLU uses {ACTIVATION}")
    d, heads = hf.get("hidden_size", int), hf.get("num_attention_heads", int)
    head_dim = hf.get("head_dim", int, 256)
    types = _layer_types(hf)
    local_layers = tuple(i for i, kind in enumerate(types) if kind == LOCAL)
    window = hf.get("sliding_window", int, None) if local_layers else None
    if local_layers and window is None:
        raise TfcliError(f"{hf.path} has sliding_attention layers but no sliding_window")
    rope_base, rope_scaling, local_base = _ropes(hf)
    same_tables = local_base == rope_base and rope_scaling is None
    bias = hf.get("attention_bias", bool, False)  # on q, k, v and o; Gemma's MLP has none
    scalar = hf.get("query_pre_attn_scalar", float, 256.0)
    if not scalar > 0:
        raise TfcliError(f"{hf.path} has query_pre_attn_scalar {scalar:g}, which is not positive")
    config = ModelConfig(
        arch="decoder",
        vocab_size=hf.get("vocab_size", int),
        block_size=hf.get("max_position_embeddings", int),
        n_layers=len(types),
        n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads", int, heads),
        d_model=d,
        d_head=head_dim if heads < 1 or head_dim * heads != d else None,
        d_ff=hf.get("intermediate_size", int),
        attn_scale=None if scalar == head_dim else scalar**-0.5,
        sliding_window=window,
        local_layers=local_layers,
        positions="rotary",
        rope_base=rope_base,
        rope_scaling=rope_scaling,
        rope_local_base=None if same_tables or not local_layers else local_base,
        norm="rmsnorm",
        norm_placement="pre",
        norm_eps=hf.get("rms_norm_eps", float, 1e-6),
        post_norms=True,
        activation="geglu",
        dropout=hf.get("attention_dropout", float, 0.0),
        bias=bias,
        qk_norm=True,
        mlp_bias=False if bias else None,
        tie_embeddings=hf.get("tie_word_embeddings", bool, True),
        logit_softcap=softcap,
        scale_embeddings=True,
        init_std=hf.get("initializer_range", float, 0.02),
    )
    return config, []


def tensor_maps(config: ModelConfig, hf_class: str) -> list[TensorMap]:
    q, kv, hidden = config.q_width, config.kv_heads * config.head_dim, config.hidden_dim

    def norm(ours: str, theirs: str) -> TensorMap:
        return TensorMap(f"{ours}.weight", (f"{theirs}.weight",), offset=NORM_OFFSET)

    maps = [TensorMap("tok_emb.weight", ("model.embed_tokens.weight",))]
    for i in range(config.n_layers):
        ours, theirs = f"decoder.blocks.{i}", f"model.layers.{i}"
        maps += [
            norm(f"{ours}.attn_norm", f"{theirs}.input_layernorm"),
            norm(f"{ours}.attn_out_norm", f"{theirs}.post_attention_layernorm"),
            norm(f"{ours}.mlp_norm", f"{theirs}.pre_feedforward_layernorm"),
            norm(f"{ours}.mlp_out_norm", f"{theirs}.post_feedforward_layernorm"),
            norm(f"{ours}.attn.q_norm", f"{theirs}.self_attn.q_norm"),
            norm(f"{ours}.attn.k_norm", f"{theirs}.self_attn.k_norm"),
            TensorMap(f"{ours}.mlp.fc.weight", (f"{theirs}.mlp.gate_proj.weight", f"{theirs}.mlp.up_proj.weight"), (hidden, hidden)),
            TensorMap(f"{ours}.mlp.proj.weight", (f"{theirs}.mlp.down_proj.weight",)),
        ]
        for kind in ("weight", "bias") if config.bias else ("weight",):
            maps.append(TensorMap(f"{ours}.attn.qkv.{kind}", tuple(f"{theirs}.self_attn.{p}_proj.{kind}" for p in "qkv"), (q, kv, kv)))
            maps.append(TensorMap(f"{ours}.attn.out.{kind}", (f"{theirs}.self_attn.o_proj.{kind}",)))
    maps.append(norm("decoder.norm", "model.norm"))
    if not config.tie_embeddings:
        maps.append(TensorMap("lm_head.weight", ("lm_head.weight",)))
    return maps


def fresh_tensors(config: ModelConfig, hf_class: str) -> dict:
    return {}  # every tensor comes from the checkpoint


def labels(hf: HfConfig, hf_class: str) -> list[str] | None:
    return None


def _query_pre_attn_scalar(config: ModelConfig) -> float:
    """What transformers scales the scores by the inverse square root of: head_dim unless attn_scale says otherwise."""
    return config.head_dim if config.attn_scale is None else config.attn_scale**-2


def incompatible(config: ModelConfig, hf_class: str) -> str | None:
    scalar = _query_pre_attn_scalar(config)
    scaling = config.rope_scaling.kind if config.rope_scaling is not None else None
    checks = [
        (config.arch == "decoder", f"arch {config.arch!r} ({CLASS} is a decoder)"),
        (config.positions == "rotary", f"positions {config.positions!r} ({CLASS} uses rotary positions)"),
        (config.norm == "rmsnorm", f"norm {config.norm!r} ({CLASS} uses RMSNorm)"),
        (config.norm_placement == "pre" and config.post_norms, f"no post_norms ({CLASS} norms each sublayer's input and output)"),
        (config.activation == "geglu", f"activation {config.activation!r} ({CLASS} has a GeGLU MLP)"),
        (config.qk_norm, f"no qk_norm ({CLASS} normalises each head's q and k)"),
        (config.scale_embeddings, f"no scale_embeddings ({CLASS} scales its embeddings by sqrt(hidden_size))"),
        (config.n_classes == 0, f"a classification head ({CLASS} has none)"),
        (config.d_model % config.n_heads == 0, f"d_model {config.d_model} not divisible by n_heads ({CLASS}'s config requires it)"),
        (config.has_qkv_bias == config.bias, f"biases on q, k and v but not on the attention output ({CLASS}'s attention_bias covers all four)"),
        (not config.has_mlp_bias, f"biases in the MLP ({CLASS} has none)"),
        (scaling in (None, "linear", "llama3"), f"rope_scaling {scaling!r} ({CLASS} is written with none, linear or llama3)"),
        (abs(scalar - round(scalar)) < 1e-6 * scalar, f"attn_scale {config.attn_scale} ({CLASS}'s query_pre_attn_scalar, its inverse square, is whole)"),
        (config.rope_fraction == 1, f"rope_fraction {config.rope_fraction:g} ({CLASS} turns every feature of each head)"),
    ]
    return incompatibility(checks)


def hf_config(config: ModelConfig, hf_class: str, special_ids: dict[str, int]) -> dict[str, Any]:
    full = {"rope_type": "default", "rope_theta": config.rope_base, **(llama.rope_scaling_json(config) or {})}
    local = {"rope_type": "default", "rope_theta": config.rope_local_base} if config.rope_local_base is not None else dict(full)
    return {
        "architectures": [CLASS],
        "model_type": MODEL_TYPES[CLASS],
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.hidden_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "hidden_activation": ACTIVATION,
        "max_position_embeddings": config.block_size,
        "rms_norm_eps": config.norm_eps,
        "rope_parameters": {GLOBAL: full, LOCAL: local},
        "layer_types": [LOCAL if i in config.local_layers else GLOBAL for i in range(config.n_layers)],
        "sliding_window": config.sliding_window if config.sliding_window is not None else config.block_size,
        "query_pre_attn_scalar": round(_query_pre_attn_scalar(config)),
        "attention_bias": config.bias,
        "attention_dropout": config.dropout,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": config.logit_softcap,
        "use_bidirectional_attention": False,
        "initializer_range": config.init_std,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": special_ids.get("bos"),
        "eos_token_id": special_ids.get("eos"),
        "pad_token_id": special_ids.get("pad"),
        "torch_dtype": "float32",
    }
