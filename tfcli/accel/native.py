"""tfcli's C code for decoding on the CPU (`native.c`), compiled on first use: a matrix-vector product and a
whole decoder step (`decode_step.py` binds a model to it). An optional accelerator: wherever it cannot be
had, everything runs in PyTorch.

At batch 1 a linear layer reads its whole weight to make one output row, so a decoding step costs the time
to stream every weight from memory, and a small model's step is the fixed cost of its hundred-odd PyTorch
calls, which one C call removes. The code is built with the machine's C compiler (`$CC`, else `cc`) once per
source, compiler and processor, into tfcli's cache folder (`machine.cache_dir()`, in `kernels/`); a
compiler without OpenMP builds it for one thread. A build that fails is remembered there (a `.failed` file
with the reason), so no compiler runs again until the source, the compiler or the processor changes. The
library is loaded only when the OpenMP runtime it needs is the one PyTorch already loaded (or none is), and
only after its product matches PyTorch's. `TFCLI_NATIVE_KERNELS=0` (or `TFCLI_ACCEL=0`) turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shlex
import signal
import stat
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from tfcli.accel import layout
from tfcli.accel.machine import cache_dir, processor_key
from tfcli.fsutil import atomic_write_json
from tfcli.jsontext import loads_json

SOURCE = Path(__file__).with_name("native.c")
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC"]
OPENMP = ["-fopenmp"]  # tried first; a compiler without OpenMP builds the serial version
LIBRARIES = ["-lm"]  # after the source, so the linker keeps them
PARALLEL_FROM = 1 << 15  # weight elements from which a product is split between threads
BUILD_TIMEOUT_S = 60


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
    """The built library: `vector_linear` (a VectorLinear) and the C functions `decoder_step` and
    `decoder_workspace`, which `decode_step.py` calls."""

    def __init__(self, library: ctypes.CDLL) -> None:
        function = library.vector_linear
        function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_long]
        function.restype = None
        self.vector_linear = VectorLinear(function)
        self.decoder_step = library.decoder_step
        self.decoder_step.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_long]
        self.decoder_step.restype = None
        self.decoder_workspace = library.decoder_workspace
        self.decoder_workspace.argtypes = [ctypes.c_void_p]
        self.decoder_workspace.restype = ctypes.c_long
        self.step_verified: bool | None = None  # decode_step.py's check against PyTorch, once a process


class NativeUnavailable(Exception):
    pass


class PassingFailure(NativeUnavailable):
    """Not remembered as a failed build: the next process may well succeed."""


class NoCompiler(PassingFailure):
    """Looking for a compiler costs nothing, and one may be installed."""


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
            except NativeUnavailable as reason:
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


def private(path: Path) -> bool:
    """Ours and not writable by everyone: no other user can have put a file there for us to load."""
    info = path.stat()
    return info.st_uid == os.getuid() and not info.st_mode & stat.S_IWOTH


def _kernel_folder() -> Path | None:
    """The private folder that holds built libraries, or None where there is none to trust."""
    try:
        folder = cache_dir() / "kernels"
        folder.mkdir(parents=True, exist_ok=True)
        return folder if private(folder) and os.access(folder, os.W_OK) else None
    except (OSError, RuntimeError):  # RuntimeError: no home folder to hold the cache
        return None


def _build_and_load() -> NativeLibrary:
    off = turned_off()
    if off:
        raise NativeUnavailable(off)
    if os.name != "posix":
        raise NativeUnavailable(f"not built on {platform.system()}")
    compiler = shlex.split(os.environ.get("CC") or "cc") or ["cc"]
    header = layout.header()
    key = hashlib.sha256(
        b"\0".join([SOURCE.read_bytes(), header.encode(), " ".join(compiler).encode(), " ".join(FLAGS + OPENMP + LIBRARIES).encode(), processor_key().encode()])
    )
    name = f"native-{key.hexdigest()[:16]}.so"
    folder = _kernel_folder()
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="tfcli-kernel-") as scratch:  # for this process only
            library = Path(scratch) / name
            _compile(compiler, library, header)
            return _load(library)  # the loaded library outlives its file
    library = folder / name
    failed = library.with_suffix(".failed")
    if failed.exists():
        raise NativeUnavailable(f"{_remembered(failed)} (remembered from an earlier build; delete {failed} to try again)")
    if library.exists():
        if private(library) and _intact(library):
            try:
                return _load(library)
            except NativeUnavailable:
                pass
        with contextlib.suppress(OSError):
            library.unlink()  # damaged, or not ours: build it again
    try:
        _compile(compiler, library, header)
    except PassingFailure:
        raise
    except NativeUnavailable as reason:
        _remember(failed, str(reason))
        raise
    return _load(library)


def _remembered(failed: Path) -> str:
    try:
        reason = loads_json(failed.read_text()).get("reason")
        return str(reason) if reason else "the build failed"
    except (OSError, ValueError, AttributeError):
        return "the build failed"


def _remember(failed: Path, reason: str) -> None:
    with contextlib.suppress(OSError):
        atomic_write_json(failed, {"reason": reason})


def _digest_file(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _intact(library: Path) -> bool:
    """The library is byte for byte what its build wrote. A cut-off or damaged one is never loaded: the
    loader can crash the process on it before saying anything."""
    try:
        recorded = _digest_file(library).read_text().strip()
        return recorded == hashlib.sha256(library.read_bytes()).hexdigest()
    except OSError:
        return False


def _run_compiler(command: list[str]) -> str | None:
    """Run one compile; None on success, else its first error line. A compiler that hangs is killed with
    everything it started."""
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    except FileNotFoundError:
        raise NoCompiler(f"no C compiler {command[0]!r}; set CC to one") from None
    except OSError as error:
        raise PassingFailure(f"{command[0]} could not start: {error}") from None  # out of processes or memory for now
    try:
        _, stderr = process.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise NativeUnavailable(f"{command[0]} took more than {BUILD_TIMEOUT_S} s") from None
    if process.returncode == 0:
        return None
    return next((line.strip() for line in stderr.splitlines() if line.strip()), f"exit code {process.returncode}")


def _compile(compiler: list[str], library: Path, header: str) -> None:
    """Compile (with OpenMP, else without) into a private file, then move it into place, so a concurrent
    build never loads half a file."""
    fd, partial = tempfile.mkstemp(dir=library.parent, prefix=library.stem, suffix=".partial")
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory(prefix="tfcli-layout-") as include:
            Path(include, "layout.h").write_text(header)
            base = [*compiler, *FLAGS, "-I", include, "-o", partial, str(SOURCE)]
            error = _run_compiler([*base[: len(compiler)], *OPENMP, *base[len(compiler) :], *LIBRARIES])
            if error is not None:
                serial_error = _run_compiler([*base, *LIBRARIES])
                if serial_error is not None:
                    raise NativeUnavailable(f"{compiler[0]} could not build it: {serial_error}")
        with open(partial, "rb") as built:
            digest = hashlib.sha256(built.read()).hexdigest()
            os.fsync(built.fileno())
        os.chmod(partial, 0o755)  # the compiler made it private to this user; loading needs read access
        os.replace(partial, library)
        fd, digest_partial = tempfile.mkstemp(dir=library.parent, prefix=library.stem, suffix=".partial")
        with os.fdopen(fd, "w") as record:
            record.write(digest + "\n")
        os.replace(digest_partial, _digest_file(library))  # written last: a library without it is rebuilt
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _load(path: Path) -> NativeLibrary:
    """Load the library, but only where it brings no second OpenMP runtime into the process (checked on
    its ELF header before loading, and on the process's mappings after), then check it against PyTorch."""
    _, needed = elf_names(path)
    wanted = {name for name in needed if _is_openmp(name)}
    present = {elf_names(runtime)[0] or os.path.basename(runtime) for runtime in openmp_runtimes()}
    if wanted and present and not wanted <= present:
        raise NativeUnavailable(
            f"it needs {', '.join(sorted(wanted))} while PyTorch runs {', '.join(sorted(present))}; two OpenMP runtimes would compete for the cores"
        )
    try:
        loaded = NativeLibrary(ctypes.CDLL(str(path)))
    except (OSError, AttributeError) as error:
        raise NativeUnavailable(f"could not load {path.name}: {error}") from None
    runtimes = openmp_runtimes()
    if len(runtimes) > 1:
        raise NativeUnavailable(f"two OpenMP runtimes are loaded ({', '.join(sorted(runtimes))})")
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
                raise NativeUnavailable("the built kernel disagreed with PyTorch")
    return built
