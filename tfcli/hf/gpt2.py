"""GPT-2 (GPT2LMHeadModel): a pre-norm LayerNorm decoder with learned positions and biases everywhere.

GPT-2 stores its linear layers as Conv1D, weights (in, out): the transpose of ours. Its square
`attn.c_proj` loads silently either way, so only logit parity proves the mapping right (the tests check it).
"""

from __future__ import annotations

from typing import Any

from tfcli.errors import TfcliError
from tfcli.hf.folder import HfConfig
from tfcli.hf.mapping import TensorMap, incompatibility
from tfcli.model.config import ModelConfig

CLASSES = ("GPT2LMHeadModel",)
ACTIVATIONS_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
ACTIVATIONS_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu": "gelu", "relu": "relu"}

# (our sublayer, GPT-2's sublayer, stored as Conv1D: weight transposed); each has a weight and a bias.
_BLOCK_SUBLAYERS = [
    ("attn_norm", "ln_1", False),
    ("attn.qkv", "attn.c_attn", True),
    ("attn.out", "attn.c_proj", True),
    ("mlp_norm", "ln_2", False),
    ("mlp.fc", "mlp.c_fc", True),
    ("mlp.proj", "mlp.c_proj", True),
]


def model_config(hf: HfConfig, hf_class: str) -> tuple[ModelConfig, list[str]]:
    activation = ACTIVATIONS_FROM_HF.get(hf.get("activation_function", str, "gelu_new"))
    if activation is None:
        raise TfcliError(f"GPT-2 activation_function {hf.data.get('activation_function')!r} has no tfcli equivalent")
    if hf.get("scale_attn_by_inverse_layer_idx", bool, False) or not hf.get("scale_attn_weights", bool, True) or hf.get("add_cross_attention", bool, False):
        raise TfcliError("this GPT-2 config scales or extends attention in a way tfcli does not implement")
    d = hf.get("n_embd", int)
    config = ModelConfig(
        arch="decoder",
        vocab_size=hf.get("vocab_size", int),
        block_size=hf.get("n_positions", int),
        n_layers=hf.get("n_layer", int),
        n_heads=hf.get("n_head", int),
        d_model=d,
        d_ff=hf.get("n_inner", int, 4 * d),
        positions="learned",
        norm="layernorm",
        norm_placement="pre",
        norm_eps=hf.get("layer_norm_epsilon", float, 1e-5),
        activation=activation,
        dropout=hf.get("resid_pdrop", float, 0.0),
        bias=True,
        tie_embeddings=hf.get("tie_word_embeddings", bool, True),
        init_std=hf.get("initializer_range", float, 0.02),
    )
    return config, []


def tensor_maps(config: ModelConfig, hf_class: str) -> list[TensorMap]:
    maps = [TensorMap("tok_emb.weight", ("transformer.wte.weight",)), TensorMap("pos_emb.weight", ("transformer.wpe.weight",))]
    for i in range(config.n_layers):
        maps += [
            TensorMap(f"decoder.blocks.{i}.{ours}.{kind}", (f"transformer.h.{i}.{theirs}.{kind}",), transposed=conv1d and kind == "weight")
            for ours, theirs, conv1d in _BLOCK_SUBLAYERS
            for kind in ("weight", "bias")
        ]
    maps += [TensorMap("decoder.norm.weight", ("transformer.ln_f.weight",)), TensorMap("decoder.norm.bias", ("transformer.ln_f.bias",))]
    if not config.tie_embeddings:
        maps.append(TensorMap("lm_head.weight", ("lm_head.weight",)))
    return maps


def fresh_tensors(config: ModelConfig, hf_class: str) -> dict:
    return {}  # every tensor comes from the checkpoint


def labels(hf: HfConfig, hf_class: str) -> list[str] | None:
    return None


def incompatible(config: ModelConfig, hf_class: str) -> str | None:
    """The first option GPT-2 cannot express, as a sentence, or None."""
    return incompatibility(
        [
            (config.arch == "decoder", f"arch {config.arch!r} (GPT-2 is a decoder)"),
            (config.positions == "learned", f"positions {config.positions!r} (GPT-2 learns its positions)"),
            (config.norm == "layernorm", f"norm {config.norm!r} (GPT-2 uses LayerNorm)"),
            (config.norm_placement == "pre", f"norm_placement {config.norm_placement!r} (GPT-2 is pre-norm)"),
            (config.activation in ACTIVATIONS_TO_HF, f"activation {config.activation!r} (GPT-2 has gelu, gelu_tanh or relu)"),
            (config.kv_heads == config.n_heads, f"n_kv_heads {config.kv_heads} (GPT-2 has multi-head attention only: n_kv_heads = n_heads)"),
            (config.bias and config.has_qkv_bias and config.has_mlp_bias, "bias false (GPT-2's linear layers and norms have biases)"),
            (config.n_classes == 0, "a classification head (GPT2LMHeadModel has none)"),
        ]
    )


def hf_config(config: ModelConfig, hf_class: str, special_ids: dict[str, int]) -> dict[str, Any]:
    eos_id = special_ids.get("eos")
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.d_model,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        "n_inner": config.hidden_dim,
        "activation_function": ACTIVATIONS_TO_HF[config.activation],
        "layer_norm_epsilon": config.norm_eps,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "initializer_range": config.init_std,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
    }
