"""Compiled decoding: torch.compile over the model's one-row decoding step on the static KV cache, a
candidate beside PyTorch's step and the C step (`decode_step.py`), used only where a stored measurement
found it the fastest of the three.

The step is `Transformer.decode_masked` and the head over one token, whose shapes are the same at every step
(the cache is read whole through its length mask), so it compiles to one graph per model shape: the cache's
capacity is a dynamic dimension, the token and its column are tensors. Compiling takes seconds to a minute,
so nothing compiles on a first call: `tune` (run by `tfcli bench generate`) compiles the step, reports how
long that took, times it beside the other two on the model and records the decision; `bind` hands a window
the compiled step only where that decision chose it. Inductor's own cache is kept under tfcli's cache folder
(`TORCHINDUCTOR_CACHE_DIR`, unless already set), so a later process loads the compiled code instead of
compiling again. On a GPU the step compiles with mode="reduce-overhead" (CUDA graphs over the cache, whose
buffers keep their addresses); that path has not yet run on a GPU.
"""

from __future__ import annotations

import os
import threading
import time

import torch

from tfcli.accel import choices, decode_step, native
from tfcli.accel.build import kernel_folder
from tfcli.model.attention import AttentionMask, KVCache
from tfcli.model.hook_point import any_hooked
from tfcli.model.transformer import Transformer

COMPILED = "compiled"
TIMED_STEPS = 8  # each candidate decodes this many tokens from an empty cache, in turns (as decode_step's choice)

_lock = threading.Lock()
_functions: dict[str, object] = {}  # one compiled function per mode: torch's own cache holds a graph per model shape under it
compile_seconds: dict[str, float] = {}  # per shape key: how long this process took to compile (or load) the step


def _step(model: Transformer, ids: torch.Tensor, slot: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The next-token logits (1, vocab) after ids (1, 1), its key and value written to column slot (1,) of
    the cache buffers (L, 1, n_kv, S, hs): what compiles."""
    cache = KVCache.over(keys, values, [None] * keys.shape[0], 0, read_block=None)  # read whole: one shape at every step
    hidden = model.decode_masked(ids, AttentionMask.over_cache(slot, keys.shape[3]), cache=cache)  # (1, 1, d)
    return model.unembed(hidden[:, -1])  # (1, vocab)


def mode_for(device: torch.device) -> str:
    """torch.compile's mode for the device: CUDA graphs on a GPU (launches cost more than a small step's work)."""
    return "reduce-overhead" if device.type == "cuda" else "default"


def compiled_function(device: torch.device):
    """`_step` compiled for the device (CUDA graphs on a GPU); compiling happens at its first call per shape."""
    mode = mode_for(device)
    with _lock:
        if mode not in _functions:
            folder = kernel_folder()
            if folder is not None:
                os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
            _functions[mode] = torch.compile(_step, mode=mode, fullgraph=True)
        return _functions[mode]


def unsupported(model: Transformer, cache: KVCache | None) -> str | None:
    """Why the compiled step cannot decode this model over this cache, or None when it can."""
    if model.config.arch != "decoder":
        return f"the compiled step runs decoders, not {model.config.arch} models"
    if cache is None or cache.keys.shape[1] != 1:
        return "the compiled step decodes one row with a KV cache"
    if cache.capacity < 2:
        return "the cache is too short to compile for"
    if not decode_step.plain_mode():
        return "gradients, autocast, torch.compile and torch.jit need PyTorch's step"
    if any(module.training for module in model.modules()):
        return "the model is in training mode"
    if cache.keys.device != next(model.parameters()).device:
        return "the cache and the model are on different devices"
    return None


class CompiledDecoderStep:
    """Runs one token through `model` after the tokens in `cache` with the compiled step, writing its key and
    value there; the same interface as `decode_step.NativeDecoderStep` (`usable`, a call per token). Where
    this process has not compiled the shape yet, a thread compiles it on a scratch cache of the same shape
    (`background`) and `usable` stays False until it is done: the window decodes with PyTorch's step over the
    same cache meanwhile, so the first token never waits for the compiler."""

    def __init__(self, model: Transformer, cache: KVCache, *, background: bool = True) -> None:
        self.model, self.cache = model, cache
        self.vocab = model.config.vocab_size
        device = cache.keys.device
        self.function = compiled_function(device)
        self.key = shape_key(model)
        self.cuda = device.type == "cuda"
        self.ids, self.slot = self._inputs(cache)
        self.ready = threading.Event()
        self.problem: str | None = None  # why compiling failed (the step is then never used)
        if not background or self.key in compile_seconds:
            self.ready.set()
        else:
            threading.Thread(target=self._compile, name="tfcli-compile-step", daemon=True).start()

    def _inputs(self, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """The token (1, 1) and its column (1,) as tensors, so that a new value never makes a new graph."""
        device = cache.keys.device
        ids, slot = torch.zeros(1, 1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device)
        for buffer in (cache.keys, cache.values):
            torch._dynamo.mark_dynamic(buffer, 3)  # (L, 1, n_kv, S, hs): one graph for every capacity S
        if self.cuda:
            for buffer in (cache.keys, cache.values, ids, slot):
                torch._dynamo.mark_static_address(buffer)  # captured by CUDA graphs: written in place, never moved
        return ids, slot

    def _compile(self) -> None:
        """Compile (or load from inductor's cache) the step for this shape on a scratch cache, then mark ready."""
        try:
            keys = self.cache.keys
            scratch = KVCache.over(torch.zeros_like(keys), torch.zeros_like(keys), [None] * keys.shape[0], 0)
            ids, slot = self._inputs(scratch)
            started = time.perf_counter()
            with torch.inference_mode():
                self.function(self.model, ids, slot, scratch.keys, scratch.values)
            compile_seconds.setdefault(self.key, time.perf_counter() - started)
            self.ready.set()
        except Exception as error:  # the plain step goes on decoding
            self.problem = f"{type(error).__name__}: {error}"

    def usable(self) -> bool:
        """Compiled, and as the C step: not while gradients, autocast or tracing are on, nor while a hook
        point has a hook."""
        return self.ready.is_set() and decode_step.plain_mode() and not any_hooked()

    def __call__(self, token: int) -> torch.Tensor:
        """The next-token logits (1, vocab) after `token`; the cache grows by one position."""
        position = self.cache.length
        if not 0 <= token < self.vocab or not 0 <= position < self.cache.capacity:
            raise ValueError(f"token {token} at position {position} is outside the model's vocabulary or the cache")
        self.ids.fill_(token)
        self.slot.fill_(position)
        started = time.perf_counter()
        logits = self.function(self.model, self.ids, self.slot, self.cache.keys, self.cache.values)
        compile_seconds.setdefault(self.key, time.perf_counter() - started)  # a first call without `background`
        self.cache.advance(1)
        return logits.clone() if self.cuda else logits  # CUDA graphs reuse their output buffer at the next step


def shape_key(model: Transformer) -> str:
    weight = next(model.parameters())  # not lm_head.weight: a quantized head dequantizes on each read
    return f"compiled-step {weight.device.type} {str(weight.dtype).removeprefix('torch.')} " + decode_step._shape_key(model.config)


def bind(model: Transformer, cache: KVCache, *, force: bool = False) -> CompiledDecoderStep | decode_step.NativeDecoderStep | None:
    """The step a window decodes one row with: the compiled one where the stored decision for this shape
    chose it (or `force`, as `tfcli bench generate` times it), else the C step where it binds, else None
    (PyTorch's step). Never compiles to decide."""
    if unsupported(model, cache) is None:
        if force or chosen(model):
            return CompiledDecoderStep(model, cache)
    return None if force else decode_step.NativeDecoderStep.bind(model, cache)


@torch.inference_mode()
def tune(model: Transformer, capacity: int) -> choices.Decision:
    """Compile the step for this model's shape (the time it took is the decision's compile_seconds), time it
    beside PyTorch's step and the C step (where it applies) over a cache of `capacity` columns, and record
    which was fastest; a decision already recorded for the shape is returned as it is."""
    key = shape_key(model)
    store = choices.choices()
    known = store.get(key, (decode_step.TORCH, decode_step.NATIVE, COMPILED))
    if known is not None:
        return known
    config, device = model.config, next(model.parameters()).device
    capacity = max(2, min(config.block_size, capacity))
    dtype = next(model.parameters()).dtype
    tokens = [(7 * i + 1) % config.vocab_size for i in range(min(TIMED_STEPS, capacity))]
    problem = unsupported(model, KVCache(config, 1, capacity, dtype, device))
    if problem is not None:
        raise ValueError(problem)

    def pytorch_steps() -> torch.Tensor:
        cache = KVCache(config, 1, capacity, dtype, device)
        return torch.cat([model.unembed(model.decode(torch.tensor([[token]], device=device), cache=cache)[:, -1]) for token in tokens]).float()

    def compiled_steps() -> torch.Tensor:
        step = CompiledDecoderStep(model, KVCache(config, 1, capacity, dtype, device), background=False)
        return torch.cat([step(token) for token in tokens]).float()

    candidates = {decode_step.TORCH: pytorch_steps}
    library = native.library() if device.type == "cpu" else None
    if library is not None and decode_step._verified(library) and decode_step.unsupported(model, KVCache(config, 1, capacity, dtype)) is None:

        def c_steps() -> torch.Tensor:
            step = decode_step.NativeDecoderStep(library, model, KVCache(config, 1, capacity, torch.float32))
            return torch.cat([step(token) for token in tokens])

        candidates[decode_step.NATIVE] = c_steps
    candidates[COMPILED] = compiled_steps
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.perf_counter()
    problem = ""
    try:
        compiled_steps()  # the first call compiles (or loads what an earlier process compiled)
        sync()
    except Exception as error:  # a model torch.compile cannot take whole (a module calling C code): the others compete
        del candidates[COMPILED]
        problem = f"{COMPILED} did not compile ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
    compiled_in = time.perf_counter() - started
    decision = choices.measure(candidates, decode_step._same_logits, sync=sync)
    decision.note = "; ".join(note for note in (decision.note, problem) if note)
    decision.compile_seconds = float(f"{compiled_in:.3g}") if not problem else 0.0
    store.record(key, decision)
    return decision


@torch.inference_mode()
def warm(model: Transformer, capacity: int) -> float:
    """Compile (or load from inductor's cache) the step for this model's shape now, before any clock starts;
    the seconds it took (0.0 where this process has it already)."""
    key = shape_key(model)
    if key in compile_seconds:
        return 0.0
    config, weight = model.config, next(model.parameters())
    step = CompiledDecoderStep(model, KVCache(config, 1, max(2, min(config.block_size, capacity)), weight.dtype, weight.device), background=False)
    step(0)
    return compile_seconds[key]


def chosen(model: Transformer) -> bool:
    """Whether the stored decision for this model's shape chose the compiled step."""
    return choices.choices().get(shape_key(model), (COMPILED,)) is not None


def describe(model: Transformer) -> str:
    """One line: what decodes one row of `model` here, the compiled step included (see `decode_step.describe`)."""
    decision = choices.choices().get(shape_key(model), (decode_step.TORCH, decode_step.NATIVE, COMPILED))
    if decision is None or decision.choice != COMPILED:
        return decode_step.describe(model)
    seconds = decision.seconds
    others = ", ".join(f"{name} {seconds[name] / seconds[COMPILED]:.2f}x its time" for name in seconds if name != COMPILED)
    return f"the step compiled by torch.compile ({mode_for(next(model.parameters()).device)} mode; {others}; compiled in {decision.compile_seconds:.1f} s)"
