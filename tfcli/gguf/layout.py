"""How a tfcli model is laid out in GGUF: the architectures llama.cpp knows it as (llama, qwen2, qwen3, phi3,
gemma3, gpt2), their metadata keys, and which GGUF tensor holds which rows of which tfcli tensor. Names and conventions
are llama.cpp's (convert_hf_to_gguf.py and conversion/*.py, src/models/*.cpp, src/llama-model.cpp).

llama.cpp rotates each consecutive pair (x0, x1) of a head for `llama` (its "normal" RoPE); tfcli, like
transformers, rotates the halves (x_i, x_{i + hs/2}). The converter therefore reorders the rows of q and k
inside each head (its `permute`), so that the pairs llama.cpp rotates are the ones tfcli rotates; export
does the same and import undoes it. `qwen2`, `qwen3` and `phi3` rotate halves ("neox" RoPE): their rows stay
as they are.

llama.cpp's `gemma3` fixes some of Gemma 3's settings where the file does not give them (src/models/gemma3.cpp):
every sixth layer is global and the others local (`GEMMA3_PATTERN`; attention.sliding_window_pattern says
otherwise) when the file has a sliding window, the local layers turn q and k by an unscaled base of 10,000
(rope.freq_base_swa, which llama.cpp's converter now writes, says otherwise; export writes either key where the run
differs), the scores are scaled by 1 / sqrt(head_dim) (the 27B's
62 layers: by 1 / sqrt(embedding_length / head_count)), and the logits are soft-capped only where the file gives
final_logit_softcapping (the llama.cpp this was checked against, 0.3.36's, reads it with a window too). Its RMSNorms scale by their weight, as tfcli's (the converter adds Gemma's 1, as tfcli's import from
Hugging Face does), and it multiplies the embeddings by sqrt(embedding_length) itself.

Export writes a run only as an architecture that computes what the run computes: `export_incompatibility`
names the first option the architecture cannot express, checked first by hand (with the reason), then by
reading the config back from the metadata and tensor names export would write (`config_from_gguf`, import's
own reader): any field that would not come back, an option added to the model later included, is named.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import torch

from tfcli.errors import TfcliError
from tfcli.model.config import ModelConfig, RopeScaling
from tfcli.model.layers import scaled_frequencies

EXPORT_ARCHS = ("llama", "qwen3", "phi3", "gemma3", "gpt2")
IMPORT_ARCHS = ("llama", "qwen2", "qwen3", "phi3", "gemma3", "gpt2")
GEMMA3_PATTERN = 6  # llama.cpp's gemma3: layer i is local when i % 6 < 5 (hparams.set_swa_pattern(6)), global else
GEMMA3_LOCAL_BASE = 10_000.0  # llama.cpp's gemma3: the local layers' rotary base (rope_freq_base_train_swa), unscaled
GEMMA3_27B_LAYERS = 62  # llama.cpp's gemma3 scales the scores of a 62-layer model (27B) by 1 / sqrt(embedding_length / head_count)
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency divisors: Llama 3.1's rope scaling
ROPE_SHORT, ROPE_LONG = "rope_factors_short.weight", "rope_factors_long.weight"  # Phi-3's longrope divisors, up to and past its original context
PERMUTED = ("llama",)  # q and k rows in llama.cpp's pair order; the others rotate halves as tfcli does
# Fields that change how a model trains, not what it computes: no GGUF architecture has a place for them, and
# import sets their defaults (no dropout: inference). Every other field the file would not give back is refused.
TRAINING_ONLY = ("dropout", "init_std", "zero_init_proj")
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
    """The first option `arch` cannot express, as a phrase, or None: the known ones with their reason, then
    any field the file would not give back (read back by import's own reader), by name."""
    problem = incompatibility(_checks(config, arch))
    return problem if problem is not None else _not_read_back(config, arch)


def _checks(config: ModelConfig, arch: str) -> list[tuple[bool, str]]:
    """The options `arch` cannot express, each phrase starting with the field's name."""
    scaling = config.rope_scaling.kind if config.rope_scaling is not None else None
    common = [
        (config.arch == "decoder", f"arch {config.arch!r} (llama.cpp's {arch} is a decoder)"),
        (config.norm_placement == "pre", f"norm_placement {config.norm_placement!r} ({arch} is pre-norm)"),
        (config.n_classes == 0, f"n_classes {config.n_classes} (a classification head; {arch} has none)"),
    ]
    if arch == "gpt2":
        return common + [
            (config.positions == "learned", f"positions {config.positions!r} (gpt2 learns its positions)"),
            (config.norm == "layernorm", f"norm {config.norm!r} (gpt2 uses LayerNorm)"),
            (config.activation in GPT2_ACTIVATIONS, f"activation {config.activation!r} (llama.cpp's gpt2 has GELU, as its tanh approximation)"),
            (config.kv_heads == config.n_heads, f"n_kv_heads {config.kv_heads} (gpt2 has multi-head attention only)"),
            (config.bias, "bias false (gpt2's layers and norms have biases)"),
            (config.has_qkv_bias, "qkv_bias false (gpt2's q, k and v have biases)"),
            (config.has_mlp_bias, "mlp_bias false (gpt2's MLP has biases)"),
        ]
    if arch == "gemma3":
        return common + _gemma3_checks(config)
    rotary = common + [
        (config.positions == "rotary", f"positions {config.positions!r} ({arch} rotates q and k)"),
        (config.norm == "rmsnorm", f"norm {config.norm!r} ({arch} uses RMSNorm)"),
        (config.activation == "swiglu", f"activation {config.activation!r} ({arch}'s MLP is SwiGLU)"),
    ]
    if arch != "phi3":
        rotary.append((config.rope_fraction == 1, f"rope_fraction {config.rope_fraction:g} with {arch}'s options (tfcli writes partial rotary as phi3 only)"))
    if arch == "qwen3":
        return rotary + [
            (not config.bias, "bias true (llama.cpp's qwen3 has no bias on the attention output)"),
            (not config.has_mlp_bias, "mlp_bias true (llama.cpp's qwen3 has no biases in the MLP)"),
            (scaling in (None, "linear"), f"rope_scaling {scaling} with qk_norm (llama.cpp's qwen3 reads no rope_freqs or rope factors)"),
        ]
    if arch == "phi3":  # written for longrope or partial rotary, which only llama.cpp's phi3 of these reads
        why = "rope_scaling longrope" if scaling == "longrope" else f"rope_fraction {config.rope_fraction:g}"
        return rotary + [
            (
                config.q_width == config.d_model,
                f"d_head {config.head_dim} with {why} (llama.cpp's phi3 heads are embedding_length / head_count = {config.d_model / config.n_heads:g} wide)",
            ),
            (not config.bias, f"bias true with {why} (llama.cpp's phi3 has no biases)"),
            (not config.has_qkv_bias, f"qkv_bias true with {why} (llama.cpp's phi3 has no biases)"),
            (not config.has_mlp_bias, f"mlp_bias true with {why} (llama.cpp's phi3 has no biases)"),
            (not config.qk_norm, f"qk_norm true with {why} (llama.cpp's phi3 has no norm on q and k)"),
        ]
    return rotary + [
        (not config.qk_norm, "qk_norm true (llama.cpp's llama has no norm on q and k; tfcli writes such runs as qwen3)"),
        (scaling != "longrope", "rope_scaling longrope (tfcli writes such runs as phi3)"),
    ]


def gemma3_local_layers(n_layers: int) -> tuple[int, ...]:
    """The layers llama.cpp's gemma3 makes local: all but every sixth. Example: 7 -> (0, 1, 2, 3, 4, 6)."""
    return tuple(i for i in range(n_layers) if i % GEMMA3_PATTERN < GEMMA3_PATTERN - 1)


def gemma3_attn_scale(n_layers: int, d_model: int, n_heads: int, head_dim: int) -> float | None:
    """The attn_scale of llama.cpp's gemma3 (None: 1 / sqrt(head_dim), tfcli's default)."""
    if n_layers == GEMMA3_27B_LAYERS and d_model % n_heads == 0 and d_model // n_heads != head_dim:
        return (d_model // n_heads) ** -0.5
    return None


def local_rope_base(config: ModelConfig) -> float | None:
    """The unscaled rotary base of the run's local layers: rope_local_base, or the global rope_base where the local
    layers share the global tables unscaled; None where they share scaled tables (llama.cpp's local layers are never
    scaled). Example: rope_base 1e6, no scaling, rope_local_base None -> 1e6."""
    if config.rope_local_base is not None:
        return config.rope_local_base
    return config.rope_base if config.rope_scaling is None else None


def _gemma3_checks(config: ModelConfig) -> list[tuple[bool, str]]:
    """What llama.cpp's gemma3 computes, option by option (its fixed settings: see the module's docstring)."""
    scaling = config.rope_scaling.kind if config.rope_scaling is not None else None
    scale = gemma3_attn_scale(config.n_layers, config.d_model, config.n_heads, config.head_dim)
    return [
        (config.positions == "rotary", f"positions {config.positions!r} (gemma3 rotates q and k)"),
        (config.norm == "rmsnorm", f"norm {config.norm!r} (gemma3 uses RMSNorm)"),
        (config.activation == "geglu", f"activation {config.activation!r} (gemma3's MLP is GeGLU)"),
        (config.post_norms, "post_norms false (gemma3 norms each sublayer's output)"),
        (config.qk_norm, "qk_norm false (gemma3 normalises each head's q and k)"),
        (config.scale_embeddings, "scale_embeddings false (llama.cpp's gemma3 scales the embeddings by sqrt(embedding_length))"),
        (not config.bias, "bias true (llama.cpp's gemma3 has no biases)"),
        (not config.has_qkv_bias, "qkv_bias true (llama.cpp's gemma3 has no biases)"),
        (not config.has_mlp_bias, "mlp_bias true (llama.cpp's gemma3 has no biases)"),
        (
            config.sliding_window is not None,
            "sliding_window None (tfcli writes gemma3 with its sliding window; llama.cpp's gemma3 without one soft-caps the logits by a default of its version)",
        ),
        (scaling in (None, "linear"), f"rope_scaling {scaling} (llama.cpp's gemma3 reads linear scaling only)"),
        (
            local_rope_base(config) is not None,
            f"rope_local_base None with rope_scaling {scaling} (llama.cpp's gemma3 never scales the local layers' rotary "
            "frequencies; set rope_local_base to turn them by a base of their own, unscaled)",
        ),
        (config.rope_fraction == 1, f"rope_fraction {config.rope_fraction:g} (tfcli writes partial rotary as phi3 only)"),
        (
            _same(config.attn_scale, scale),
            f"attn_scale {config.attn_scale} (llama.cpp's gemma3 scales the scores by 1 / sqrt(head_dim) and reads no query_pre_attn_scalar)",
        ),
    ]


# Fields compared by what they mean (n_kv_heads None is n_heads, d_ff None is 4 * d_model, ...)
_EFFECTIVE = {"n_kv_heads": "kv_heads", "d_head": "head_dim", "d_ff": "hidden_dim", "qkv_bias": "has_qkv_bias", "mlp_bias": "has_mlp_bias"}


def _not_read_back(config: ModelConfig, arch: str) -> str | None:
    """The first field of `config` that the file export writes would not give back, as a phrase, or None."""
    extras = extra_tensors(config, arch)
    names = {t.name for t in tensor_layout(config, arch)} | set(extras)
    metadata = {f"{arch}.{key}": value for key, value in hyperparameters(config, arch).items()}
    try:
        back, _ = config_from_gguf(metadata, arch, config.vocab_size, names, extras.__getitem__, "the file")
    except TfcliError as error:
        return f"a setting the file would not give back ({error.message})"
    for field in dataclasses.fields(ModelConfig):
        name = field.name
        if name in TRAINING_ONLY or (name == "activation" and export_notes(config, arch)):
            continue
        if not _same(_effective(config, name), _effective(back, name)):
            return f"{name} {_shown(getattr(config, name))} (GGUF's {arch} has no key or tensor that holds it)"
    return None


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, RopeScaling):
        return value.kind
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def _effective(config: ModelConfig, name: str) -> Any:
    if name == "rope_local_base":  # by the tables it makes: a base equal to the unscaled global one is the global tables
        return local_rope_base(config) if config.local_layers else None
    value = getattr(config, _EFFECTIVE.get(name, name))
    if isinstance(value, RopeScaling) and value.kind == "longrope":
        value = dataclasses.replace(value, factor=1.0)  # bookkeeping: longrope computes from short_factor and attention_factor alone
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal, floats within float32's rounding (GGUF stores them as float32)."""
    if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
        return _same(dataclasses.asdict(a), dataclasses.asdict(b))  # type: ignore[arg-type]
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    if numbers and (isinstance(a, float) or isinstance(b, float)):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-30)
    return a == b


def export_notes(config: ModelConfig, arch: str) -> list[str]:
    """What the file computes otherwise than the run does, as sentences (none when it computes the same)."""
    if arch == "gpt2" and config.activation == "gelu":
        return [
            "llama.cpp's gpt2 computes GELU's tanh approximation, not this run's exact GELU: its logits differ from tfcli's "
            "by under 1e-3 of the largest (the greedy text of the quickstart's model is the same); for GPT-2's own GELU, "
            "train with --set activation=gelu_tanh"
        ]
    return []


def window_as_context(config: ModelConfig) -> tuple[ModelConfig, str | None]:
    """The config a file is written for when every layer attends within one sliding window (Mistral's, Phi-3's,
    imported from Hugging Face) outside Gemma 3: its context cut to the window, as llama.cpp's converter leaves the
    window to a loader that has none for llama and switches phi3's off. Within the window the attention is the
    same; the note says where the file's context stops. Any other config comes back as it is, with no note."""
    gemma = config.activation == "geglu" and config.post_norms
    if config.sliding_window is None or gemma or config.rope_local_base is not None or config.local_layers != tuple(range(config.n_layers)):
        return config, None
    window = min(config.sliding_window, config.block_size)
    note = (
        f"context {window:,} in the file, the run's sliding window: llama.cpp attends to the whole context, which within "
        f"the window is the same attention (the run's context is {config.block_size:,})"
    )
    return dataclasses.replace(config, block_size=window, sliding_window=None, local_layers=()), note


def export_arch(config: ModelConfig) -> str:
    """gpt2 for learned positions; for rotary runs gemma3 with a GeGLU MLP and norms on each sublayer's output
    (Gemma 3), qwen3 with a norm on q and k (Qwen3), phi3 with longrope or partial rotary (Phi-3, Phi-4-mini),
    else llama. An option the architecture cannot express is named."""
    scaling = config.rope_scaling.kind if config.rope_scaling is not None else None
    if config.positions != "rotary":
        arch = "gpt2"
    elif config.activation == "geglu" and config.post_norms:
        arch = "gemma3"
    elif config.qk_norm:
        arch = "qwen3"
    elif scaling == "longrope" or config.rope_fraction < 1:
        arch = "phi3"
    else:
        arch = "llama"
    problem = export_incompatibility(config, arch)
    if problem is not None:
        raise TfcliError(
            f"GGUF's {arch} architecture cannot express this model: {problem}",
            hint="llama.cpp runs Llama-, Qwen3-, Phi-3-, Gemma 3- and GPT-2-style decoders; export to Hugging Face with --to hf",
        )
    return arch


def tensor_layout(config: ModelConfig, arch: str) -> list[GgufTensor]:
    """Every GGUF tensor of `arch` for this config taken from the weights, and where its rows are in tfcli's
    state (the ones computed from the config are `extra_tensors`)."""
    q, kv, hidden = config.q_width, config.kv_heads * config.head_dim, config.hidden_dim
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
        if arch == "gemma3":
            tensors += _gemma3_block(config, blk, ours)
            continue
        if arch == "phi3":  # q, k, v in one tensor and gate, up in another, as tfcli holds them (gate first: ggml_swiglu's order)
            for theirs, mine in (("attn_qkv", "attn.qkv"), ("attn_output", "attn.out"), ("ffn_up", "mlp.fc"), ("ffn_down", "mlp.proj")):
                tensors.append(GgufTensor(f"{blk}.{theirs}.weight", f"{ours}.{mine}.weight"))
            continue
        heads = {"q": config.n_heads, "k": config.kv_heads, "v": 0} if arch in PERMUTED else {"q": 0, "k": 0, "v": 0}
        spans = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
        for kind in ("weight", "bias") if config.has_qkv_bias else ("weight",):
            tensors += [GgufTensor(f"{blk}.attn_{p}.{kind}", f"{ours}.attn.qkv.{kind}", *spans[p], heads=heads[p]) for p in "qkv"]
        if config.qk_norm:  # qwen3: an RMSNorm over each head's query and key (head_dim wide)
            tensors += [GgufTensor(f"{blk}.attn_{p}_norm.weight", f"{ours}.attn.{p}_norm.weight") for p in "qk"]
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


def _gemma3_block(config: ModelConfig, blk: str, ours: str) -> list[GgufTensor]:
    """One gemma3 block past its attn_norm and ffn_norm: q, k, v apart (halves rotated, as tfcli's), the norms on
    each head's q and k and on each sublayer's output (post_attention_norm, post_ffw_norm), gate and up apart; no biases."""
    q, kv, hidden = config.q_width, config.kv_heads * config.head_dim, config.hidden_dim
    spans = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
    return [
        *(GgufTensor(f"{blk}.attn_{p}.weight", f"{ours}.attn.qkv.weight", *spans[p]) for p in "qkv"),
        *(GgufTensor(f"{blk}.attn_{p}_norm.weight", f"{ours}.attn.{p}_norm.weight") for p in "qk"),
        GgufTensor(f"{blk}.attn_output.weight", f"{ours}.attn.out.weight"),
        GgufTensor(f"{blk}.post_attention_norm.weight", f"{ours}.attn_out_norm.weight"),
        GgufTensor(f"{blk}.ffn_gate.weight", f"{ours}.mlp.fc.weight", 0, hidden),
        GgufTensor(f"{blk}.ffn_up.weight", f"{ours}.mlp.fc.weight", hidden, 2 * hidden),
        GgufTensor(f"{blk}.ffn_down.weight", f"{ours}.mlp.proj.weight"),
        GgufTensor(f"{blk}.post_ffw_norm.weight", f"{ours}.mlp_out_norm.weight"),
    ]


# The tensors computed from the config rather than taken from the weights, by architecture
EXTRA_TENSORS = {"llama": (ROPE_FREQS,), "phi3": (ROPE_SHORT, ROPE_LONG)}


def extra_tensors(config: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """Llama 3.1's rope_freqs.weight (llama), Phi-3's rope_factors_short and _long (phi3: both the short
    factors, which tfcli computes at every position: its context ends where the long ones would start)."""
    scaling = config.rope_scaling
    if scaling is not None and scaling.kind == "llama3" and arch == "llama":
        return {ROPE_FREQS: llama3_rope_factors(config)}
    if scaling is not None and scaling.kind == "longrope" and arch == "phi3":
        short = torch.tensor(scaling.short_factor, dtype=torch.float32)  # (hs/2,)
        return {ROPE_SHORT: short, ROPE_LONG: short.clone()}
    return {}


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
            "rope.dimension_count": config.rotary_dim,
            "vocab_size": config.vocab_size,
        }
    )
    if arch in ("qwen3", "gemma3") or config.q_width != config.d_model:  # heads of their own width (the Qwen3 and Gemma 3 converters always write them)
        keys["attention.key_length"] = keys["attention.value_length"] = config.head_dim
    if arch == "gemma3" and config.sliding_window is not None:
        keys["attention.sliding_window"] = config.sliding_window
        if config.local_layers != gemma3_local_layers(config.n_layers):  # one flag per layer, as llama.cpp's converters write it
            keys["attention.sliding_window_pattern"] = [i in config.local_layers for i in range(config.n_layers)]
        local_base = local_rope_base(config)
        if local_base is not None and local_base != GEMMA3_LOCAL_BASE:
            keys["rope.freq_base_swa"] = local_base
    if arch == "gemma3" and config.logit_softcap is not None:
        keys["final_logit_softcapping"] = config.logit_softcap
    scaling = config.rope_scaling
    if scaling is not None and scaling.kind == "linear":
        keys.update({"rope.scaling.type": "linear", "rope.scaling.factor": scaling.factor})
    elif scaling is not None and scaling.kind == "llama3":  # the divisors go in rope_freqs.weight; the context they were made for here
        keys["rope.scaling.original_context_length"] = scaling.original_context
    elif scaling is not None:  # longrope: the factors go in rope_factors_*; llama.cpp scales cos and sin by attn_factor, as tfcli does
        keys["rope.scaling.original_context_length"] = scaling.original_context
        keys["rope.scaling.attn_factor"] = scaling.attention_factor
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
ARCH_KEYS["qwen2"] = ARCH_KEYS["qwen3"] = ARCH_KEYS["llama"]
# phi3: the attention factor of its longrope; its sliding window, which llama.cpp's loader reads and switches off
ARCH_KEYS["phi3"] = ARCH_KEYS["llama"] | {"rope.scaling.attn_factor", "attention.sliding_window"}
# gemma3: the local layers' window, which ones they are and their rotary base (llama.cpp's converter writes the base
# since 2025); the final soft cap
ARCH_KEYS["gemma3"] = ARCH_KEYS["llama"] | {"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa", "final_logit_softcapping"}


class Hparams:
    """The `{arch}.*` metadata of a file, read with the key's name in every complaint."""

    def __init__(self, metadata: dict[str, Any], arch: str, where: str) -> None:
        self.metadata, self.arch, self.where = metadata, arch, where
        prefix = f"{arch}."
        for key in metadata:
            if key.startswith(prefix) and key[len(prefix) :] not in ARCH_KEYS[arch]:
                raise TfcliError(
                    f"{where}: metadata {key} is not something tfcli's {arch} model can express",
                    hint=f"tfcli imports plain {', '.join(IMPORT_ARCHS)} models",
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


def config_from_gguf(
    metadata: dict[str, Any], arch: str, vocab_size: int, names: Collection[str], read: Callable[[str], torch.Tensor], where: str
) -> tuple[ModelConfig, list[str]]:
    """tfcli's config for a file of `arch` (its vocabulary size from the token list): the metadata, with the
    biases, the tied head and the rope scaling its tensor `names` show (`read` gives a rope tensor's values),
    and notes on what llama.cpp's loader reads and leaves unused, which tfcli leaves too."""
    hp = Hparams(metadata, arch, where)
    d, heads = hp.get("embedding_length", int), hp.get("attention.head_count", int)
    block_size = hp.get("context_length", int)
    shape = dict(
        arch="decoder",
        vocab_size=vocab_size,
        block_size=block_size,
        n_layers=hp.get("block_count", int),
        n_heads=heads,
        d_model=d,
        d_ff=hp.get("feed_forward_length", int),
        dropout=0.0,
    )
    if arch == "gpt2":
        config = _build(
            where,
            **shape,
            positions="learned",
            norm="layernorm",
            activation="gelu_tanh",
            bias=True,
            norm_eps=hp.get("attention.layer_norm_epsilon", float),
            tie_embeddings="output.weight" not in names,
        )
        return config, []
    notes: list[str] = []
    head_dim = hp.get("attention.key_length", int, d // heads if heads > 0 and d % heads == 0 else 0)
    if head_dim < 1:
        raise TfcliError(
            f"{where}: metadata {arch}.embedding_length {d} is not a multiple of head_count {heads}, and no {arch}.attention.key_length says how wide the heads are"
        )
    if hp.get("attention.value_length", int, head_dim) != head_dim:
        raise TfcliError(
            f"{where}: metadata {arch}.attention.value_length is {hp.get('attention.value_length', int)}; tfcli's values are as wide as its keys ({head_dim})"
        )
    rotary = hp.get("rope.dimension_count", int, head_dim)
    fraction = rotary / head_dim
    if rotary != head_dim and (arch != "phi3" or not 2 <= rotary < head_dim or rotary % 2 or int(head_dim * fraction) != rotary):
        raise TfcliError(
            f"{where}: metadata {arch}.rope.dimension_count is {rotary}; tfcli turns all {head_dim} features of each head"
            + (", or an even number of the first ones below that in a phi3 model" if arch == "phi3" else f" in a {arch} model (part of them: phi3 only)")
        )
    scaling, block_size = _rope_scaling(hp, names, read, rotary, block_size, notes)
    if arch == "gemma3":
        return _gemma3_config(hp, shape, head_dim, scaling, block_size, names, notes), notes
    if arch == "phi3":
        window = hp.get("attention.sliding_window", int, 0)
        if 0 < window < block_size:
            notes.append(
                f"metadata phi3.attention.sliding_window is {window:,}: llama.cpp switches Phi-3's sliding window off and attends to the whole context, as tfcli does"
            )
    names = set(names)
    phi3 = arch == "phi3"
    bias = not phi3 and arch != "qwen3" and "blk.0.attn_output.bias" in names
    qkv_bias = not phi3 and "blk.0.attn_q.bias" in names
    mlp_bias = not phi3 and arch != "qwen3" and "blk.0.ffn_up.bias" in names
    config = _build(
        where,
        **{**shape, "block_size": block_size},
        n_kv_heads=hp.get("attention.head_count_kv", int, heads),
        d_head=head_dim if head_dim * heads != d else None,
        positions="rotary",
        rope_base=hp.get("rope.freq_base", float, 10000.0),
        rope_scaling=scaling,
        norm="rmsnorm",
        norm_eps=hp.get("attention.layer_norm_rms_epsilon", float),
        activation="swiglu",
        bias=bias,
        qkv_bias=None if qkv_bias == bias else qkv_bias,
        mlp_bias=None if mlp_bias == bias else mlp_bias,
        qk_norm=arch == "qwen3",
        tie_embeddings="output.weight" not in names,
        rope_fraction=fraction,
    )
    return config, notes


def _gemma3_config(
    hp: Hparams, shape: dict[str, Any], head_dim: int, scaling: RopeScaling | None, block_size: int, names: Collection[str], notes: list[str]
) -> ModelConfig:
    """A gemma3 file as llama.cpp's gemma3 computes it: with a sliding window, every sixth layer global and the
    others local (base 10,000, unscaled), the logits soft-capped where final_logit_softcapping is given; without
    one, every layer global and the logits soft-capped by final_logit_softcapping (refused when the file gives
    none: llama.cpp's versions differ on it)."""
    where, arch = hp.where, hp.arch
    window = hp.get("attention.sliding_window", int, 0)
    softcap = hp.get("final_logit_softcapping", float, 0.0)
    heads, d = shape["n_heads"], shape["d_model"]
    local: dict[str, Any] = dict(sliding_window=None, local_layers=(), rope_local_base=None, logit_softcap=None)
    if window > 0:
        local_layers = _gemma3_file_local_layers(hp, shape["n_layers"])
        local_base = hp.get("rope.freq_base_swa", float, GEMMA3_LOCAL_BASE)
        same_tables = hp.get("rope.freq_base", float, 10000.0) == local_base and scaling is None
        local.update(sliding_window=window, local_layers=local_layers, rope_local_base=None if same_tables else local_base)
        if softcap > 0:  # llama.cpp's gemma3 caps whenever the file gives a cap (0.3.36; some older versions did not with a window)
            local["logit_softcap"] = softcap
    elif softcap > 0:
        local["logit_softcap"] = softcap
    else:
        raise TfcliError(
            f"{where}: a gemma3 model without metadata {arch}.attention.sliding_window needs {arch}.final_logit_softcapping",
            hint="llama.cpp's versions soft-cap such a model's logits by different defaults; add the key with the cap the model was trained with",
        )
    return _build(
        where,
        **{**shape, "block_size": block_size},
        n_kv_heads=hp.get("attention.head_count_kv", int, heads),
        d_head=head_dim if head_dim * heads != d else None,
        attn_scale=gemma3_attn_scale(shape["n_layers"], d, heads, head_dim) if heads > 0 else None,
        positions="rotary",
        rope_base=hp.get("rope.freq_base", float, 10000.0),
        rope_scaling=scaling,
        norm="rmsnorm",
        norm_eps=hp.get("attention.layer_norm_rms_epsilon", float),
        post_norms=True,
        activation="geglu",
        bias=False,
        qk_norm=True,
        scale_embeddings=True,
        tie_embeddings="output.weight" not in names,
        **local,
    )


def _gemma3_file_local_layers(hp: Hparams, n_layers: int) -> tuple[int, ...]:
    """The local layers as llama.cpp's loader reads them (load_swa_pattern): attention.sliding_window_pattern as one
    flag per layer, or as a period n (each n-th layer global; 0: all local), else the fixed period of 6."""
    key = f"{hp.arch}.attention.sliding_window_pattern"
    pattern = hp.metadata.get(key)
    if pattern is None:
        return gemma3_local_layers(n_layers)
    if isinstance(pattern, (int, np.integer)) and not isinstance(pattern, bool) and pattern >= 0:
        return tuple(i for i in range(n_layers) if pattern == 0 or i % pattern < pattern - 1)
    flags = list(pattern) if isinstance(pattern, (list, np.ndarray)) else None
    if flags is None or len(flags) != n_layers or not all(isinstance(f, (bool, np.bool_)) for f in flags) or not any(flags):
        raise TfcliError(f"{hp.where}: metadata {key} is neither a period nor one true or false for each of the {n_layers} layers, some true")
    return tuple(i for i, local in enumerate(flags) if local)


def _rope_scaling(
    hp: Hparams, names: Collection[str], read: Callable[[str], torch.Tensor], head_dim: int, block_size: int, notes: list[str]
) -> tuple[RopeScaling | None, int]:
    """The rope scaling (and the context) llama.cpp computes for this file: the scaling type (linear when a
    factor is given without one, as llama.cpp reads it), Llama 3.1's rope_freqs (llama), Phi-3's rope factors
    with their attention factor (phi3, up to the original context: past it llama.cpp takes the long factors).
    head_dim: the width rotary turns (rope.dimension_count), whose half each rope tensor holds."""
    arch, where = hp.arch, hp.where
    kind = hp.get("rope.scaling.type", str, "linear")
    factor = hp.get("rope.scaling.factor", float, 0.0)
    if kind not in ("none", "linear"):
        raise TfcliError(
            f"{where}: metadata {arch}.rope.scaling.type is {kind!r}; tfcli implements none and linear (and Llama 3.1's rope_freqs, Phi-3's rope factors)"
        )
    scaling = RopeScaling("linear", factor) if kind == "linear" and factor not in (0.0, 1.0) else None
    extra = [name for name in EXTRA_TENSORS.get(arch, ()) if name in names]
    if extra and scaling is not None:
        raise TfcliError(f"{where}: tensor {extra[0]} and linear rope scaling together are something tfcli cannot express")
    attention = hp.get("rope.scaling.attn_factor", float, 1.0)
    if ROPE_FREQS in extra:
        factors = _rope_tensor(read, ROPE_FREQS, head_dim, where)
        return _llama3_scaling(factors, hp, head_dim, where), block_size
    if arch == "phi3" and extra:
        if ROPE_SHORT not in extra:
            raise TfcliError(f"{where} has {ROPE_LONG} without {ROPE_SHORT}, which llama.cpp uses up to the original context")
        short = _rope_tensor(read, ROPE_SHORT, head_dim, where)
        if ROPE_LONG in extra:
            _rope_tensor(read, ROPE_LONG, head_dim, where)
        original = hp.get("rope.scaling.original_context_length", int, block_size)
        if original < block_size:
            notes.append(f"context {original:,} (longrope's original context; past it llama.cpp switches to {ROPE_LONG}, which tfcli does not implement)")
        if not (attention > 0 and all(f > 0 for f in short.tolist())):
            raise TfcliError(f"{where}: tensor {ROPE_SHORT} and metadata {arch}.rope.scaling.attn_factor must be positive")
        factor = max(1.0, block_size / original)  # bookkeeping: longrope computes from the short factors and the attention factor
        longrope = RopeScaling("longrope", factor, original_context=original, short_factor=tuple(short.tolist()), attention_factor=attention)
        return longrope, min(block_size, original)
    if attention != 1.0:
        raise TfcliError(f"{where}: metadata {arch}.rope.scaling.attn_factor is {attention} without rope factors; tfcli scales cos and sin only with longrope")
    return scaling, block_size


def _rope_tensor(read: Callable[[str], torch.Tensor], name: str, head_dim: int, where: str) -> torch.Tensor:
    values = read(name)
    if tuple(values.shape) != (head_dim // 2,):
        raise TfcliError(f"{where}: tensor {name} has shape {list(values.shape)}, not [{head_dim // 2}]")
    if not bool(values.isfinite().all()):
        raise TfcliError(f"{where}: tensor {name} holds non-finite values")
    return values.float()


def _llama3_scaling(factors: torch.Tensor, hp: Hparams, head_dim: int, where: str) -> RopeScaling:
    """Llama 3.1's rope scaling, recognised from rope_freqs.weight: the factors it implies for the usual
    low/high frequency factors (1, 4) and original context (the file's, 8,192, or one the divisors themselves
    imply: llama.cpp's converter writes no original context), with the largest divisor as the factor."""
    original = hp.get("rope.scaling.original_context_length", int, 8192)
    base = hp.get("rope.freq_base", float, 10000.0)
    for context in dict.fromkeys((original, 8192, *_llama3_contexts(factors, base, head_dim))):
        scaling = RopeScaling("llama3", float(factors.max()), 1.0, 4.0, int(context))
        try:  # a config of one head, for its frequencies
            probe = ModelConfig(n_layers=1, n_heads=1, d_model=head_dim, positions="rotary", rope_base=base, rope_scaling=scaling, block_size=2)
        except TfcliError:
            continue  # no Llama 3.1 scaling (a largest divisor below 1, say)
        if torch.allclose(llama3_rope_factors(probe), factors, rtol=1e-4, atol=1e-5):
            return scaling
    raise TfcliError(
        f"{where}: tensor {ROPE_FREQS} scales the rotary frequencies in a way tfcli cannot name", hint="tfcli knows Llama 3.1's scaling (factors 1 and 4)"
    )


def _llama3_contexts(factors: torch.Tensor, base: float, head_dim: int) -> list[int]:
    """Original contexts under which Llama 3.1's scaling (low and high frequency factors 1 and 4) gives these
    divisors: from a divisor between 1 and the factor (a wavelength in the smooth band, which fixes the context),
    else from the band's edges (undivided wavelengths are below a quarter of it, fully divided ones above it)."""
    wavelengths = 2 * math.pi * base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (hs/2,)
    factor = float(factors.max())
    if factor <= 1:
        return []
    contexts = []
    for wavelength, divisor in zip(wavelengths.tolist(), factors.tolist()):
        if 1 < divisor < factor:
            smooth = (1 / divisor - 1 / factor) / (1 - 1 / factor)  # transformers' _compute_llama3_parameters, solved for it
            contexts.append(round(wavelength * (smooth * 3 + 1)))
    undivided = [w for w, d in zip(wavelengths.tolist(), factors.tolist()) if d == 1]
    divided = [w for w, d in zip(wavelengths.tolist(), factors.tolist()) if d == factor]
    if undivided:
        contexts.append(math.floor(4 * max(undivided)) + 1)
    if divided:
        contexts.append(math.ceil(min(divided)) - 1)
    return [c for c in contexts if c > 0]


def _build(where: str, **settings: Any) -> ModelConfig:
    try:
        return ModelConfig(**settings)
    except TfcliError as error:
        raise TfcliError(f"{where} describes a model tfcli cannot build: {error.message}") from None
