"""tfcli's C code for decoding on the CPU (`native.c`), compiled on first use: a matrix-vector product and a
whole decoder step (`decode_step.py` binds a model to it).

At batch 1 a linear layer reads its whole weight to make one output row, so a decoding step costs the time
to stream every weight from memory. On a 2-core AMD EPYC where a plain sum read 65-75 GB/s, oneDNN's
product streamed weights at 33-38 GB/s and MKL's at 17; the C loop reaches about 57 GB/s there. A small
model's step is instead the fixed cost of its hundred-odd PyTorch calls, which one C call removes. The code
is built with the machine's C compiler (`$CC`, else `cc`) once per source, compiler and processor, into
tfcli's cache folder (`$TFCLI_CACHE_DIR`, else `$XDG_CACHE_HOME/tfcli` or `~/.cache/tfcli`, in `kernels/`).
Where there is no compiler or no OpenMP, the build or its check against PyTorch fails, or the kernel's
OpenMP runtime is not PyTorch's, decoding keeps PyTorch and oneDNN; `TFCLI_NATIVE_KERNELS=0` turns it off.
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
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

SOURCE = Path(__file__).with_name("native.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
LIBRARIES = ["-lm"]  # after the source, so the linker keeps them
PARALLEL_FROM = 1 << 15  # weight elements from which a product is split between threads
BUILD_TIMEOUT_S = 60


class VectorLinear:
    """y = x @ weight.T + bias for one row x (..., k) of fp32 CPU tensors, weight (n, k) contiguous, bias
    (n,) contiguous. The caller checks the shapes (`kernels.use_native`); the C code trusts them."""

    def __init__(self, function) -> None:
        self._function = function

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 parallel_from: int = PARALLEL_FROM) -> torch.Tensor:
        n, k = weight.shape
        x = x.contiguous()
        y = torch.empty(*x.shape[:-1], n, dtype=torch.float32, device="cpu")
        self._function(weight.data_ptr(), x.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
                       n, k, torch.get_num_threads(), parallel_from)
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
        self.decoder_step.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_int, ctypes.c_long]
        self.decoder_step.restype = None
        self.decoder_workspace = library.decoder_workspace
        self.decoder_workspace.argtypes = [ctypes.c_void_p]
        self.decoder_workspace.restype = ctypes.c_long
        self.step_verified: bool | None = None  # decode_step.py's check against PyTorch, once a process


class NativeUnavailable(Exception):
    pass


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
    """Why decoding keeps PyTorch's and oneDNN's kernels at batch 1, or None when the C code is in use."""
    library()
    return _problem


def forget() -> None:
    """Drop the loaded library so the next call builds or finds it again (tests change the settings)."""
    global _library, _problem, _tried
    with _lock:
        _library, _problem, _tried = None, None, False


def cache_dir() -> Path:
    if os.environ.get("TFCLI_CACHE_DIR"):
        return Path(os.environ["TFCLI_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tfcli"


def _processor() -> str:
    """What -march=native compiles for: a kernel built on one processor may not run on another."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    described = [line for line in lines if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join([platform.machine(), platform.processor(), *dict.fromkeys(described)])


def _build_and_load() -> NativeLibrary:
    if os.environ.get("TFCLI_NATIVE_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        raise NativeUnavailable("turned off by TFCLI_NATIVE_KERNELS")
    if os.name != "posix":
        raise NativeUnavailable(f"not built on {platform.system()}")
    compiler = shlex.split(os.environ.get("CC") or "cc") or ["cc"]
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), " ".join(compiler).encode(), " ".join(FLAGS + LIBRARIES).encode(),
                                      _processor().encode()]))
    name = f"native-{key.hexdigest()[:16]}.so"
    try:
        folder: Path | None = cache_dir() / "kernels"
        folder.mkdir(parents=True, exist_ok=True)
        usable = _private(folder) and os.access(folder, os.W_OK)
    except (OSError, RuntimeError):  # RuntimeError: no home folder to hold the cache
        folder, usable = None, False
    if folder is not None and usable:
        library = folder / name
        if library.exists():
            if _private(library) and _intact(library):
                try:
                    return _checked(_open(library))
                except NativeUnavailable:
                    pass
            with contextlib.suppress(OSError):
                library.unlink()  # damaged, or not ours: build it again
        _compile(compiler, library)
        return _checked(_open(library))
    with tempfile.TemporaryDirectory(prefix="tfcli-kernel-") as scratch:  # no cache of our own: for this process
        library = Path(scratch) / name
        _compile(compiler, library)
        return _checked(_open(library))  # the loaded library outlives its file


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


def _private(path: Path) -> bool:
    """Ours and not writable by everyone: no other user can have put a library there for us to load."""
    info = path.stat()
    return info.st_uid == os.getuid() and not info.st_mode & stat.S_IWOTH


def _compile(compiler: list[str], library: Path) -> None:
    """Compile into a private file, then move it into place, so a concurrent build never loads half a file."""
    fd, partial = tempfile.mkstemp(dir=library.parent, prefix=library.stem, suffix=".partial")
    os.close(fd)
    try:
        try:
            process = subprocess.Popen([*compiler, *FLAGS, "-o", partial, str(SOURCE), *LIBRARIES], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, start_new_session=True)
        except FileNotFoundError:
            raise NativeUnavailable(f"no C compiler {compiler[0]!r}; set CC to one") from None
        except OSError as error:
            raise NativeUnavailable(f"{compiler[0]} could not start: {error}") from None
        try:
            _, stderr = process.communicate(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the compiler and whatever it started
            process.communicate()
            raise NativeUnavailable(f"{compiler[0]} took more than {BUILD_TIMEOUT_S} s") from None
        if process.returncode != 0:
            first = next((line for line in stderr.splitlines() if line.strip()), f"exit code {process.returncode}")
            raise NativeUnavailable(f"{compiler[0]} could not build it: {first.strip()}")
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


def _open(path: Path) -> NativeLibrary:
    try:
        loaded = NativeLibrary(ctypes.CDLL(str(path)))
    except (OSError, AttributeError) as error:
        raise NativeUnavailable(f"could not load {path.name}: {error}") from None
    runtimes = _openmp_runtimes()
    if len(runtimes) > 1:  # its threads would compete with PyTorch's for the cores
        raise NativeUnavailable(f"two OpenMP runtimes are loaded ({', '.join(sorted(runtimes))})")
    return loaded


def _openmp_runtimes() -> set[str]:
    """The OpenMP libraries mapped into this process (Linux; elsewhere none are seen)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    return {os.path.realpath(path) for path in re.findall(r"(/\S*/lib(?:g|i|i5)?omp[\w.-]*\.so[\w.]*)", maps)}


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
