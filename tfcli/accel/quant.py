"""Products with block-quantized weights (`tfcli.quant.linear.QuantLinear`) on the CPU: tfcli's C code
(`blocks.c`) built once per SIMD path, each checked against dequantize-then-matmul and chosen by measurement
like every other product (`choices.py`), PyTorch's product over the dequantized weight the reference.

The paths: `portable` (plain C), `avx2` (AVX2, FMA, F16C) and `avx512` (AVX-512 F/BW/VL) multiply fp32
activations; `avx512_vnni` rounds each input row to int8 blocks first, as llama.cpp does, and multiplies in
integers (bf16 weights keep the fp32 product there); `avx512_bf16` does the same and multiplies bf16 weights with
the activations rounded to bf16 (vdpbf16ps), as llama.cpp does; `avx2_int8` rounds as avx512_vnni does, with
AVX2's integer products (the avx2 build's second function), for processors without AVX-512. Each is a build of
the same source with its flags, tried only where this processor has its extensions. The fp32 paths are held to the
dequantized product (1e-4); the rounding ones to the same product over the rounded activations, and chosen over
the fp32 winner only within 2% of the product's largest value. `TFCLI_QUANT_PATH` forces one (portable, avx2,
avx2_int8, avx512, avx512_vnni, avx512_bf16, or torch for the dequantized product), for tests and for comparing
them; `TFCLI_ACCEL=0` loads a quantized run dequantized, so none of this runs.

On several threads a product's weight rows are split between them (native.c's `quant_parallel`, PyTorch's OpenMP
threads, as its fp32 products split them); blocks.c itself has no threads. The C decoder step (`decode_step.py`)
calls the same chosen function for each quantized matrix (`step_product`) and the same dequantizer for the token
embedding's row (`step_dequantizer`).

Trained over (QLoRA), a layer's forward product under autograd is `frozen_product`: the fp32 C paths measured
against the layer's slabs (W dequantized a slab at a time, each slab multiplied by `products`' measured dense
product, as the backward's grad_y W always is). The rounding paths are left out of that choice: the backward
differentiates the fp32 product, not the rounded one (TFCLI_QUANT_PATH still forces any path). blocks.c has no
transposed product (grad_y W over the blocks) for the backward: one would have to beat oneDNN over the dequantized
slabs, which beat the forward C product on an AVX-512 EPYC (13.5 against 19.3 ms, 2,048 rows x 512 x 1,536, q8_0).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from tfcli.accel import build, choices, native, products
from tfcli.accel.machine import vector_extensions
from tfcli.errors import TfcliError
from tfcli.quant.formats import FORMATS, quantize
from tfcli.quant.linear import QuantEmbedding, QuantLinear
from tfcli.quant.tensors import Blocks

SOURCE = Path(__file__).with_name("blocks.c")
TORCH = "torch"
PATHS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # path -> (compiler flags, the processor extensions it needs)
    "portable": (("-O3",), ()),
    "avx2": (("-O3", "-mavx2", "-mfma", "-mf16c"), ("avx2", "fma")),
    # the avx2 build's other product: int8 activations (vpmaddubsw), for a processor without AVX-512
    "avx2_int8": (("-O3", "-mavx2", "-mfma", "-mf16c"), ("avx2", "fma")),
    "avx512": (("-O3", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"), ("avx512f", "avx512bw")),
    # int8 activations, as llama.cpp multiplies: each input row rounded to q8_0 blocks, integer dot products (vpdpbusd)
    "avx512_vnni": (
        ("-O3", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni"),
        ("avx512f", "avx512bw", "avx512_vnni"),
    ),
    # the same, and bf16 weights times the activations rounded to bf16 (vdpbf16ps), as llama.cpp multiplies bf16
    "avx512_bf16": (
        ("-O3", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mavx512bf16"),
        ("avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"),
    ),
}
PATH_LEVEL = {"portable": 0, "avx2": 1, "avx2_int8": 1, "avx512": 2, "avx512_vnni": 3, "avx512_bf16": 4}  # quant_path()'s answer
BUILD = {"avx2_int8": "avx2"}  # a path that is another's build, its other product
ROUNDED = ("avx512_vnni", "avx512_bf16", "avx2_int8")  # they round the activations (int8 blocks; avx512_bf16: bf16 for bf16)
ROUNDING_TOLERANCE = 0.02  # how far from the fp32 product a rounded path's may be, of the product's largest value
FORMAT_CODE = {"q8_0": 0, "q4_0": 1, "q4_K": 2, "q6_K": 3, "bf16": 4}
MAX_ROWS = 16  # more input rows at once (a prompt) go through PyTorch over the dequantized weight
TRAINING_ROWS = 512  # a training product's choice is measured at most this many rows (both sides' times grow with them)
FORCE_VARIABLE = "TFCLI_QUANT_PATH"
KERNELS = "k2"  # in each decision's name: a machine's decisions about earlier kernels (k1: no tag) are measured again

_lock = threading.Lock()
_libraries: dict[str, object] = {}  # path -> ctypes function, or the reason it is not there (str)


class _Rounded:
    """The rounding builds' product: int8 activations for the integer formats; for bf16 the fp32 product
    (avx512_vnni) or bf16 activations (avx512_bf16). `formats[code]` is the C function for a format."""

    def __init__(self, fp32, rounded, bf16_rounded: bool) -> None:
        self.formats = {code: rounded for code in FORMAT_CODE.values()}
        if not bf16_rounded:
            self.formats[FORMAT_CODE["bf16"]] = fp32

    def __call__(self, code: int, *args) -> int:
        return self.formats[code](code, *args)


def rounds(path: str, fmt: str) -> bool:
    """`path` rounds the activations for weights in `fmt` (see rounded_activations)."""
    return path == "avx512_bf16" or (path in ROUNDED and fmt != "bf16")


def _rounding_candidate(fmt: str) -> list[str]:
    """The rounding path to measure for `fmt`, where one runs here: the int8 paths compute the same products, so
    only the widest (avx512_vnni, else avx2_int8; avx512_bf16's int8 product is avx512_vnni's); bf16 weights have
    avx512_bf16 alone."""
    order = ("avx512_bf16",) if fmt == "bf16" else ("avx512_vnni", "avx2_int8")
    return next(([path] for path in order if runnable(path) and kernel(path) is not None), [])


def rounded_activations(x: torch.Tensor, fmt: str = "q8_0") -> torch.Tensor:
    """x (m, k) as the rounded paths multiply it for weights in `fmt`: bf16 weights, each value rounded to bf16
    (to nearest, ties to even); the integer formats, each block of 32 values as int8 levels times an fp32 scale
    max|x| / 127 (q8_0's levels, its scale not rounded to fp16), halves to even."""
    if fmt == "bf16":
        return x.to(torch.bfloat16).float()
    blocks = x.reshape(x.shape[0], -1, 32)  # (m, k / 32, 32)
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127.0
    inverse = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(blocks * inverse).clamp(-127, 127) * d).reshape(x.shape)


def runnable(path: str) -> bool:
    """This processor has the extensions `path` is built for (x86: its flags)."""
    if path == "portable":
        return True
    flags = set(vector_extensions())
    return all(flag in flags for flag in PATHS[path][1])


def _load(library_path: Path):
    library = build.load_library(library_path)
    try:
        level, function, expand = library.quant_path, library.quant_linear, library.quant_dequantize
        rounded = library.quant_linear_int8
    except AttributeError as error:
        raise build.Unavailable(f"could not load {library_path.name}: {error}") from None
    level.restype, level.argtypes = ctypes.c_int, []
    for product_function in (function, rounded):
        product_function.restype = ctypes.c_int
        product_function.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long]
    expand.restype = ctypes.c_int
    expand.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long]
    _expand_functions[level()] = expand
    return level(), function, rounded


_expand_functions: dict[int, object] = {}  # quant_dequantize by the build's vector level (each gives ggml's values exactly)


def dequantizer():
    """The C dequantizer (blocks -> float32, value for value NumPy's and ggml's) of the widest SIMD built here,
    or None where no build loaded."""
    built = [PATH_LEVEL[path] for path in PATHS if kernel(path) is not None]
    return _expand if built and max(built) in _expand_functions else None


def _expand(blocks: Blocks) -> torch.Tensor:
    rows, columns = blocks.shape
    if columns % max(FORMATS[blocks.format].block_size, 32):
        return blocks.dequantized()
    data = blocks.data.contiguous()
    out = torch.empty(rows, columns, dtype=torch.float32)
    status = _expand_functions[max(_expand_functions)](FORMAT_CODE[blocks.format], data.data_ptr(), out.data_ptr(), rows, columns)
    assert status == 0, status
    return out


def kernel(path: str):
    """The C function `quant_linear` built for `path`, checked; None where it cannot be had here (`problem`)."""
    found = _libraries.get(path)
    if found is None:
        with _lock:
            if path not in _libraries:
                _libraries[path] = _build(path)
        found = _libraries[path]
    return None if isinstance(found, str) else found


def problem(path: str) -> str | None:
    """Why `path` has no kernel in this process, or None."""
    kernel(path)
    found = _libraries[path]
    return found if isinstance(found, str) else None


def _build(path: str):
    if not runnable(path):
        return f"this processor lacks {', '.join(PATHS[path][1])}"
    flags, _ = PATHS[path]
    try:
        level, function, rounded = build.obtain(build.Build(f"blocks-{BUILD.get(path, path)}", SOURCE, variants=(flags,)), _load)
    except build.Unavailable as reason:
        return str(reason)
    if level != PATH_LEVEL[path]:
        return f"the {path} build has vector level {level}, not {PATH_LEVEL[path]}"
    if path in ROUNDED:
        function = _Rounded(function, rounded, bf16_rounded=path == "avx512_bf16")
    for fmt in FORMAT_CODE:
        if not _agrees(function, fmt, rounded=rounds(path, fmt)):
            return f"the {path} build's {fmt} product disagreed with the dequantized product"
    return function


def _expands_as_numpy() -> bool:
    """The C dequantizer gives NumPy's values exactly, for every format (checked once, on random matrices)."""
    generator = torch.Generator().manual_seed(2)
    for fmt in FORMAT_CODE:
        weight = torch.randn(5, 512, generator=generator)
        blocks = Blocks(torch.from_numpy(quantize(weight.numpy(), fmt)), fmt, (5, 512))
        if not torch.equal(_expand(blocks), blocks.dequantized()):
            return False
    return True


def _agrees(function, fmt: str, rounded: bool = False) -> bool:
    """The kernel's product for random blocks equals dequantize-then-matmul's (fp32 sums in another order; for a
    path that rounds the activations, with the activations rounded as it rounds them)."""
    generator = torch.Generator().manual_seed(0)
    k = 2 * max(FORMATS[fmt].block_size, 32) * (4 if fmt in ("q8_0", "q4_0", "bf16") else 1)
    for m, n in ((1, 7), (3, 5), (11, 3)):
        weight = torch.randn(n, k, generator=generator)
        layer = QuantLinear(Blocks(torch.from_numpy(quantize(weight.numpy(), fmt)), fmt, (n, k)))
        x = torch.randn(m, k, generator=generator)
        if not close(F.linear(rounded_activations(x, fmt) if rounded else x, layer.dequantized()), run(function, layer, x)):
            return False
    return True


def close(expected: torch.Tensor, got: torch.Tensor) -> bool:
    """The same product up to fp32 rounding in another order of summation."""
    if expected.shape != got.shape or not torch.isfinite(got).all():
        return False
    return bool((expected - got).abs().max() <= 1e-4 * expected.abs().max() + 1e-5)


def run(function, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """x (m, k) fp32 contiguous times the layer's weight, by one built kernel: (m, n)."""
    code = FORMAT_CODE[layer.format]
    return _call(function.formats[code] if isinstance(function, _Rounded) else function, code, layer, x)


def _call(function, code: int, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """x (m, k) fp32 contiguous times the layer's weight by `function` (a C product for the format `code`), on
    PyTorch's threads: one calls it directly, several split the weight's rows (native.c's quant_parallel)."""
    m, n, k = x.shape[0], layer.out_features, layer.in_features
    y = torch.empty(m, n, dtype=torch.float32)
    threads = torch.get_num_threads()
    built = native.library() if threads > 1 else None
    if built is None:
        status = function(code, layer.blocks.data_ptr(), x.data_ptr(), y.data_ptr(), m, n, k)
    else:
        row_bytes = FORMATS[layer.format].row_bytes(k)
        status = built.quant_parallel(
            address(function), code, layer.blocks.data_ptr(), row_bytes, x.data_ptr(), y.data_ptr(), m, n, k, threads, native.PARALLEL_FROM
        )
    if status != 0:
        raise MemoryError(f"the {layer.format} product could not allocate its rounded activations (status {status})")
    return y


def address(function) -> int:
    """The address of a ctypes C function, for C code to call."""
    return ctypes.cast(function, ctypes.c_void_p).value


def forced() -> str | None:
    """The path TFCLI_QUANT_PATH forces, checked; None where it forces none."""
    value = os.environ.get(FORCE_VARIABLE, "").strip().lower()
    if not value:
        return None
    if value != TORCH and value not in PATHS:
        raise TfcliError(f"{FORCE_VARIABLE}={value!r} is not a path", hint=f"use one of torch, {', '.join(PATHS)}, or unset it")
    if value != TORCH and kernel(value) is None:
        raise TfcliError(f"{FORCE_VARIABLE}={value}: that path cannot run here ({problem(value)})", hint="unset it to let tfcli choose")
    return value


def _rows_class(m: int) -> int:
    return 1 if m <= 1 else 1 << (m - 1).bit_length()


_decided: dict[tuple, str] = {}


def choose(layer: QuantLinear, m: int) -> str:
    """The path for this layer's product with m input rows: forced, or measured once per format, shape class
    and thread count (remembered in the decisions file)."""
    path = forced()
    if path is not None:
        return path
    rows = _rows_class(m)
    fits = layer.in_features % max(FORMATS[layer.format].block_size, 32) == 0
    if rows > MAX_ROWS or not fits:
        return TORCH
    memo = (layer.format, rows, layer.out_features, layer.in_features, torch.get_num_threads())
    if memo in _decided:
        return _decided[memo]
    exact = [TORCH] + [path for path in PATHS if path not in ROUNDED and kernel(path) is not None]
    best = _decide(f"quant {layer.format}", layer, rows, exact, close)
    rounded = _rounding_candidate(layer.format)
    if rounded:  # then the fp32 product's winner against rounding the activations, to the rounding's tolerance
        kind = "quant-bf16" if layer.format == "bf16" else "quant-int8"
        best = _decide(f"{kind} {layer.format}", layer, rows, [best, *rounded], close_rounded)
    _decided[memo] = best
    return best


def close_rounded(expected: torch.Tensor, got: torch.Tensor) -> bool:
    """The product with the activations rounded to int8 blocks: within ROUNDING_TOLERANCE of the largest value."""
    if expected.shape != got.shape or not torch.isfinite(got).all():
        return False
    return bool((expected - got).abs().max() <= ROUNDING_TOLERANCE * expected.abs().max() + 1e-5)


def _decide(kind: str, layer: QuantLinear, rows: int, names: list[str], same, slabs: bool = False) -> str:
    """The fastest of `names` for this shape, remembered under `kind`; TORCH is PyTorch's product over the whole
    dequantized weight, or with `slabs` the layer's own slab product (`QuantLinear.product`)."""
    if len(names) == 1:
        return names[0]
    key = f"{kind} t{torch.get_num_threads()} {rows}x{layer.out_features}x{layer.in_features} {KERNELS}"
    known = choices.choices().get(key, tuple(names))
    if known is not None:
        return known.choice
    x = torch.randn(rows, layer.in_features, generator=torch.Generator().manual_seed(0))

    def candidate(name: str):
        if name == TORCH:
            return (lambda: layer.product(x)) if slabs else (lambda: F.linear(x, layer.dequantized()))
        function = kernel(name)
        return lambda: run(function, layer, x)

    with torch.no_grad():
        return choices.choices().decide(key, {name: candidate(name) for name in names}, same)


def _plan(layer: QuantLinear, m: int) -> tuple:
    """(the C function for this layer's format on the path chosen for m rows, or None for PyTorch's product, the
    format's code), remembered on the layer for the forced path and thread count it was chosen under: decoding
    calls the same layers with the same rows once a token, so the choice is made once."""
    plans = layer.__dict__.setdefault("_quant_plans", {})
    memo = (m, os.environ.get(FORCE_VARIABLE), torch.get_num_threads())
    plan = plans.get(memo)
    if plan is None:
        path, code = choose(layer, m), FORMAT_CODE[layer.format]
        function = None if path == TORCH else kernel(path)
        plan = plans[memo] = (function.formats[code] if isinstance(function, _Rounded) else function, code)
    return plan


def product(x: torch.Tensor, layer: QuantLinear) -> torch.Tensor:
    """x (..., in) times the layer's weight (no bias): through the path chosen for its shape."""
    rows = x.reshape(-1, layer.in_features)
    m = rows.shape[0]
    function, code = _plan(layer, m)
    y = F.linear(rows, layer.dequantized()) if function is None else _call(function, code, layer, rows.contiguous())
    return y.view(*x.shape[:-1], layer.out_features)


def choose_frozen(layer: QuantLinear, m: int) -> str:
    """The path for this layer's product under autograd with m input rows (QLoRA's forward): forced, or measured
    once per format, shape class (rows up to TRAINING_ROWS) and thread count among the layer's slabs (TORCH) and
    the fp32 C paths."""
    path = forced()
    fits = layer.in_features % max(FORMATS[layer.format].block_size, 32) == 0
    if not fits:
        return TORCH
    if path is not None:
        return path
    rows = min(_rows_class(m), TRAINING_ROWS)
    exact = [TORCH] + [path for path in PATHS if path not in ROUNDED and kernel(path) is not None]
    return _decide(f"quant {layer.format} frozen", layer, rows, exact, close, slabs=True)


def frozen_product(rows: torch.Tensor, layer: QuantLinear) -> torch.Tensor:
    """rows (N, in) times the layer's frozen weight under autograd (no bias): the C path `choose_frozen` picks for
    fp32 rows on the CPU, else the layer's slabs (`QuantLinear.product`)."""
    if not (products.plain_cpu_fp32(rows) and layer.blocks.is_contiguous() and rows.shape[0] > 0):
        return layer.product(rows)
    plans = layer.__dict__.setdefault("_frozen_plans", {})
    memo = (min(_rows_class(rows.shape[0]), TRAINING_ROWS), os.environ.get(FORCE_VARIABLE), torch.get_num_threads())
    if memo not in plans:
        path = choose_frozen(layer, rows.shape[0])
        function = None if path == TORCH else kernel(path)
        plans[memo] = function.formats[FORMAT_CODE[layer.format]] if isinstance(function, _Rounded) else function
    function = plans[memo]
    if function is None:
        return layer.product(rows)
    return _call(function, FORMAT_CODE[layer.format], layer, rows.contiguous())


def step_product(layer: QuantLinear) -> int | None:
    """The address of the C function that multiplies one row by this layer's weight for the C decoder step: the
    path chosen for one row, as `product` multiplies it; where PyTorch's product over the dequantized weight was
    measured faster (alone, outside the step), the widest fp32 C path, which computes that product up to the
    order of its sums. None where TFCLI_QUANT_PATH forces PyTorch's product, no C path fits the layer, or the
    layer has no kernel attached."""
    if layer.kernel is not product or not layer.blocks.is_contiguous() or layer.blocks.device.type != "cpu":
        return None
    function, _ = _plan(layer, 1)
    if function is None and forced() is None and layer.in_features % max(FORMATS[layer.format].block_size, 32) == 0:
        exact = [path for path in ("avx512", "avx2", "portable") if kernel(path) is not None]
        function = kernel(exact[0]) if exact else None
    return None if function is None else address(function)


def step_dequantizer() -> int | None:
    """The address of the C dequantizer (blocks.c's quant_dequantize, checked to give NumPy's values), or None."""
    global _expand_checked
    if dequantizer() is None:
        return None
    if _expand_checked is None:
        _expand_checked = _expands_as_numpy()
    if not _expand_checked:
        return None
    return address(_expand_functions[max(_expand_functions)])


_expand_checked: bool | None = None


def attach(model: torch.nn.Module) -> int:
    """Give every QuantLinear of `model` this product (`QuantLinear.kernel`), its product under autograd
    (`frozen_kernel`) and `products`' measured dense products for its slabs, and it and a QuantEmbedding the C
    dequantizer where it is built and checked; returns how many layers."""
    global _expand_checked
    layers = [module for module in model.modules() if isinstance(module, QuantLinear)]
    for layer in layers:
        layer.kernel, layer.frozen_kernel = product, frozen_product
        layer.slab_forward, layer.slab_backward = products.forward_product, products.input_gradient
    expand = dequantizer()
    if expand is not None and _expand_checked is None:
        _expand_checked = _expands_as_numpy()
    if expand is not None and _expand_checked:
        for module in model.modules():
            if isinstance(module, (QuantLinear, QuantEmbedding)):
                module.expand = expand
    return len(layers)
