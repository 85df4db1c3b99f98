"""A decoder's whole decoding step in one C call (`native.c`'s decoder_step), for one row on the CPU.

A small model's step through PyTorch is about a hundred calls of a few microseconds each, which cost more
than the arithmetic; one C call does the same step (the token's embedding, every block with its KV cache
entry, the final norm and the output head) in a fraction of that time, and for a large model it saves the
calls' overhead around weights that it streams as `vector_linear` does. `NativeDecoderStep.bind` hands a
model and its KV cache to the C code only where it is known to compute exactly what `Transformer.decode`
does: every config setting is one the C step implements (`KNOWN_SETTINGS`, an allow-list: a setting added
to the model later runs in PyTorch until the C code learns it), the model is laid out as its config builds
it, in eval mode, with its weights on the CPU and a cache for one row; the C code has passed its check
against PyTorch on small models in this process; and, for this shape on this machine, it was measured
faster than PyTorch's step (and gave its logits). Anything else keeps the PyTorch step.

A weight matrix is fp32 or, in a quantized run, block-quantized (`QuantLinear`, `QuantEmbedding`): the C step
multiplies a quantized linear by the very C function its PyTorch product uses for one row (the path
tfcli.accel.quant chose for that matrix: `quant.step_product`) and dequantizes the token's embedding row with
blocks.c's dequantizer, so it computes what the PyTorch step over the same kernels computes, up to the order of
the norms' and attention's sums (and, where a path rounds the activations to int8, a level that rounding puts on
the other side of a half: held to that path's tolerance, `quant.ROUNDING_TOLERANCE`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from collections.abc import Callable

import torch
import torch.nn.modules.module as module_hooks
from torch import nn

from tfcli.accel import choices, native, products, quant
from tfcli.accel.layout import ACTIVATIONS, FP32, NORMS, Decoder, DecoderLayer, Matrix
from tfcli.model.attention import Attention, KVCache
from tfcli.model.config import ModelConfig, preset
from tfcli.model.hook_point import HookPoint, any_hooked
from tfcli.model.layers import MLP, RMSNorm, RotaryEmbedding
from tfcli.model.transformer import Block, Stack, Transformer
from tfcli.quant.formats import FORMATS, quantize
from tfcli.quant.linear import QuantEmbedding, QuantLinear
from tfcli.quant.tensors import Blocks

ANY = None
# Every ModelConfig setting, with the values the C step implements (ANY: every value the config accepts).
# A setting missing here, or a value outside its set, leaves decoding to PyTorch's step.
KNOWN_SETTINGS: dict[str, set | None] = {
    "arch": {"decoder"},
    "vocab_size": ANY,
    "block_size": ANY,
    "n_layers": ANY,
    "n_decoder_layers": {None},
    "n_heads": ANY,
    "n_kv_heads": ANY,
    "d_model": ANY,
    "d_head": {None},  # heads of their own width (Qwen3): PyTorch's step
    "d_ff": ANY,
    "attn_scale": {None},  # Gemma 3's options: PyTorch's step
    "sliding_window": {None},
    "local_layers": {()},
    "positions": {"learned", "sinusoidal", "rotary"},
    "rope_base": ANY,
    "rope_scaling": {None},
    "rope_local_base": {None},
    "rope_fraction": {1.0},  # partial rotary (Phi-4-mini): PyTorch's step
    "norm": set(NORMS),
    "norm_placement": {"pre", "post"},
    "norm_eps": ANY,
    "post_norms": {False},
    "activation": set(ACTIVATIONS),
    "dropout": ANY,  # the step runs in eval mode only: no dropout
    "bias": ANY,
    "qk_norm": {False},  # a norm on each head's q and k (Qwen3): PyTorch's step
    "qkv_bias": {None},
    "mlp_bias": {None},
    "tie_embeddings": ANY,
    "logit_softcap": {None},  # logits soft-capped (Gemma 2, the speedrun): PyTorch's step
    "scale_embeddings": {False},
    "n_classes": ANY,  # a classification head plays no part in decoding
    "init_std": ANY,
    "zero_init_proj": ANY,  # the initialisation only
    "type_vocab_size": {0},
    "embedding_norm": {False},
    "pooler": {False},
}
LINEARS = (nn.Linear, products.Linear, QuantLinear)  # the plain model's, the one `accelerate` turns it into, a quantized run's
EMBEDDINGS = (nn.Embedding, QuantEmbedding)
Product = Callable[[QuantLinear], "int | None"]  # a quantized layer -> the address of the C product for one row, or None


class NativeDecoderStep:
    """Runs one token through `model`, after the tokens in `cache`, writing its keys and values there. It
    reads the model as it was when bound (DecoderWindow binds once per generation): bind again after
    changing the model."""

    def __init__(
        self, library: native.NativeLibrary, model: Transformer, cache: KVCache, product: Product = quant.step_product, dequantizer: int | None = None
    ) -> None:
        config = model.config
        self.library, self.model, self.cache = library, model, cache
        self.vocab = config.vocab_size
        self.product = product
        self.dequantizer = dequantizer if dequantizer is not None else quant.step_dequantizer()
        self.storages: list[torch.UntypedStorage] = []  # the memory of every tensor whose address the C code holds
        layers = (DecoderLayer * config.decoder_layers)()
        for i, block in enumerate(model.decoder.blocks):
            parts = {
                "attn_norm": block.attn_norm,
                "qkv": block.attn.qkv,
                "out": block.attn.out,
                "mlp_norm": block.mlp_norm,
                "fc": block.mlp.fc,
                "proj": block.mlp.proj,
            }
            for name, module in parts.items():
                is_linear = name in ("qkv", "out", "fc", "proj")
                setattr(layers[i], f"{name}_weight", self._matrix(module) if is_linear else self._address(module.weight))
                setattr(layers[i], f"{name}_bias", self._address(getattr(module, "bias", None)))
            layers[i].keys = self._address(cache.keys[i, 0])
            layers[i].values = self._address(cache.values[i, 0])
        final_norm = model.decoder.norm
        pre_norm = config.norm_placement == "pre"
        self.decoder = Decoder(
            d_model=config.d_model,
            n_heads=config.n_heads,
            n_kv_heads=config.kv_heads,
            head_dim=config.head_dim,
            hidden=config.hidden_dim,
            vocab=config.vocab_size,
            capacity=cache.capacity,
            n_layers=config.decoder_layers,
            norm=NORMS.index(config.norm),
            pre_norm=int(pre_norm),
            activation=ACTIVATIONS.index(config.activation),
            norm_eps=config.norm_eps,
            token_embedding=self._matrix(model.tok_emb),
            position_table=self._address(_position_table(model)),
            rotary_cos=self._address(model.rotary.cos if model.rotary is not None else None),
            rotary_sin=self._address(model.rotary.sin if model.rotary is not None else None),
            final_norm_weight=self._address(final_norm.weight if pre_norm else None),
            final_norm_bias=self._address(getattr(final_norm, "bias", None) if pre_norm else None),
            head_weight=self._matrix(model.lm_head),
            layers=layers,
        )
        self.layers = layers
        self.workspace = torch.empty(library.decoder_workspace(ctypes.byref(self.decoder)), dtype=torch.float32)
        self.address = ctypes.addressof(self.decoder)

    def _matrix(self, module: nn.Module) -> Matrix:
        """A linear layer's or the embedding's weight as native.c's matrix: fp32, or the block bytes with the C
        product chosen for them (a linear) and the C dequantizer (the embedding)."""
        if isinstance(module, (QuantLinear, QuantEmbedding)):
            function = self.product(module) if isinstance(module, QuantLinear) else None
            expand = self.dequantizer if isinstance(module, QuantEmbedding) else None
            if function is None and expand is None:
                raise ValueError(f"no C code for the {module.format} matrix {module.extra_repr()}")
            data = self._address(module.blocks)
            return Matrix(data=data, format=quant.FORMAT_CODE[module.format], row_bytes=module.blocks.shape[1], product=function, expand=expand)
        return Matrix(data=self._address(module.weight), format=FP32)

    def _address(self, tensor: torch.Tensor | None) -> int | None:
        if tensor is None:
            return None
        # The storage, not only the tensor: a parameter whose data is replaced (model.to(...)) keeps the
        # memory the C code reads alive, so a step after that is stale, never a read of freed memory.
        self.storages.append(tensor.untyped_storage())
        return tensor.data_ptr()

    @classmethod
    def bind(cls, model: Transformer, cache: KVCache) -> NativeDecoderStep | None:
        """The C step for this model and cache, or None where it does not apply (`unsupported` says why) or
        PyTorch's step was measured as fast on this machine (`choose`)."""
        if unsupported(model, cache) is not None:
            return None
        library = native.library()
        if library is None or not _verified(library, quantized=is_quantized(model)) or choose(library, model) != NATIVE:
            return None
        return cls(library, model, cache)

    @staticmethod
    def usable() -> bool:
        """Whether this step may run now: the modes can change between steps, and a hook added to a hook
        point since it was bound must see the step, which only the model's own forward shows it."""
        return plain_mode() and not any_hooked()

    def __call__(self, token: int) -> torch.Tensor:
        """The next-token logits (1, vocab) after `token`; the cache grows by one position."""
        position = self.cache.length
        if not 0 <= token < self.vocab or not 0 <= position < self.cache.capacity:
            raise ValueError(f"token {token} at position {position} is outside the model's vocabulary or the cache")
        logits = torch.empty(1, self.vocab, dtype=torch.float32)
        status = self.library.decoder_step(
            self.address, token, position, logits.data_ptr(), self.workspace.data_ptr(), torch.get_num_threads(), native.PARALLEL_FROM
        )
        if status != 0:
            raise MemoryError(f"the C decoder step's block products could not allocate their memory (status {status})")
        self.cache.advance(1)
        return logits


def _position_table(model: Transformer) -> torch.Tensor | None:
    if model.config.positions == "learned":
        return model.pos_emb.weight
    if model.config.positions == "sinusoidal":
        return model.sinusoid
    return None


def unknown_setting(config: ModelConfig) -> str | None:
    """The first setting of `config` that the C step does not implement, described, or None."""
    for field in dataclasses.fields(config):
        if field.name not in KNOWN_SETTINGS:
            return f"the C step does not know the setting {field.name!r}"
        allowed, value = KNOWN_SETTINGS[field.name], getattr(config, field.name)
        if allowed is not ANY and value not in allowed:
            return f"the C step does not implement {field.name} = {value!r}"
    return None


def unsupported(model: Transformer, cache: KVCache | None) -> str | None:
    """Why the C step cannot stand in for `model.decode` over this cache, or None when it can."""
    config: ModelConfig = model.config
    if config.arch != "decoder":
        return f"the C step runs decoders, not {config.arch} models"
    unknown = unknown_setting(config)
    if unknown is not None:
        return unknown
    if cache is None or cache.keys.shape[1] != 1:
        return "the C step decodes one row with a KV cache"
    if cache.capacity > config.block_size:
        return "the cache is longer than the model's context"
    if not plain_mode():
        return "gradients, autocast, torch.compile and torch.jit need PyTorch's step"
    if any(module.training for module in model.modules()):
        return "the model is in training mode"
    if not _as_built(model):
        return "the model has modules, settings or hooks of its own, which only PyTorch's step runs"
    d, hidden = config.d_model, config.hidden_dim
    kv_width = config.kv_heads * config.head_dim
    up = 2 * hidden if config.activation == "swiglu" else hidden
    cache_shape = (config.decoder_layers, 1, config.kv_heads, cache.capacity, config.head_dim)  # (L, B, n_kv, S, hs)
    matrices = [(model.tok_emb, (config.vocab_size, d)), (model.lm_head, (config.vocab_size, d))]
    for block in model.decoder.blocks:
        matrices += [(block.attn.qkv, (d + 2 * kv_width, d)), (block.attn.out, (d, d)), (block.mlp.fc, (up, d)), (block.mlp.proj, (d, hidden))]
    for module, shape in matrices:
        problem = _matrix_problem(module, shape)
        if problem is not None:
            return problem
    expected: list[tuple[torch.Tensor | None, tuple[int, ...] | None]] = [
        (model.lm_head.bias, None),
        (_position_table(model), (config.block_size, d) if config.positions != "rotary" else None),
        (cache.keys, cache_shape),
        (cache.values, cache_shape),
    ]
    if model.rotary is not None:
        expected += [(model.rotary.cos, (config.block_size, config.head_dim)), (model.rotary.sin, (config.block_size, config.head_dim))]
    norms = [block_norm for block in model.decoder.blocks for block_norm in (block.attn_norm, block.mlp_norm)]
    for norm in norms + ([model.decoder.norm] if config.norm_placement == "pre" else []):
        expected += [(norm.weight, (d,)), (getattr(norm, "bias", None), (d,) if config.norm == "layernorm" and config.bias else None)]
    for block in model.decoder.blocks:
        for linear, shape in ((block.attn.qkv, (d + 2 * kv_width, d)), (block.attn.out, (d, d)), (block.mlp.fc, (up, d)), (block.mlp.proj, (d, hidden))):
            expected.append((linear.bias, (shape[0],) if config.bias else None))
    for tensor, shape in expected:
        if (tensor is None) != (shape is None) or (tensor is not None and tuple(tensor.shape) != tuple(shape)):
            return "the model's tensors or its cache are not the ones its config describes"
        if tensor is not None and (tensor.device.type != "cpu" or tensor.dtype != torch.float32 or not tensor.is_contiguous()):
            return "the C step needs contiguous fp32 tensors on the CPU"
    return None


def is_quantized(model: nn.Module) -> bool:
    """The model holds block-quantized weights (a quantized run loaded for decoding)."""
    return any(isinstance(module, (QuantLinear, QuantEmbedding)) for module in model.modules())


def _matrix_problem(module: nn.Module, shape: tuple[int, int]) -> str | None:
    """Why a linear layer's or the embedding's weight is not one the C step reads as `shape`, or None."""
    if not isinstance(module, (QuantLinear, QuantEmbedding)):
        weight = module.weight
        if tuple(weight.shape) != shape:
            return "the model's tensors or its cache are not the ones its config describes"
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or not weight.is_contiguous():
            return "the C step needs contiguous fp32 tensors on the CPU"
        return None
    rows, columns = (module.out_features, module.in_features) if isinstance(module, QuantLinear) else (module.num_embeddings, module.embedding_dim)
    if module.format not in quant.FORMAT_CODE or (rows, columns) != shape:
        return "the model's tensors or its cache are not the ones its config describes"
    blocks, kind = module.blocks, FORMATS[module.format]
    if blocks.dtype != torch.uint8 or blocks.device.type != "cpu" or not blocks.is_contiguous() or tuple(blocks.shape) != (rows, kind.row_bytes(columns)):
        return "the C step needs the block bytes of each quantized matrix, contiguous, on the CPU"
    if columns % max(kind.block_size, 32):
        return f"the C step multiplies whole blocks of 32 values, not rows of {columns} ({module.format})"
    if isinstance(module, QuantLinear) and quant.step_product(module) is None:
        return f"a {module.format} layer multiplies through PyTorch's product, which only PyTorch's step runs"
    if isinstance(module, QuantEmbedding) and quant.step_dequantizer() is None:
        return "the C dequantizer of the quantized token embedding is not built here"
    return None


def plain_mode() -> bool:
    """No gradient, autocast, compiling or tracing: the modes in which PyTorch's step computes what the C
    step computes. Checked at every step too, since they can change between steps."""
    return not (torch.is_grad_enabled() or torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling() or torch.jit.is_tracing())


# The methods the C step stands in for, as this module first saw them: one patched since is not ours to copy.
_METHODS = {
    (cls, "forward"): cls.forward
    for cls in (Transformer, Stack, Block, Attention, MLP, HookPoint, *LINEARS, *EMBEDDINGS, nn.LayerNorm, RMSNorm, RotaryEmbedding)
}
_METHODS[(HookPoint, "__call__")] = HookPoint.__call__
_METHODS.update({(Transformer, name): getattr(Transformer, name) for name in ("decode", "_embed", "head_input", "unembed")})


def _as_built(model: Transformer) -> bool:
    """The model is laid out and set up as `Transformer(model.config)` builds it: each module of the class
    and settings the config implies (none swapped, patched or reconfigured), and no hook on any of them."""
    config = model.config
    norm_class = RMSNorm if config.norm == "rmsnorm" else nn.LayerNorm
    pre_norm = config.norm_placement == "pre"

    def is_norm(module: nn.Module) -> bool:
        if type(module) is not norm_class or module.eps != config.norm_eps:
            return False
        return norm_class is RMSNorm or (module.elementwise_affine and tuple(module.normalized_shape) == (config.d_model,))

    def of_class(module: object, cls: type | tuple[type, ...]) -> bool:
        return type(module) in (cls if isinstance(cls, tuple) else (cls,))

    if not (
        of_class(model, Transformer)
        and of_class(model.tok_emb, EMBEDDINGS)
        and of_class(model.lm_head, LINEARS)
        and of_class(model.decoder, Stack)
        and getattr(model.tok_emb, "max_norm", None) is None
    ):
        return False
    if config.positions == "learned" and not (of_class(model.pos_emb, nn.Embedding) and model.pos_emb.max_norm is None):
        return False
    if config.positions == "rotary" and not of_class(model.rotary, RotaryEmbedding):
        return False
    if not (is_norm(model.decoder.norm) if pre_norm else of_class(model.decoder.norm, nn.Identity)):
        return False
    for block in model.decoder.blocks:
        if not (of_class(block, Block) and block.pre_norm == pre_norm and is_norm(block.attn_norm) and is_norm(block.mlp_norm)):
            return False
        attention, mlp = block.attn, block.mlp
        if not (
            of_class(attention, Attention)
            and not attention.cross
            and attention.causal
            and of_class(attention.qkv, LINEARS)
            and of_class(attention.out, LINEARS)
            and (attention.n_heads, attention.n_kv_heads, attention.head_dim) == (config.n_heads, config.kv_heads, config.head_dim)
        ):
            return False
        if not (of_class(mlp, MLP) and of_class(mlp.fc, LINEARS) and of_class(mlp.proj, LINEARS) and mlp.activation == config.activation):
            return False
    if any(getattr(cls, name) is not method for (cls, name), method in _METHODS.items()):
        return False
    if any(name in model.__dict__ for _, name in _METHODS):
        return False
    for module in model.modules():
        if module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__:
            return False
    return not (module_hooks._global_forward_hooks or module_hooks._global_forward_pre_hooks)


# Small models that between them take every branch of the C step, checked against PyTorch once a process.
CHECK_MODELS = (
    dict(d_model=32, n_heads=4, n_kv_heads=2, positions="rotary", norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=False),
    dict(d_model=24, n_heads=4, positions="learned", norm="layernorm", norm_placement="post", activation="gelu", bias=True),
    dict(d_model=20, n_heads=2, n_kv_heads=1, positions="sinusoidal", activation="gelu_tanh", bias=True, tie_embeddings=False),
    dict(d_model=16, n_heads=2, positions="rotary", norm="layernorm", activation="relu", bias=False),
)


_check_lock = threading.Lock()


def _verified(library: native.NativeLibrary, quantized: bool = False) -> bool:
    """Whether this build of the C step agrees with PyTorch on CHECK_MODELS, and with `quantized` on the quantized
    check model too (each checked once a process)."""
    with _check_lock:
        if library.step_verified is None:
            try:
                library.step_verified = all(_agrees(library, settings) for settings in CHECK_MODELS)
            except Exception:  # whatever goes wrong, decoding goes on with PyTorch's step
                library.step_verified = False
        if quantized and library.step_verified and library.quantized_step_verified is None:
            try:
                library.quantized_step_verified = _agrees_quantized(library)
            except Exception:  # as above
                library.quantized_step_verified = False
        return bool(library.step_verified and (not quantized or library.quantized_step_verified))


TORCH, NATIVE = "torch", "native"
TIMED_STEPS = 8  # each candidate decodes this many tokens from an empty cache, in turns


def _shape_key(model: Transformer) -> str:
    config = model.config
    return (
        f"decoder-step t{torch.get_num_threads()} L{config.decoder_layers} d{config.d_model} h{config.n_heads}/{config.kv_heads} "
        f"ff{config.hidden_dim} v{config.vocab_size} {config.positions} {config.norm_placement}-{config.norm} "
        f"{config.activation}{' bias' if config.bias else ''}{_weights_key(model)}"
    )


def _weights_key(model: Transformer) -> str:
    """A quantized model's formats and the paths chosen for them (each changes which step is faster); '' for fp32.
    Example: ' q6_K/avx512_vnni q8_0/avx512_vnni emb-q6_K'."""
    kinds = {f"{m.format}/{quant.choose(m, 1)}" for m in model.modules() if isinstance(m, QuantLinear)}
    kinds |= {f"emb-{m.format}" for m in model.modules() if isinstance(m, QuantEmbedding)}
    return "".join(f" {kind}" for kind in sorted(kinds))


def _rounds(model: Transformer) -> bool:
    """Some quantized layer's product rounds the activations (int8 blocks, or bf16)."""
    return any(quant.rounds(quant.choose(m, 1), m.format) for m in model.modules() if isinstance(m, QuantLinear))


def choose(library: native.NativeLibrary, model: Transformer) -> str:
    """TORCH or NATIVE: which step decodes this model's shape faster on this machine (measured on the model
    itself the first time, its logits compared with PyTorch's; remembered in the decisions file)."""
    config = model.config
    key = _shape_key(model)
    known = choices.choices().get(key, (TORCH, NATIVE))
    if known is not None:
        return known.choice
    capacity = min(config.block_size, TIMED_STEPS)
    tokens = [(7 * i + 1) % config.vocab_size for i in range(capacity)]

    def pytorch_steps() -> torch.Tensor:
        cache = KVCache(config, 1, capacity, torch.float32)
        return torch.cat([model.unembed(model.decode(torch.tensor([[token]]), cache=cache)[:, -1]) for token in tokens])

    def c_steps() -> torch.Tensor:
        step = NativeDecoderStep(library, model, KVCache(config, 1, capacity, torch.float32))
        return torch.cat([step(token) for token in tokens])

    with torch.inference_mode():
        return choices.choices().decide(key, {TORCH: pytorch_steps, NATIVE: c_steps}, _same_rounded_logits if _rounds(model) else _same_logits)


def _same_logits(expected: torch.Tensor, got: torch.Tensor) -> bool:
    return bool(torch.isfinite(got).all() and (expected - got).abs().max() <= 1e-3 * expected.abs().max() + 1e-4)


def _same_rounded_logits(expected: torch.Tensor, got: torch.Tensor) -> bool:
    """Products that round the activations: the two steps' inputs to a product may differ in their last bits (the
    norms sum in another order), which can move an int8 level; held to the tolerance the rounding paths have."""
    return bool(torch.isfinite(got).all() and (expected - got).abs().max() <= quant.ROUNDING_TOLERANCE * expected.abs().max() + 1e-4)


def describe(model: Transformer | None = None) -> str:
    """One line: what decodes one row of `model` on the CPU (or, without a model, whether the C step can
    run here at all). Builds, checks and measures now, so that none of it happens inside a timed step."""
    off = native.turned_off()
    if off:
        return f"PyTorch's step ({off})"
    library = native.library()
    if library is None:
        return f"PyTorch's step (no C code: {native.problem()})"
    if not _verified(library, quantized=model is not None and is_quantized(model)):
        return "PyTorch's step (the C decoder step disagreed with PyTorch on the check models)"
    if model is None:
        return "tfcli's C decoder step (native.c), where a model's shape measures faster with it"
    with torch.inference_mode():
        reason = unsupported(model, KVCache(model.config, 1, min(model.config.block_size, TIMED_STEPS), torch.float32))
    if reason is not None:
        return f"PyTorch's step ({reason})"
    choice = choose(library, model)
    seconds = choices.choices().decisions[_shape_key(model)].seconds
    if TORCH in seconds and NATIVE in seconds:
        ratio = seconds[TORCH] / seconds[NATIVE]
        measured = f"{ratio:.2f}x PyTorch's speed" if choice == NATIVE else f"the C step ran at {ratio:.2f}x its speed"
    else:
        measured = choices.choices().decisions[_shape_key(model)].note or "not measured"
    return f"tfcli's C decoder step (native.c; {measured})" if choice == NATIVE else f"PyTorch's step ({measured})"


def _agrees(library: native.NativeLibrary, settings: dict) -> bool:
    """Four tokens after a three-token prefix: the C step's logits against the same model's full forward,
    in fp32 whatever the caller's default dtype or autocast, and without touching its random numbers."""
    config = preset("tiny", vocab_size=37, block_size=12, n_layers=2, d_ff=40, **settings)
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]), torch.inference_mode(), torch.autocast("cpu", enabled=False):
        model = Transformer(config).float().eval()
        for parameter in model.parameters():  # a trained model's scale, not the initial 0.02
            parameter.normal_(0.0, 0.3, generator=generator)
        ids = torch.randint(0, config.vocab_size, (1, 7), generator=generator)
        expected = model(ids).logits[0, 3:]  # (4, vocab)
        cache = KVCache(config, 1, config.block_size, torch.float32)
        model.decode(ids[:, :3], cache=cache)
        step = NativeDecoderStep(library, model, cache)
        got = torch.cat([step(int(token)) for token in ids[0, 3:]])
        return bool(torch.allclose(got, expected, rtol=1e-3, atol=1e-3))


# The quantized check model: every block format in one decoder (q8_0 embedding, q4_0 q/k/v, q4_K out, q6_K gate/up,
# bf16 down, an untied q8_0 head), each product by the portable build (fp32 sums: no rounding), held to the model's
# own forward over the dequantized weights as tightly as the fp32 check.
QUANT_CHECK_FORMATS = {"tok_emb": "q8_0", "attn.qkv": "q4_0", "attn.out": "q4_K", "mlp.fc": "q6_K", "mlp.proj": "bf16", "lm_head": "q8_0"}


def _quantized_check_model(generator: torch.Generator) -> Transformer:
    """A small Llama-shaped decoder (GQA, rmsnorm, SwiGLU, rotary) whose matrices are QUANT_CHECK_FORMATS' blocks,
    with no kernel attached (the PyTorch step multiplies the dequantized weights)."""
    config = preset(
        "tiny", vocab_size=37, block_size=12, n_layers=2, d_model=256, n_heads=4, n_kv_heads=2, d_ff=256, positions="rotary", norm="rmsnorm"
    ).with_overrides(activation="swiglu", bias=False, tie_embeddings=False)
    model = Transformer(config).float().eval()
    for parameter in model.parameters():
        parameter.normal_(0.0, 0.3, generator=generator)

    def blocks_of(weight: torch.Tensor, fmt: str) -> Blocks:
        return Blocks(torch.from_numpy(quantize(weight.detach().numpy(), fmt)), fmt, tuple(weight.shape))

    model.tok_emb = QuantEmbedding(blocks_of(model.tok_emb.weight, QUANT_CHECK_FORMATS["tok_emb"]))
    model.lm_head = QuantLinear(blocks_of(model.lm_head.weight, QUANT_CHECK_FORMATS["lm_head"]))
    for block in model.decoder.blocks:
        for name in ("attn.qkv", "attn.out", "mlp.fc", "mlp.proj"):
            parent, child = name.split(".")
            setattr(getattr(block, parent), child, QuantLinear(blocks_of(block.get_submodule(name).weight, QUANT_CHECK_FORMATS[name])))
    return model


def _agrees_quantized(library: native.NativeLibrary) -> bool:
    """The C step over every block format (the portable products, the C dequantizer) against the model's own
    forward, as `_agrees` holds the fp32 step."""
    portable, dequantizer = quant.kernel("portable"), quant.step_dequantizer()
    if portable is None or dequantizer is None:
        return False
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]), torch.inference_mode(), torch.autocast("cpu", enabled=False):
        model = _quantized_check_model(generator)
        ids = torch.randint(0, model.config.vocab_size, (1, 7), generator=generator)
        expected = model(ids).logits[0, 3:]  # (4, vocab)
        cache = KVCache(model.config, 1, model.config.block_size, torch.float32)
        model.decode(ids[:, :3], cache=cache)
        step = NativeDecoderStep(library, model, cache, product=lambda layer: quant.address(portable), dequantizer=dequantizer)
        got = torch.cat([step(int(token)) for token in ids[0, 3:]])
        return bool(torch.allclose(got, expected, rtol=1e-3, atol=1e-3))
