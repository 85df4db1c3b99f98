"""tfcli's C code for decoding on the CPU (`native.c`), compiled on first use: a matrix-vector product, a
whole decoder step over fp32 or block-quantized weights (`decode_step.py` binds a model to it), and the split of a
quantized product's rows between threads (`quant_parallel`, for `quant.py`). An optional accelerator: wherever it
cannot be had, everything runs in PyTorch.

At batch 1 a linear layer reads its whole weight to make one output row, so a decoding step costs the time
to stream every weight from memory, and a small model's step is the fixed cost of its hundred-odd PyTorch
calls, which one C call removes. `build.py` compiles, caches and checks the library (once per source,
compiler and processor, in tfcli's cache folder; a failed build remembered there); it is built with OpenMP,
or for one thread where the compiler has none. The library is loaded only when the OpenMP runtime it needs is
the one PyTorch already loaded (or none is), and only after its product matches PyTorch's.
`TFCLI_NATIVE_KERNELS=0` (or `TFCLI_ACCEL=0`) turns it off.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from tfcli.accel import build, layout

SOURCE = Path(__file__).with_name("native.c")
FLAGS = ("-O3", "-march=native")
OPENMP = ("-fopenmp",)  # tried first; a compiler without OpenMP builds the serial version
LIBRARIES = ("-lm",)
PARALLEL_FROM = 1 << 15  # weight elements from which a product is split between threads
BUILD_TIMEOUT_S = build.BUILD_TIMEOUT_S


class VectorLinear:
    """y = x @ weight.T + bias for one row x (..., k) of fp32 CPU tensors, weight (n, k) contiguous, bias
    (n,) contiguous. The caller checks the shapes (`products.linear`); the C code trusts them."""

    def __init__(self, function) -> None:
        self._function = function

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, parallel_from: int = PARALLEL_FROM) -> torch.Tensor:
        n, k = weight.shape
        x = x.contiguous()
        y = torch.empty(*x.shape[:-1], n, dtype=torch.float32, device="cpu")
        self._function(weight.data_ptr(), x.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(), n, k, torch.get_num_threads(), parallel_from)
        return y


class NativeLibrary:
    """The built library: `vector_linear` (a VectorLinear), the C functions `decoder_step` and
    `decoder_workspace`, which `decode_step.py` calls, and `quant_parallel` (blocks.c's product for a matrix of
    blocks, its rows split between threads), which `quant.py` calls on several threads."""

    def __init__(self, library: ctypes.CDLL) -> None:
        function = library.vector_linear
        function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_long]
        function.restype = None
        self.vector_linear = VectorLinear(function)
        self.decoder_step = library.decoder_step
        self.decoder_step.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_long]
        self.decoder_step.restype = ctypes.c_int
        self.decoder_workspace = library.decoder_workspace
        self.decoder_workspace.argtypes = [ctypes.c_void_p]
        self.decoder_workspace.restype = ctypes.c_long
        # (product, format, w, row_bytes, x, y, m, n, k, threads, parallel_from) -> status
        self.quant_parallel = library.quant_parallel
        self.quant_parallel.argtypes = (
            [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_long] + [ctypes.c_void_p] * 2 + [ctypes.c_long] * 3 + [ctypes.c_int, ctypes.c_long]
        )
        self.quant_parallel.restype = ctypes.c_int
        self.step_verified: bool | None = None  # decode_step.py's check against PyTorch, once a process
        self.quantized_step_verified: bool | None = None  # and its check of the step over quantized weights


_lock = threading.Lock()
_library: NativeLibrary | None = None
_problem: str | None = None  # why there is no library
_tried = False


def library() -> NativeLibrary | None:
    """The compiled library, building it the first time; None where it cannot be had (see `problem()`)."""
    global _library, _problem, _tried
    if _tried:
        return _library
    with _lock:
        if not _tried:
            try:
                _library = _build_and_load()
            except build.Unavailable as reason:
                _library, _problem = None, str(reason)
            except Exception as error:  # whatever goes wrong, decoding goes on without the C code
                _library, _problem = None, f"{type(error).__name__}: {error}"
            _tried = True
    return _library


def vector_linear() -> VectorLinear | None:
    """The compiled matrix-vector product, building it the first time; None where it cannot be had."""
    built = library()
    return built.vector_linear if built is not None else None


def problem() -> str | None:
    """Why there is no C code in this process, or None when it is built, loaded and checked."""
    library()
    return _problem


def turned_off() -> str | None:
    """Why the environment turns the C code off, or None."""
    for variable in ("TFCLI_ACCEL", "TFCLI_NATIVE_KERNELS"):
        if os.environ.get(variable, "1").strip().lower() in ("0", "false", "no", "off"):
            return f"turned off by {variable}"
    return None


def _build_and_load() -> NativeLibrary:
    off = turned_off()
    if off:
        raise build.Unavailable(off)
    spec = build.Build(
        "native", SOURCE, variants=((*OPENMP, *FLAGS), FLAGS), libraries=LIBRARIES, headers=(("layout.h", layout.header()),), timeout_s=BUILD_TIMEOUT_S
    )
    return build.obtain(spec, _load)


def _load(path: Path) -> NativeLibrary:
    """Load the library, but only where it brings no second OpenMP runtime into the process (checked on
    its ELF header before loading, and on the process's mappings after), then check it against PyTorch."""
    _, needed = elf_names(path)
    wanted = {name for name in needed if _is_openmp(name)}
    present = {elf_names(runtime)[0] or os.path.basename(runtime) for runtime in openmp_runtimes()}
    if wanted and present and not wanted <= present:
        raise build.Unavailable(
            f"it needs {', '.join(sorted(wanted))} while PyTorch runs {', '.join(sorted(present))}; two OpenMP runtimes would compete for the cores"
        )
    before = openmp_runtimes()
    try:
        loaded = NativeLibrary(build.load_library(path))
    except AttributeError as error:  # a function missing
        raise build.Unavailable(f"could not load {path.name}: {error}") from None
    added = openmp_runtimes() - before
    if added and before:  # another library's own runtime (sentencepiece ships one) may be there already: only ours counts
        raise build.Unavailable(f"it brought a second OpenMP runtime ({', '.join(sorted(added))}) beside {', '.join(sorted(before))}")
    return _checked(loaded)


def _is_openmp(name: str) -> bool:
    return re.match(r"lib(?:g|i|i5)?omp\b", os.path.basename(name)) is not None


def openmp_runtimes() -> set[str]:
    """The OpenMP libraries mapped into this process (Linux; elsewhere none are seen)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    return {os.path.realpath(path) for path in re.findall(r"(/\S*/lib(?:g|i|i5)?omp[\w.-]*\.so[\w.]*)", maps)}


def elf_names(path: str | Path) -> tuple[str | None, list[str]]:
    """(its soname, the libraries it needs) from a 64-bit little-endian ELF file's dynamic section;
    (None, []) for anything else."""
    try:
        data = Path(path).read_bytes()
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return None, []
        (section_offset,) = struct.unpack_from("<Q", data, 0x28)
        entry_size, count = struct.unpack_from("<HH", data, 0x3A)
        # name, type, flags, addr, offset, size, link, info, addralign, entsize
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
        soname, needed = None, []
        for section in sections:
            if section[1] != 6:  # SHT_DYNAMIC
                continue
            strings = sections[section[6]][4]
            for offset in range(section[4], section[4] + section[5], 16):
                tag, value = struct.unpack_from("<qQ", data, offset)
                if tag == 0:
                    break
                if tag in (1, 14):  # DT_NEEDED, DT_SONAME
                    start = strings + value
                    text = data[start : data.index(b"\0", start)].decode(errors="replace")
                    if tag == 1:
                        needed.append(text)
                    else:
                        soname = text
        return soname, needed
    except (OSError, struct.error, IndexError, ValueError):
        return None, []


def _checked(built: NativeLibrary) -> NativeLibrary:
    """Compare the product with PyTorch on a few shapes (odd sizes, with and without bias, one thread and
    several); `decode_step.py` checks the decoder step the first time it binds a model."""
    generator = torch.Generator().manual_seed(0)
    with torch.autocast("cpu", enabled=False):  # fp32 on both sides, whatever mode the first caller is in
        for n, k, with_bias, parallel_from in [(203, 77, True, 0), (64, 64, False, PARALLEL_FROM), (9, 3, True, 0)]:
            weight = torch.randn(n, k, generator=generator, dtype=torch.float32)
            x = torch.randn(1, k, generator=generator, dtype=torch.float32)
            bias = torch.randn(n, generator=generator, dtype=torch.float32) if with_bias else None
            got = built.vector_linear(x, weight, bias, parallel_from=parallel_from)
            if not torch.allclose(got, F.linear(x, weight, bias), rtol=1e-4, atol=1e-4):
                raise build.Unavailable("the built kernel disagreed with PyTorch")
    return built
