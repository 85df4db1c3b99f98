"""Compiled decoding: torch.compile over the model's decoding step on the static KV cache, for one row
(generate's window) and for the rows of serve's continuous batch, a candidate beside PyTorch's step (and, for
one row, the C step, `decode_step.py`), used only where a stored measurement found it the fastest.

The step is `Transformer.decode_masked` and the head over one token per row, whose shapes are the same at
every step (the cache is read whole through its length mask; the batch's rows, left-padded to one column,
through their padding too), so it compiles to one graph per model shape and row count: the cache's capacity
is a dynamic dimension, the tokens, their column, positions and padding are tensors written in place. A
batch step runs every row the batch has, in use or not (one shape at every step, whatever the rows in use),
and is tuned at a full batch. Compiling takes seconds to a minute, so nothing compiles on a first call:
`tune` (run by `tfcli bench generate`) and `tune_rows` (run by `tfcli bench serve`) compile the step, report
how long that took, time it beside the others and record the decision; `bind` and `bind_rows` hand a window
or a batch the compiled step only where that decision chose it, and it compiles in a thread while PyTorch's
step decodes. Inductor's own cache is kept under tfcli's cache folder (`TORCHINDUCTOR_CACHE_DIR`, unless
already set), so a later process loads the compiled code instead of compiling again. On a GPU the step
compiles with mode="reduce-overhead" (CUDA graphs over the cache and the step's inputs, whose buffers keep
their addresses: `mark_static_address`, unguarded, so a window's new buffers re-record the graph instead of
compiling it again); torch keeps CUDA graph trees per thread, and each thread that runs the step gets that
state first (`_cuda_graphs_on_this_thread`). That path has not yet run on a GPU (`scripts/gpu_check.sh` runs it).
"""

from __future__ import annotations

import abc
import collections
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


def _step(
    model: Transformer,
    ids: torch.Tensor,
    slot: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    real: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The next-token logits (R, vocab) after ids (R, 1), their keys and values written to column slot (1,)
    of the cache buffers (L, R, n_kv, S, hs): what compiles. real (R, S), for rows left-padded to one column
    (serve's batch): True where a column holds a row's real token; positions (R, 1): each row's own position
    (default: the column)."""
    cache = KVCache.over(keys, values, [None] * keys.shape[0], 0, read_block=None)  # read whole: one shape at every step
    mask = AttentionMask.over_cache(slot, keys.shape[3], key_padding=real, positions=positions)  # (R or 1, 1, 1, S)
    hidden = model.decode_masked(ids, mask, cache=cache)  # (R, 1, d)
    return model.unembed(hidden[:, -1])  # (R, vocab)


def mode_for(device: torch.device) -> str:
    """torch.compile's mode for the device: CUDA graphs on a GPU (launches cost more than a small step's work).
    Example: mode_for(torch.device("cuda", 0)) -> "reduce-overhead"; mode_for(torch.device("cpu")) -> "default" """
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


def _cuda_graphs_on_this_thread() -> None:
    """Give this thread the state torch's CUDA graph trees keep per thread. torch before the fix of
    pytorch#123177 (mid-2026) sets it up only on the thread that imported them and fails with a bare
    AssertionError on any other: the compile thread, serve's engine thread. Later torch sets it up itself
    (then this does nothing)."""
    from torch._inductor import cudagraph_trees  # noqa: PLC0415  inductor's, imported only where a GPU runs the step

    local = cudagraph_trees.local
    if hasattr(local, "tree_manager_containers") or torch._C._is_key_in_tls("tree_manager_containers"):
        return
    local.tree_manager_containers = {}
    local.tree_manager_locks = collections.defaultdict(threading.Lock)
    torch._C._stash_obj_in_tls("tree_manager_containers", local.tree_manager_containers)
    torch._C._stash_obj_in_tls("tree_manager_locks", local.tree_manager_locks)


def _model_problem(model: Transformer, cache: KVCache) -> str | None:
    """Why no compiled step can decode `model` over `cache` (one row or many), or None."""
    if model.config.arch != "decoder":
        return f"the compiled step runs decoders, not {model.config.arch} models"
    if cache.capacity < 2:
        return "the cache is too short to compile for"
    if any(module.training for module in model.modules()):
        return "the model is in training mode"
    if cache.keys.device != next(model.parameters()).device:
        return "the cache and the model are on different devices"
    return None


def unsupported(model: Transformer, cache: KVCache | None) -> str | None:
    """Why the compiled step cannot decode this model over this cache one row at a time, or None when it can."""
    if model.config.arch != "decoder":
        return f"the compiled step runs decoders, not {model.config.arch} models"
    if cache is None or cache.keys.shape[1] != 1:
        return "the compiled step decodes one row with a KV cache"
    if not decode_step.plain_mode():
        return "gradients, autocast, torch.compile and torch.jit need PyTorch's step"
    return _model_problem(model, cache)


def unsupported_rows(model: Transformer, cache: KVCache) -> str | None:
    """Why the compiled batch step cannot decode this model over this cache of many rows, or None when it can
    (serve's batch is made outside inference mode: the mode is checked at every step, `usable`)."""
    return _model_problem(model, cache)


class _CompiledStep(abc.ABC):
    """What the one-row and the batch step share: the compiled function, the shape's key, and compiling in a
    thread on scratch buffers of the same shape (`background`): `usable` stays False until it is done, and
    the caller decodes with PyTorch's step over the same cache meanwhile, so a first call never waits for the
    compiler. A subclass makes its inputs (`_inputs`: tensors written in place before each call)."""

    def __init__(self, model: Transformer, cache: KVCache, key: str, *, background: bool) -> None:
        self.model, self.cache, self.key = model, cache, key
        self.vocab = model.config.vocab_size
        device = cache.keys.device
        self.function = compiled_function(device)
        self.cuda = device.type == "cuda"
        with torch.inference_mode(cache.keys.is_inference()):  # as the cache: dynamo compiles inference tensors apart
            self.args = self._inputs(cache.keys, cache.values)
        self.ready = threading.Event()
        self.problem: str | None = None  # why compiling failed (the step is then never used)
        if not background or self.key in compile_seconds:
            self.ready.set()
        else:
            threading.Thread(target=self._compile, name="tfcli-compile-step", daemon=True).start()

    @abc.abstractmethod
    def _inputs(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step's arguments after the model: tensors the call fills in place, so a new value never makes a
        new graph (one row: ids, slot, keys, values)."""

    def _mark(self, buffers: tuple[torch.Tensor, ...], capacity_dims: dict[int, int]) -> None:
        """The cache's capacity dynamic (buffer index -> its dimension), every buffer at a fixed address on a GPU."""
        for index, dim in capacity_dims.items():
            torch._dynamo.mark_dynamic(buffers[index], dim)  # one graph for every capacity S
        if self.cuda:
            for buffer in buffers:
                # captured by CUDA graphs: written in place, never moved; unguarded, so another buffer of the same
                # shape (the next window's) re-records the graph rather than compiling it again
                torch._dynamo.mark_static_address(buffer, guard=False)

    def _compile(self) -> None:
        """Compile (or load from inductor's cache) the step for this shape on a scratch cache, then mark ready."""
        try:
            keys = self.cache.keys
            with torch.inference_mode(keys.is_inference()):  # the scratch buffers as the real ones, or the real ones compile again
                args = self._inputs(torch.zeros_like(keys), torch.zeros_like(keys))
            if self.cuda:
                _cuda_graphs_on_this_thread()
            started = time.perf_counter()
            with torch.inference_mode():
                self.function(self.model, *args)
            compile_seconds.setdefault(self.key, time.perf_counter() - started)
            self.ready.set()
        except Exception as error:  # the plain step goes on decoding
            self.problem = f"{type(error).__name__}: {error}"

    def usable(self) -> bool:
        """Compiled, and as the C step: not while gradients, autocast or tracing are on, nor while a hook
        point has a hook."""
        return self.ready.is_set() and decode_step.plain_mode() and not any_hooked()

    def _run(self) -> torch.Tensor:
        if self.cuda:
            _cuda_graphs_on_this_thread()
        started = time.perf_counter()
        logits = self.function(self.model, *self.args)
        compile_seconds.setdefault(self.key, time.perf_counter() - started)  # a first call without `background`
        return logits.clone() if self.cuda else logits  # CUDA graphs reuse their output buffer at the next step


class CompiledDecoderStep(_CompiledStep):
    """Runs one token through `model` after the tokens in `cache` (one row) with the compiled step, writing
    its key and value there; the same interface as `decode_step.NativeDecoderStep` (`usable`, a call per token)."""

    def __init__(self, model: Transformer, cache: KVCache, *, background: bool = True) -> None:
        super().__init__(model, cache, shape_key(model), background=background)
        self.ids, self.slot = self.args[0], self.args[1]

    def _inputs(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        device = keys.device
        ids, slot = torch.zeros(1, 1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device)  # (1, 1), (1,)
        args = (ids, slot, keys, values)
        self._mark(args, {2: 3, 3: 3})  # keys, values (L, 1, n_kv, S, hs)
        return args

    def __call__(self, token: int) -> torch.Tensor:
        """The next-token logits (1, vocab) after `token`; the cache grows by one position."""
        position = self.cache.length
        if not 0 <= token < self.vocab or not 0 <= position < self.cache.capacity:
            raise ValueError(f"token {token} at position {position} is outside the model's vocabulary or the cache")
        self.ids.fill_(token)
        self.slot.fill_(position)
        logits = self._run()
        self.cache.advance(1)
        return logits


class CompiledBatchStep(_CompiledStep):
    """serve's continuous batch step compiled: one token for each row of a (L, R, n_kv, S, hs) cache whose
    rows are left-padded to one shared column, `real` (R, S) their real columns (the batch's own buffer, read
    in place). Every one of the R rows runs, in use or not: the rows past those in use compute what nobody
    reads (their cache rows past the shared column are rewritten before any row reads them)."""

    def __init__(self, model: Transformer, cache: KVCache, real: torch.Tensor, *, background: bool = True) -> None:
        self.real = real
        super().__init__(model, cache, rows_key(model, cache.keys.shape[1]), background=background)
        self.ids, self.slot, self.positions = self.args[0], self.args[1], self.args[5]

    def _inputs(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows, device = keys.shape[1], keys.device
        ids = torch.zeros(rows, 1, dtype=torch.long, device=device)  # (R, 1)
        slot = torch.zeros(1, dtype=torch.long, device=device)  # (1,)
        positions = torch.zeros(rows, 1, dtype=torch.long, device=device)  # (R, 1)
        real = self.real if keys is self.cache.keys else torch.ones_like(self.real)  # (R, S): a scratch cache has its own
        args = (ids, slot, keys, values, real, positions)
        self._mark(args, {2: 3, 3: 3, 4: 1})  # keys, values (L, R, n_kv, S, hs), real (R, S)
        return args

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        """The logits (B, vocab) after tokens (B,) in the first B rows at their positions (B,), their keys and
        values written to `column` (the batch has already marked it real for those rows)."""
        B = tokens.shape[0]
        if not 0 <= column < self.cache.capacity or B > self.ids.shape[0]:
            raise ValueError(f"{B} rows at column {column} do not fit a batch of {self.ids.shape[0]} rows and {self.cache.capacity} columns")
        self.ids[:B, 0] = tokens
        self.ids[B:] = 0
        self.positions[:B, 0] = positions
        self.positions[B:] = 0  # rows not in use: a position every table has
        self.slot.fill_(column)
        return self._run()[:B]


def shape_key(model: Transformer) -> str:
    weight = next(model.parameters())  # not lm_head.weight: a quantized head dequantizes on each read
    return f"compiled-step {weight.device.type} {str(weight.dtype).removeprefix('torch.')} " + decode_step._shape_key(model)


def bind(model: Transformer, cache: KVCache, *, force: bool = False) -> CompiledDecoderStep | decode_step.NativeDecoderStep | None:
    """The step a window decodes one row with: the compiled one where the stored decision for this shape
    chose it (or `force`, as `tfcli bench generate` times it), else the C step where it binds, else None
    (PyTorch's step). Never compiles to decide."""
    if unsupported(model, cache) is None:
        if force or chosen(model):
            return CompiledDecoderStep(model, cache)
    return None if force else decode_step.NativeDecoderStep.bind(model, cache)


def rows_key(model: Transformer, rows: int) -> str:
    """The decision's name for the batch step of `rows` rows (a shape of its own: every row runs at every step)."""
    weight = next(model.parameters())
    return f"compiled-rows{rows} {weight.device.type} {str(weight.dtype).removeprefix('torch.')} " + decode_step._shape_key(model)


def bind_rows(model: Transformer, cache: KVCache, real: torch.Tensor, *, force: bool = False) -> CompiledBatchStep | None:
    """The compiled step for serve's batch over `cache` (L, R, n_kv, S, hs) with its real columns `real`
    (R, S), where the stored decision for R rows of this shape chose it (or `force`), else None (PyTorch's
    step). Never compiles to decide; what it returns compiles in a thread (`usable` once done)."""
    if unsupported_rows(model, cache) is None and (force or chosen_rows(model, cache.keys.shape[1])):
        return CompiledBatchStep(model, cache, real)
    return None


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

    compiled = CompiledDecoderStep(
        model, KVCache(config, 1, capacity, dtype, device), background=False
    )  # one set of buffers (CUDA graphs keep their addresses)

    def compiled_steps() -> torch.Tensor:
        compiled.cache.length = 0  # from an empty cache again: each column is written before it is read
        return torch.cat([compiled(token) for token in tokens]).float()

    candidates = {decode_step.TORCH: pytorch_steps}
    library = native.library() if device.type == "cpu" else None
    if library is not None and decode_step.unsupported(model, KVCache(config, 1, capacity, dtype)) is None and decode_step._verified(library):

        def c_steps() -> torch.Tensor:
            step = decode_step.NativeDecoderStep(library, model, KVCache(config, 1, capacity, torch.float32))
            return torch.cat([step(token) for token in tokens])

        candidates[decode_step.NATIVE] = c_steps
    return _tune_and_record(key, candidates, compiled_steps, device, dtype)


@torch.inference_mode()
def tune_rows(model: Transformer, rows: int, capacity: int | None = None) -> choices.Decision:
    """The batch step's tuning, as `tune` for one row: compile the step for `rows` rows of this shape, time it
    beside PyTorch's batch step (as serve's batch runs it: the cache read in blocks, the rows in use only) over
    rows of different lengths, left-padded to one column, in a cache of `capacity` columns (default the
    context, as serve's batch has it), and record the faster; a decision already recorded is returned as it is."""
    key = rows_key(model, rows)
    store = choices.choices()
    known = store.get(key, (decode_step.TORCH, COMPILED))
    if known is not None:
        return known
    config, weight = model.config, next(model.parameters())
    device, dtype = weight.device, weight.dtype
    capacity = config.block_size if capacity is None else max(2, min(config.block_size, capacity))
    lengths = [1 + (3 * r) % max(1, min(8, capacity // 2)) for r in range(rows)]  # each row's prompt: 1 to 8 tokens
    start = max(lengths)
    steps = min(TIMED_STEPS, capacity - start)
    tokens = [torch.tensor([(7 * (t + r) + 1) % config.vocab_size for r in range(rows)], device=device) for t in range(steps)]
    problem = unsupported_rows(model, KVCache(config, rows, capacity, dtype, device))
    if problem is not None or steps < 1:
        raise ValueError(problem or "the cache is too short to time a step")

    def fresh(real: torch.Tensor) -> torch.Tensor:
        """The rows' prompts marked real (their keys and values are the cache's zeros), their lengths (R,)."""
        real.zero_()
        for r, length in enumerate(lengths):
            real[r, start - length : start] = True
        return torch.tensor(lengths, device=device)

    plain_cache, plain_real = KVCache(config, rows, capacity, dtype, device), torch.zeros(rows, capacity, dtype=torch.bool, device=device)

    def pytorch_steps() -> torch.Tensor:
        n_real, out = fresh(plain_real), []
        for t, ids in enumerate(tokens):
            column = start + t
            plain_real[:, column] = True
            view = KVCache.over(plain_cache.keys, plain_cache.values, plain_cache.cross, column)
            hidden = model.decode(ids.unsqueeze(1), plain_real[:, : column + 1], cache=view, positions=n_real.unsqueeze(1))  # (R, 1, d)
            out.append(model.unembed(hidden[:, -1]))
            n_real += 1
        return torch.cat(out).float()

    real = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
    compiled = CompiledBatchStep(model, KVCache(config, rows, capacity, dtype, device), real, background=False)

    def compiled_steps() -> torch.Tensor:
        n_real, out = fresh(real), []
        for t, ids in enumerate(tokens):
            real[:, start + t] = True
            out.append(compiled(ids, n_real, start + t))
            n_real += 1
        return torch.cat(out).float()

    return _tune_and_record(key, {decode_step.TORCH: pytorch_steps}, compiled_steps, device, dtype)


HALF_TOLERANCE = 5e-2  # a 16-bit step's logits against PyTorch's: this share of the largest (see `same_logits`)


def same_logits(dtype: torch.dtype):
    """The test the compiled step's logits must pass against PyTorch's step: decode_step's for fp32 models;
    for a model in bf16 or fp16 (a GPU decodes in bf16), within HALF_TOLERANCE of the largest logit, since
    PyTorch rounds to 16 bits after every operation where a compiled kernel keeps fp32 inside what it fuses
    (bf16 against fp32 differed by 0.4% of the largest logit at tiny, 0.7% at small): decode_step's 0.1%
    would refuse a correct step, and a wrong one is off by about the logits themselves."""
    if dtype not in (torch.bfloat16, torch.float16):
        return decode_step._same_logits

    def close(expected: torch.Tensor, got: torch.Tensor) -> bool:
        return bool(torch.isfinite(got).all() and (expected - got).abs().max() <= HALF_TOLERANCE * expected.abs().max() + 1e-3)

    return close


def _tune_and_record(key: str, candidates: dict, compiled_steps, device: torch.device, dtype: torch.dtype) -> choices.Decision:
    """Compile (the first call of `compiled_steps`), then time the compiled candidate beside the others and
    record the decision with the compile time; a step that does not compile is left out, with a note."""
    candidates = {**candidates, COMPILED: compiled_steps}
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
    decision = choices.measure(candidates, same_logits(dtype), sync=sync)
    decision.note = "; ".join(note for note in (decision.note, problem) if note)
    decision.compile_seconds = float(f"{compiled_in:.3g}") if not problem else 0.0
    choices.choices().record(key, decision)
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


def chosen_rows(model: Transformer, rows: int) -> bool:
    """Whether the stored decision for serve's batch of `rows` rows of this model's shape chose the compiled step."""
    return choices.choices().get(rows_key(model, rows), (COMPILED,)) is not None


KEY_PREFIXES = ("compiled-step ", "compiled-rows")  # the decisions' names: one row (`shape_key`), a batch (`rows_key`)


def stored() -> dict[str, choices.Decision]:
    """The compiled steps' decisions measured on this machine (one row and serve's batches), by name."""
    return {key: decision for key, decision in sorted(choices.choices().decisions.items()) if key.startswith(KEY_PREFIXES)}
