"""The model's shape and options: a JSON-serialisable, torch-free dataclass, validated on creation.

Everything is checked here, before a single tensor is allocated: a config asking for absurd sizes is a
clear error, not an out-of-memory crash.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from tfcli.errors import TfcliError, a_or_an
from tfcli.schema import JsonRecord

Arch = Literal["decoder", "encoder", "encoder-decoder"]
ARCHS: tuple[str, ...] = ("decoder", "encoder", "encoder-decoder")
POSITIONS: tuple[str, ...] = ("learned", "sinusoidal", "rotary")
NORMS: tuple[str, ...] = ("layernorm", "rmsnorm")
NORM_PLACEMENTS: tuple[str, ...] = ("pre", "post")
ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_tanh", "relu", "relu2", "swiglu", "geglu")
GATED: tuple[str, ...] = ("swiglu", "geglu")  # a gate through the activation times an up path: SiLU (Llama), tanh GELU (Gemma)

ROPE_SCALINGS: tuple[str, ...] = ("linear", "llama3", "longrope")

MAX_PARAMETERS = 200_000_000_000
LIMITS = {"vocab_size": 1 << 22, "block_size": 1 << 20, "d_model": 1 << 16, "d_ff": 1 << 18, "n_layers": 1024, "n_heads": 1024, "d_head": 1 << 12}


@dataclasses.dataclass(frozen=True)
class RopeScaling(JsonRecord):
    """How rotary frequencies are stretched to reach past the context a model was first trained on
    (transformers' `rope_scaling`). linear: every frequency / factor. llama3: frequencies whose wavelength
    is longer than original_context / low_freq_factor / factor, shorter than original_context /
    high_freq_factor kept, a smooth blend between. longrope (Phi-3's 128k models): each frequency divided
    by its own short_factor and cos, sin scaled by attention_factor; transformers switches to its long
    factors past original_context, so tfcli's context stops there."""

    kind: str  # linear | llama3 | longrope
    factor: float
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_context: int = 8192  # llama3 and longrope: original_max_position_embeddings
    short_factor: tuple[float, ...] = ()  # longrope only: what each rotary frequency is divided by, (head_dim / 2,)
    attention_factor: float = 1.0  # longrope only: cos and sin are scaled by it (the scores by its square)


@dataclasses.dataclass
class ModelConfig(JsonRecord):
    arch: Arch = "decoder"  # decoder: causal LM; encoder: bidirectional, masked LM; encoder-decoder: both + cross-attention
    vocab_size: int = 8192  # tokens in the vocabulary (the tokenizer's size)
    block_size: int = 256  # the longest sequence, in tokens (the context length)
    n_layers: int = 4  # blocks in the stack (each stack, for encoder-decoder)
    n_decoder_layers: int | None = None  # encoder-decoder: blocks in the decoder (default: n_layers)
    n_heads: int = 4  # query heads per attention layer
    n_kv_heads: int | None = None  # key/value heads: = n_heads multi-head, divides it grouped-query, 1 multi-query
    d_model: int = 256  # width of the residual stream
    d_head: int | None = None  # width of each attention head (default: d_model / n_heads; Qwen3 sets it apart)
    d_ff: int | None = None  # hidden width of the MLP (default: 4 * d_model)
    attn_scale: float | None = None  # scores are q . k times this (default: 1 / sqrt(head_dim); Gemma 3: query_pre_attn_scalar ** -0.5)
    sliding_window: int | None = None  # decoder: the local layers attend to this many positions, their own and the ones before
    local_layers: tuple[int, ...] = ()  # the layers that attend within sliding_window (Gemma 3: five of every six); the rest see the whole context
    positions: str = "learned"  # learned | sinusoidal | rotary
    rope_base: float = 10000.0  # rotary: the base of the frequencies
    rope_scaling: RopeScaling | None = None  # rotary: frequencies stretched for a longer context (Llama 3.x, Phi-3's 128k)
    rope_local_base: float | None = None  # rotary: the local layers' own base, unscaled (Gemma 3's rope_local_base_freq; default: as the others)
    rope_fraction: float = 1.0  # rotary: the share of each head's features that rotary turns, the first ones (Phi-4-mini: 0.75); the rest pass as they are
    norm: str = "layernorm"  # layernorm | rmsnorm
    norm_placement: str = "pre"  # pre: x + f(norm(x)); post: norm(x + f(x)) (the original transformer)
    norm_eps: float = 1e-5
    post_norms: bool = False  # pre-norm: each sublayer's output normed too, before the residual add (Gemma's "sandwich")
    activation: str = "gelu"  # gelu | gelu_tanh (GPT-2's) | relu | relu2 (relu(x)^2: the speedrun's) | swiglu | geglu (gated as swiglu, with gelu_tanh: Gemma)
    dropout: float = 0.0  # on embeddings, attention weights, and each sublayer's output
    bias: bool = True  # biases in linear layers and layer norms
    qk_norm: bool = False  # a norm over each head's queries and keys (head_dim wide), before rotary (Qwen3)
    qkv_bias: bool | None = None  # biases on the query/key/value projections (None: as `bias`; Qwen2 has only these)
    mlp_bias: bool | None = None  # biases in the MLP (None: as `bias`; Llama sets attention and MLP biases apart)
    tie_embeddings: bool = True  # the output projection shares the token embedding matrix
    logit_softcap: float | None = None  # the logits become cap * tanh(logits / cap), each within (-cap, cap) (Gemma 2; the speedrun: 30)
    scale_embeddings: bool = False  # token embeddings times sqrt(d_model), as the original transformer and Gemma scale them
    n_classes: int = 0  # encoder / decoder: size of the classification head (0: none)
    type_vocab_size: int = 0  # BERT's token-type (segment) embeddings; tfcli reads one segment, so type 0 is added to every token
    embedding_norm: bool = False  # a norm over the summed embeddings, before the first block (BERT)
    pooler: bool = False  # encoder: BERT's pooler, tanh(dense(the [CLS] state)), is what the classifier reads
    init_std: float = 0.02  # std of the normal initialisation; residual projections get init_std / sqrt(2 * layers)
    zero_init_proj: bool = False  # attention's output and the MLP's down projection start at zero (the speedrun), not at the scaled init

    def __post_init__(self) -> None:
        self.local_layers = tuple(self.local_layers)  # as JSON reads it, from a list given in Python too
        for name in ("vocab_size", "block_size", "n_layers", "n_heads", "d_model"):
            value = getattr(self, name)
            if value < 1:
                raise TfcliError(f"model {name} must be at least 1, not {value}")
        for name, limit in LIMITS.items():
            value = getattr(self, name)
            if value is not None and value > limit:
                raise TfcliError(f"model {name} = {value:,} is absurd (the limit is {limit:,})")
        for name, allowed in (("arch", ARCHS), ("positions", POSITIONS), ("norm", NORMS), ("norm_placement", NORM_PLACEMENTS), ("activation", ACTIVATIONS)):
            if getattr(self, name) not in allowed:
                raise TfcliError(f"model {name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")
        shortest = 2 if self.arch == "decoder" else 3  # a token and its target; encoders also hold [cls] or [eos]
        if self.block_size < shortest:
            raise TfcliError(f"model block_size must be at least {shortest} for {a_or_an(self.arch)}, not {self.block_size}")
        if self.d_head is None and self.d_model % self.n_heads:
            raise TfcliError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})", hint="or set d_head, each head's width")
        if self.d_head is not None and self.d_head < 1:
            raise TfcliError(f"model d_head must be at least 1, not {self.d_head}")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise TfcliError(
                f"n_kv_heads ({self.kv_heads}) must divide n_heads ({self.n_heads})",
                hint="use n_heads (multi-head), a divisor (grouped-query) or 1 (multi-query)",
            )
        if not 0 < self.rope_fraction <= 1 or (self.rope_fraction != 1 and self.positions != "rotary"):
            raise TfcliError(f"model rope_fraction must be in (0, 1], and below 1 only with positions=rotary, not {self.rope_fraction}")
        if self.positions == "rotary" and (self.rotary_dim % 2 or self.rotary_dim < 2):
            what = "head size" if self.rope_fraction == 1 else f"rotary width (head size {self.head_dim} times rope_fraction {self.rope_fraction:g})"
            raise TfcliError(f"rotary positions need an even {what}, not {self.rotary_dim}")
        if self.positions == "sinusoidal" and self.d_model % 2:
            raise TfcliError(f"sinusoidal positions need an even d_model, not {self.d_model}")
        if self.n_decoder_layers is not None and self.arch != "encoder-decoder":
            raise TfcliError(
                f"model n_decoder_layers is for an encoder-decoder; {a_or_an(self.arch)}'s depth is n_layers",
                hint=f"set n_layers={self.n_decoder_layers} instead",
            )
        if self.n_decoder_layers is not None and not 1 <= self.n_decoder_layers <= LIMITS["n_layers"]:
            raise TfcliError(f"model n_decoder_layers must be between 1 and {LIMITS['n_layers']}, not {self.n_decoder_layers}")
        if self.d_ff is not None and self.d_ff < 1:
            raise TfcliError(f"model d_ff must be at least 1, not {self.d_ff}")
        if not 0.0 <= self.dropout < 1.0:
            raise TfcliError(f"model dropout must be in [0, 1), not {self.dropout}")
        if self.n_classes < 0 or self.n_classes > 1 << 20:
            raise TfcliError(f"model n_classes must be between 0 and {1 << 20:,}, not {self.n_classes}")
        if self.n_classes and self.arch == "encoder-decoder":
            raise TfcliError("a classification head needs an encoder or a decoder, not an encoder-decoder")
        if self.rope_scaling is not None:
            scaling = self.rope_scaling
            if self.positions != "rotary":
                raise TfcliError("model rope_scaling is for rotary positions", hint="remove it, or set positions=rotary")
            if scaling.kind not in ROPE_SCALINGS:
                raise TfcliError(f"model rope_scaling.kind must be one of {', '.join(ROPE_SCALINGS)}, not {scaling.kind!r}")
            if not scaling.factor >= 1 or not 0 < scaling.low_freq_factor < scaling.high_freq_factor or scaling.original_context < 1:
                raise TfcliError("model rope_scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and original_context >= 1")
            if scaling.kind == "longrope":
                if len(scaling.short_factor) != self.rotary_dim // 2 or not all(f > 0 for f in scaling.short_factor) or not scaling.attention_factor > 0:
                    raise TfcliError(f"model rope_scaling longrope needs {self.rotary_dim // 2} positive short_factor values and attention_factor > 0")
                if self.block_size > scaling.original_context:
                    raise TfcliError(
                        f"model rope_scaling longrope holds up to original_context ({scaling.original_context}), not block_size {self.block_size}",
                        hint="past it longrope switches to its long factors, which tfcli does not implement",
                    )
            elif scaling.short_factor or scaling.attention_factor != 1.0:
                raise TfcliError("model rope_scaling short_factor and attention_factor are longrope's")
        self._check_gemma_options()
        if not 0 <= self.type_vocab_size <= 1 << 16:
            raise TfcliError(f"model type_vocab_size must be between 0 and {1 << 16:,}, not {self.type_vocab_size}")
        if self.pooler and self.arch != "encoder":
            raise TfcliError("model pooler is BERT's, for an encoder's [CLS] state", hint="remove it, or set arch=encoder")
        if self.logit_softcap is not None and not 0 < self.logit_softcap < math.inf:
            raise TfcliError(f"model logit_softcap must be a positive number, not {self.logit_softcap}", hint="the speedrun caps at 30; remove it for no cap")
        if self.norm_eps <= 0 or self.init_std <= 0 or self.rope_base <= 1:
            raise TfcliError("model norm_eps and init_std must be positive and rope_base above 1")
        if self.parameter_estimate() > MAX_PARAMETERS:
            raise TfcliError(f"this config asks for {self.parameter_estimate():,} parameters (the limit is {MAX_PARAMETERS:,})")

    def _check_gemma_options(self) -> None:
        """attn_scale, the local layers' window and rotary base, post_norms (Gemma 3's options)."""
        if self.attn_scale is not None and not self.attn_scale > 0:
            raise TfcliError(f"model attn_scale must be positive, not {self.attn_scale}")
        if (self.sliding_window is None) != (not self.local_layers):
            raise TfcliError("model sliding_window and local_layers go together", hint="set both (the window, and the layers that use it) or neither")
        if self.sliding_window is not None:
            if self.arch != "decoder":
                raise TfcliError(f"model sliding_window is for a decoder, not {a_or_an(self.arch)}")
            if self.sliding_window < 1:
                raise TfcliError(f"model sliding_window must be at least 1, not {self.sliding_window}")
            if list(self.local_layers) != sorted(set(self.local_layers)) or not 0 <= self.local_layers[0] <= self.local_layers[-1] < self.n_layers:
                raise TfcliError(f"model local_layers must be distinct layer numbers from 0 to {self.n_layers - 1}, in order, not {list(self.local_layers)}")
        if self.rope_local_base is not None and (self.positions != "rotary" or not self.local_layers or not self.rope_local_base > 1):
            raise TfcliError("model rope_local_base is the local layers' rotary base: it needs positions=rotary, local_layers and a base above 1")
        if self.post_norms and (self.norm_placement != "pre" or self.arch == "encoder-decoder"):
            raise TfcliError("model post_norms adds a norm on each sublayer's output in pre-norm blocks without cross-attention")

    @property
    def head_dim(self) -> int:
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    @property
    def rotary_dim(self) -> int:
        """How many of each head's features rotary turns: head_dim, or its first rope_fraction (as transformers rounds it down)."""
        return int(self.head_dim * self.rope_fraction)

    @property
    def q_width(self) -> int:
        """The queries' width, n_heads * head_dim: d_model unless d_head sets the heads apart."""
        return self.n_heads * self.head_dim

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def hidden_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def gated_mlp(self) -> bool:
        """The MLP's fc holds a gate and an up path (SwiGLU, GeGLU), each d_ff wide."""
        return self.activation in GATED

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_mlp_bias(self) -> bool:
        return self.bias if self.mlp_bias is None else self.mlp_bias

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def has_encoder(self) -> bool:
        return self.arch in ("encoder", "encoder-decoder")

    @property
    def has_decoder(self) -> bool:
        return self.arch in ("decoder", "encoder-decoder")

    def parameter_estimate(self) -> int:
        """The parameter count, computed from the shape alone (no tensors)."""
        return sum(self.parameter_counts().values())

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by part: embeddings, attention, mlp, norms, heads."""
        d, b, qb, mb = self.d_model, int(self.bias), int(self.has_qkv_bias), int(self.has_mlp_bias)
        q, kv = self.q_width, self.kv_heads * self.head_dim
        qk_norms = 2 * self.head_dim * (2 if self.norm == "layernorm" and self.bias else 1) if self.qk_norm else 0
        attn = d * (q + 2 * kv) + qb * (q + 2 * kv) + q * d + b * d + qk_norms
        cross = d * q + qb * q + d * 2 * kv + qb * 2 * kv + q * d + b * d + qk_norms
        up = 2 * self.hidden_dim if self.gated_mlp else self.hidden_dim
        mlp = d * up + mb * up + self.hidden_dim * d + mb * d
        norm = d * (2 if self.norm == "layernorm" and self.bias else 1)
        enc = self.n_layers if self.has_encoder else 0
        dec = self.decoder_layers if self.has_decoder else 0
        counts = {
            "embeddings": self.vocab_size * d + (self.block_size * d if self.positions == "learned" else 0) + self.type_vocab_size * d,
            "attention": (enc + dec) * attn + (dec * cross if self.arch == "encoder-decoder" else 0),
            "mlp": (enc + dec) * mlp,
            "norms": (enc * 2 + dec * (3 if self.arch == "encoder-decoder" else 2)) * norm
            + norm * ((1 if self.has_encoder else 0) + (1 if self.has_decoder else 0)) * (self.norm_placement == "pre")
            + norm * self.embedding_norm
            + (enc + dec) * 2 * norm * self.post_norms,
            "heads": 0,
        }
        if self.arch == "encoder":
            counts["heads"] += d * d + b * d + norm + (0 if self.tie_embeddings else self.vocab_size * d) + self.vocab_size
        else:
            counts["heads"] += 0 if self.tie_embeddings else self.vocab_size * d
        if self.n_classes:
            counts["heads"] += d * self.n_classes + self.n_classes
        if self.pooler:
            counts["heads"] += d * d + d
        return counts

    def kv_cache_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """Bytes the decoder's self-attention KV cache grows by per token (keys and values, every layer)."""
        if not self.has_decoder:
            return 0
        return 2 * self.decoder_layers * self.kv_heads * self.head_dim * bytes_per_value

    def with_overrides(self, **overrides: Any) -> ModelConfig:
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TfcliError(f"unknown model setting {unknown[0]!r}", hint=f"settings: {', '.join(f.name for f in dataclasses.fields(self))}")
        return ModelConfig.from_json({**self.to_json(), **overrides})


PRESETS: dict[str, dict[str, Any]] = {
    # A few hundred thousand parameters: tests and the quickstart.
    "tiny": dict(arch="decoder", block_size=128, n_layers=2, n_heads=4, d_model=64, d_ff=256),
    # ~10M parameters: a real model for a laptop.
    "small": dict(arch="decoder", block_size=256, n_layers=6, n_heads=6, d_model=384),
    # GPT-2 small, 124,439,808 parameters with its 50,257-token vocabulary.
    "gpt2-small": dict(
        arch="decoder",
        vocab_size=50257,
        block_size=1024,
        n_layers=12,
        n_heads=12,
        d_model=768,
        activation="gelu_tanh",
        positions="learned",
        norm="layernorm",
        norm_placement="pre",
        bias=True,
        tie_embeddings=True,
    ),
    # BERT-base: bidirectional encoder, post-norm, 110M parameters with its 30,522-token vocabulary.
    "bert-base": dict(
        arch="encoder",
        vocab_size=30522,
        block_size=512,
        n_layers=12,
        n_heads=12,
        d_model=768,
        activation="gelu",
        positions="learned",
        norm="layernorm",
        norm_placement="post",
        norm_eps=1e-12,
    ),
    # A small encoder-decoder for sequence-to-sequence work.
    "seq2seq-tiny": dict(arch="encoder-decoder", block_size=128, n_layers=2, n_heads=4, d_model=64, d_ff=256, positions="sinusoidal"),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named preset, with settings overridden key by key."""
    if name not in PRESETS:
        raise TfcliError(f"unknown preset {name!r}", hint=f"use one of {', '.join(PRESETS)}")
    return ModelConfig().with_overrides(**{**PRESETS[name], **overrides})
