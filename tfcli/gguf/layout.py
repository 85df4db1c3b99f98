"""How a tfcli model is laid out in GGUF: the architectures llama.cpp knows it as (llama, qwen2, gpt2), their
metadata keys, and which GGUF tensor holds which rows of which tfcli tensor. Names and conventions are
llama.cpp's (convert_hf_to_gguf.py, src/models/llama.cpp, src/models/gpt2.cpp).

llama.cpp rotates each consecutive pair (x0, x1) of a head for `llama` (its "normal" RoPE); tfcli, like
transformers, rotates the halves (x_i, x_{i + hs/2}). The converter therefore reorders the rows of q and k
inside each head (its `permute`), so that the pairs llama.cpp rotates are the ones tfcli rotates; export
does the same and import undoes it. `qwen2` rotates halves ("neox" RoPE): its rows stay as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from tfcli.errors import TfcliError
from tfcli.model.config import ModelConfig, RopeScaling
from tfcli.model.layers import scaled_frequencies

EXPORT_ARCHS = ("llama", "gpt2")
IMPORT_ARCHS = ("llama", "qwen2", "gpt2")
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency divisors: Llama 3.1's rope scaling
# The activations export writes as gpt2. llama.cpp's gpt2 graph has one GELU, ggml_gelu: the tanh approximation
# (GPT-2's gelu_new), and no text architecture of llama.cpp computes the exact-erf form (ggml_gelu_erf is used by
# its multimodal encoders only). An exact-GELU run ("gelu", the presets' default) goes out as gpt2 with a note,
# and a gpt2 file comes back in as gelu_tanh: what llama.cpp runs.
GPT2_ACTIVATIONS = ("gelu_tanh", "gelu")


@dataclasses.dataclass(frozen=True)
class GgufTensor:
    """One GGUF tensor: rows start:stop of tfcli's `ours` (all of it when stop is 0), with llama.cpp's
    row order inside each of `heads` heads when heads is set.

    Example: GgufTensor("blk.0.attn_k.weight", "decoder.blocks.0.attn.qkv.weight", 32, 48, heads=2)
    """

    name: str
    ours: str
    start: int = 0
    stop: int = 0
    heads: int = 0


def permute_heads(w: torch.Tensor, heads: int) -> torch.Tensor:
    """tfcli's (halves) row order to llama.cpp's (pairs), as convert_hf_to_gguf's LlamaModel.permute.
    Example (one head of 4 rows): [r0, r1, r2, r3] -> [r0, r2, r1, r3]."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)  # (heads, hs/2, 2, ...) flattened


def unpermute_heads(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of permute_heads: llama.cpp's pair order back to tfcli's halves."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)  # (heads, 2, hs/2, ...) flattened


def incompatibility(checks: list[tuple[bool, str]]) -> str | None:
    """The first check that fails, as its phrase, or None."""
    return next((message for ok, message in checks if not ok), None)


def export_incompatibility(config: ModelConfig, arch: str) -> str | None:
    """The first option `arch` cannot express, as a phrase, or None."""
    common = [
        (config.arch == "decoder", f"arch {config.arch!r} (llama.cpp's {arch} is a decoder)"),
        (config.norm_placement == "pre", f"norm_placement {config.norm_placement!r} ({arch} is pre-norm)"),
        (config.n_classes == 0, f"a classification head ({arch} has none)"),
    ]
    if arch == "gpt2":
        return incompatibility(
            common
            + [
                (config.positions == "learned", f"positions {config.positions!r} (gpt2 learns its positions)"),
                (config.norm == "layernorm", f"norm {config.norm!r} (gpt2 uses LayerNorm)"),
                (config.activation in GPT2_ACTIVATIONS, f"activation {config.activation!r} (llama.cpp's gpt2 has GELU, as its tanh approximation)"),
                (config.kv_heads == config.n_heads, f"n_kv_heads {config.kv_heads} (gpt2 has multi-head attention only)"),
                (config.bias and config.has_qkv_bias and config.has_mlp_bias, "bias false (gpt2's layers and norms have biases)"),
            ]
        )
    return incompatibility(
        common
        + [
            (config.positions == "rotary", f"positions {config.positions!r} (llama rotates q and k)"),
            (config.norm == "rmsnorm", f"norm {config.norm!r} (llama uses RMSNorm)"),
            (config.activation == "swiglu", f"activation {config.activation!r} (llama's MLP is SwiGLU)"),
        ]
    )


def export_notes(config: ModelConfig, arch: str) -> list[str]:
    """What the file computes otherwise than the run does, as sentences (none when it computes the same)."""
    if arch == "gpt2" and config.activation == "gelu":
        return [
            "llama.cpp's gpt2 computes GELU's tanh approximation, not this run's exact GELU: its logits differ from tfcli's "
            "by under 1e-3 of the largest (the greedy text of the quickstart's model is the same); for GPT-2's own GELU, "
            "train with --set activation=gelu_tanh"
        ]
    return []


def export_arch(config: ModelConfig) -> str:
    """llama for rotary runs, gpt2 for learned positions; an option neither can express is named."""
    arch = "llama" if config.positions == "rotary" else "gpt2"
    problem = export_incompatibility(config, arch)
    if problem is not None:
        raise TfcliError(f"GGUF's {arch} architecture cannot express this model: {problem}", hint="llama.cpp runs Llama-style and GPT-2-style decoders")
    return arch


def tensor_layout(config: ModelConfig, arch: str) -> list[GgufTensor]:
    """Every GGUF tensor of `arch` for this config, and where its rows are in tfcli's state."""
    d, kv, hidden = config.d_model, config.kv_heads * config.head_dim, config.hidden_dim
    tensors = [GgufTensor("token_embd.weight", "tok_emb.weight")]
    if arch == "gpt2":
        tensors.append(GgufTensor("position_embd.weight", "pos_emb.weight"))
    for i in range(config.n_layers):
        blk, ours = f"blk.{i}", f"decoder.blocks.{i}"
        kinds = ("weight", "bias") if arch == "gpt2" else ("weight",)
        tensors += [GgufTensor(f"{blk}.attn_norm.{k}", f"{ours}.attn_norm.{k}") for k in kinds]
        tensors += [GgufTensor(f"{blk}.ffn_norm.{k}", f"{ours}.mlp_norm.{k}") for k in kinds]
        if arch == "gpt2":
            for theirs, mine in (("attn_qkv", "attn.qkv"), ("attn_output", "attn.out"), ("ffn_up", "mlp.fc"), ("ffn_down", "mlp.proj")):
                tensors += [GgufTensor(f"{blk}.{theirs}.{k}", f"{ours}.{mine}.{k}") for k in kinds]
            continue
        heads = {"q": config.n_heads, "k": config.kv_heads, "v": 0} if arch == "llama" else {"q": 0, "k": 0, "v": 0}
        spans = {"q": (0, d), "k": (d, d + kv), "v": (d + kv, d + 2 * kv)}
        for kind in ("weight", "bias") if config.has_qkv_bias else ("weight",):
            tensors += [GgufTensor(f"{blk}.attn_{p}.{kind}", f"{ours}.attn.qkv.{kind}", *spans[p], heads=heads[p]) for p in "qkv"]
        tensors.append(GgufTensor(f"{blk}.attn_output.weight", f"{ours}.attn.out.weight"))
        if config.bias:
            tensors.append(GgufTensor(f"{blk}.attn_output.bias", f"{ours}.attn.out.bias"))
        for kind in ("weight", "bias") if config.has_mlp_bias else ("weight",):
            tensors += [
                GgufTensor(f"{blk}.ffn_gate.{kind}", f"{ours}.mlp.fc.{kind}", 0, hidden),
                GgufTensor(f"{blk}.ffn_up.{kind}", f"{ours}.mlp.fc.{kind}", hidden, 2 * hidden),
                GgufTensor(f"{blk}.ffn_down.{kind}", f"{ours}.mlp.proj.{kind}"),
            ]
    tensors += [GgufTensor(f"output_norm.{k}", f"decoder.norm.{k}") for k in (("weight", "bias") if arch == "gpt2" else ("weight",))]
    if not config.tie_embeddings:
        tensors.append(GgufTensor("output.weight", "lm_head.weight"))
    return tensors


def hyperparameters(config: ModelConfig, arch: str) -> dict[str, Any]:
    """The `{arch}.*` keys llama.cpp reads for this config (values typed as the writer writes them)."""
    keys: dict[str, Any] = {
        "context_length": config.block_size,
        "embedding_length": config.d_model,
        "feed_forward_length": config.hidden_dim,
        "block_count": config.n_layers,
        "attention.head_count": config.n_heads,
    }
    if arch == "gpt2":
        keys["attention.layer_norm_epsilon"] = config.norm_eps
        return keys
    keys.update(
        {
            "attention.head_count_kv": config.kv_heads,
            "attention.layer_norm_rms_epsilon": config.norm_eps,
            "rope.freq_base": config.rope_base,
            "rope.dimension_count": config.head_dim,
            "vocab_size": config.vocab_size,
        }
    )
    scaling = config.rope_scaling
    if scaling is not None and scaling.kind == "linear":
        keys.update({"rope.scaling.type": "linear", "rope.scaling.factor": scaling.factor})
    elif scaling is not None:  # llama3: the divisors go in rope_freqs.weight; the context they were made for here
        keys["rope.scaling.original_context_length"] = scaling.original_context
    return keys


def llama3_rope_factors(config: ModelConfig) -> torch.Tensor:
    """rope_freqs.weight: what each rotary frequency is divided by under Llama 3.1's scaling (llama.cpp's
    freq_factors), from tfcli's own scaled frequencies."""
    assert config.rope_scaling is not None
    inverse = 1.0 / (config.rope_base ** (torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim))  # (hs/2,)
    return (inverse / scaled_frequencies(inverse, config.rope_scaling)).to(torch.float32)


# The `{arch}.*` keys import understands; any other key of the architecture is refused by name.
ARCH_KEYS = {
    "gpt2": {"context_length", "embedding_length", "feed_forward_length", "block_count", "attention.head_count", "attention.layer_norm_epsilon"},
    "llama": {
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "block_count",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.layer_norm_rms_epsilon",
        "attention.key_length",
        "attention.value_length",
        "rope.freq_base",
        "rope.dimension_count",
        "rope.scaling.type",
        "rope.scaling.factor",
        "rope.scaling.original_context_length",
        "vocab_size",
    },
}
ARCH_KEYS["qwen2"] = ARCH_KEYS["llama"]


class Hparams:
    """The `{arch}.*` metadata of a file, read with the key's name in every complaint."""

    def __init__(self, metadata: dict[str, Any], arch: str, where: str) -> None:
        self.metadata, self.arch, self.where = metadata, arch, where
        prefix = f"{arch}."
        for key in metadata:
            if key.startswith(prefix) and key[len(prefix) :] not in ARCH_KEYS[arch]:
                raise TfcliError(
                    f"{where}: metadata {key} is not something tfcli's {arch} model can express", hint="tfcli imports plain llama, qwen2 and gpt2 models"
                )

    def get(self, name: str, kind: type, default: Any = ...) -> Any:
        key = f"{self.arch}.{name}"
        if key not in self.metadata:
            if default is ...:
                raise TfcliError(f"{self.where} has no metadata {key}", hint="the file is incomplete or not a model llama.cpp can load")
            return default
        value = self.metadata[key]
        ok = isinstance(value, str) if kind is str else isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is int and ok:
            ok = float(value).is_integer()
        if not ok:
            raise TfcliError(f"{self.where}: metadata {key} is {value!r}, not {'text' if kind is str else 'a number'}")
        return kind(value)


def model_config(metadata: dict[str, Any], arch: str, vocab_size: int, where: str) -> ModelConfig:
    """tfcli's config for a file of `arch` (its vocabulary size from the token list)."""
    hp = Hparams(metadata, arch, where)
    d, heads = hp.get("embedding_length", int), hp.get("attention.head_count", int)
    shape = dict(
        arch="decoder",
        vocab_size=vocab_size,
        block_size=hp.get("context_length", int),
        n_layers=hp.get("block_count", int),
        n_heads=heads,
        d_model=d,
        d_ff=hp.get("feed_forward_length", int),
        dropout=0.0,
    )
    if arch == "gpt2":
        return _build(
            where, **shape, positions="learned", norm="layernorm", activation="gelu_tanh", bias=True, norm_eps=hp.get("attention.layer_norm_epsilon", float)
        )
    head_dim = d // heads if heads and d % heads == 0 else 0
    for key in ("attention.key_length", "attention.value_length", "rope.dimension_count"):
        if hp.get(key, int, head_dim) != head_dim:
            raise TfcliError(
                f"{where}: metadata {arch}.{key} is {hp.get(key, int)}; tfcli's heads are embedding_length / head_count = {head_dim} wide, all rotated"
            )
    scaling = None
    kind = hp.get("rope.scaling.type", str, "none")
    if kind == "linear":
        scaling = RopeScaling("linear", hp.get("rope.scaling.factor", float))
    elif kind != "none":
        raise TfcliError(f"{where}: metadata {arch}.rope.scaling.type is {kind!r}; tfcli implements none and linear (and Llama 3.1's rope_freqs)")
    qwen2 = arch == "qwen2"
    return _build(
        where,
        **shape,
        n_kv_heads=hp.get("attention.head_count_kv", int, heads),
        positions="rotary",
        rope_base=hp.get("rope.freq_base", float, 10000.0),
        rope_scaling=scaling,
        norm="rmsnorm",
        norm_eps=hp.get("attention.layer_norm_rms_epsilon", float),
        activation="swiglu",
        bias=False,
        qkv_bias=True if qwen2 else None,
        tie_embeddings=False,
    )


def _build(where: str, **settings: Any) -> ModelConfig:
    try:
        return ModelConfig(**settings)
    except TfcliError as error:
        raise TfcliError(f"{where} describes a model tfcli cannot build: {error.message}") from None
