"""The word2vec kernel (`kernel.c`), compiled on first use into tfcli's cache folder by `tfcli.accel.build`
(as the decoder's C code is: cached, checked and a failed build remembered), and called from Python threads
(ctypes lets go of the GIL, so threads train at once).

Without a C compiler there is no word2vec training: a loop in Python or per-pair torch calls would be
hundreds of times slower than gensim's C, which is the speed to match. A build that fails says why in one line.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from tfcli.accel import build
from tfcli.errors import TfcliError

SOURCE = Path(__file__).with_name("kernel.c")
# The parts of -ffast-math that let the compiler vectorise the dot products, without -ffast-math itself: a
# library linked with it sets flush-to-zero for the whole process on load (torch's and numpy's arithmetic too).
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math", "-freciprocal-math")
BUILD_TIMEOUT_S = build.BUILD_TIMEOUT_S

_lock = threading.Lock()
_function = None


def _library() -> ctypes.CDLL:
    """The built library, loaded; a TfcliError in one line where it cannot be had."""
    try:
        return build.obtain(build.Build("word2vec", SOURCE, variants=(FLAGS,), timeout_s=BUILD_TIMEOUT_S))
    except build.NoCompiler as missing:
        raise TfcliError(f"word2vec training needs a C compiler and there is no {missing.compiler!r}", hint="install gcc or clang, or set CC to one") from None
    except build.BuildFailed as failure:
        what = (
            f"{failure.compiler} {failure.error} to build the word2vec kernel"
            if failure.timed_out
            else f"{failure.compiler} could not build the word2vec kernel: {failure.error}"
        )
        if failure.remembered is not None:
            raise TfcliError(
                f"{what} (remembered from an earlier build)", hint=f"set CC to another C compiler, or delete {failure.remembered} to try again"
            ) from None
        raise TfcliError(what, hint="set CC to another C compiler") from None
    except build.Unavailable as reason:
        raise TfcliError(f"the word2vec kernel cannot be had: {reason}") from None


def train_span_function():
    """The C function `w2v_train_span`, built and loaded the first time."""
    global _function
    with _lock:
        if _function is None:
            library = _library()
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
