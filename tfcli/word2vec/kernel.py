"""The word2vec kernel (`kernel.c`), compiled on first use into tfcli's cache folder as `tfcli.accel.native`
builds its own, and called from Python threads (ctypes lets go of the GIL, so threads train at once).

Built once per source, compiler and processor; a build that fails says why in one line. Without a C
compiler there is no word2vec training: a loop in Python or per-pair torch calls would be hundreds of times
slower than gensim's C, which is the speed to match.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from tfcli.accel.machine import cache_dir, processor_key
from tfcli.accel.native import private
from tfcli.errors import TfcliError

SOURCE = Path(__file__).with_name("kernel.c")
# The parts of -ffast-math that let the compiler vectorise the dot products, without -ffast-math itself: a
# library linked with it sets flush-to-zero for the whole process on load (torch's and numpy's arithmetic too).
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math", "-freciprocal-math", "-shared", "-fPIC"]
BUILD_TIMEOUT_S = 60

_lock = threading.Lock()
_function = None


def _compile(compiler: list[str], library: Path) -> None:
    """Compile into a private temp file beside `library`, then move it into place (a concurrent build never
    loads half a file)."""
    fd, partial = tempfile.mkstemp(dir=library.parent, prefix=library.stem, suffix=".partial")
    os.close(fd)
    try:
        try:
            done = subprocess.run([*compiler, *FLAGS, "-o", partial, str(SOURCE), "-lm"], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except FileNotFoundError:
            raise TfcliError(f"word2vec training needs a C compiler and there is no {compiler[0]!r}", hint="install gcc or clang, or set CC to one") from None
        except subprocess.TimeoutExpired:
            raise TfcliError(f"{compiler[0]} took more than {BUILD_TIMEOUT_S} s to build the word2vec kernel") from None
        if done.returncode != 0:
            first = next((line.strip() for line in done.stderr.splitlines() if line.strip()), f"exit code {done.returncode}")
            raise TfcliError(f"{compiler[0]} could not build the word2vec kernel: {first}", hint="set CC to another C compiler")
        os.chmod(partial, 0o755)
        os.replace(partial, library)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _library_path() -> tuple[Path, tempfile.TemporaryDirectory | None]:
    compiler = shlex.split(os.environ.get("CC") or "cc") or ["cc"]
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), " ".join(compiler + FLAGS).encode(), processor_key().encode()])).hexdigest()[:16]
    folder: Path | None = cache_dir() / "kernels"
    scratch = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not (private(folder) and os.access(folder, os.W_OK)):
            folder = None
    except (OSError, RuntimeError):
        folder = None
    if folder is None:  # no cache to trust: build for this process only
        scratch = tempfile.TemporaryDirectory(prefix="tfcli-word2vec-")
        folder = Path(scratch.name)
    library = folder / f"word2vec-{key}.so"
    if not (library.exists() and private(library)):
        library.unlink(missing_ok=True)
        _compile(compiler, library)
    return library, scratch


def train_span_function():
    """The C function `w2v_train_span`, built and loaded the first time."""
    global _function
    with _lock:
        if _function is None:
            path, scratch = _library_path()
            library = ctypes.CDLL(str(path))
            if scratch is not None:
                scratch.cleanup()  # the loaded library outlives its file
            function = library.w2v_train_span
            function.argtypes = [
                ctypes.c_void_p,  # tokens
                ctypes.c_int64,  # n_tokens
                ctypes.c_void_p,  # input vectors
                ctypes.c_void_p,  # output vectors
                ctypes.c_int,  # dim
                ctypes.c_void_p,  # keep thresholds
                ctypes.c_void_p,  # noise table
                ctypes.c_int,  # vocab
                ctypes.c_int,  # skipgram
                ctypes.c_int,  # window
                ctypes.c_int,  # negatives
                ctypes.c_float,  # alpha at the start of the span
                ctypes.c_float,  # alpha at its end
                ctypes.c_uint64,  # seed
                ctypes.c_void_p,  # work
                ctypes.c_void_p,  # stats
            ]
            function.restype = ctypes.c_double
            library.w2v_init()
            _function = function
    return _function


def _pointer(array: np.ndarray) -> int:
    assert array.flags.c_contiguous
    return array.ctypes.data


def train_span(
    tokens: np.ndarray,
    input_vectors: np.ndarray,
    output_vectors: np.ndarray,
    keep: np.ndarray,
    noise: np.ndarray,
    *,
    skipgram: bool,
    window: int,
    negatives: int,
    alpha_start: float,
    alpha_end: float,
    seed: int,
) -> tuple[float, int, int]:
    """Train the vectors in place on `tokens` (int32 ids, -1 ends a sentence); returns (summed loss, words
    kept after subsampling, examples)."""
    vocab, dim = input_vectors.shape
    assert tokens.dtype == np.int32 and input_vectors.dtype == output_vectors.dtype == np.float32
    assert keep.dtype == noise.dtype == np.uint32 and keep.shape == noise.shape == (vocab,) and output_vectors.shape == (vocab, dim)
    work = np.zeros(2 * dim, dtype=np.float32)
    stats = np.zeros(2, dtype=np.int64)
    loss = train_span_function()(
        _pointer(tokens),
        len(tokens),
        _pointer(input_vectors),
        _pointer(output_vectors),
        dim,
        _pointer(keep),
        _pointer(noise),
        vocab,
        int(skipgram),
        window,
        negatives,
        alpha_start,
        alpha_end,
        seed & 0xFFFFFFFFFFFFFFFF,
        _pointer(work),
        _pointer(stats),
    )
    return float(loss), int(stats[0]), int(stats[1])
