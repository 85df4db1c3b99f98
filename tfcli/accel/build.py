"""tfcli's C code compiled on first use, cached and loaded: the one owner of how that is done, for the decoder's
C code (`native.py`) and word2vec's kernel (`tfcli/word2vec/kernel.py`).

A library is built with the machine's C compiler (`$CC`, else `cc`) once per source, header text, compiler,
flags and processor, into tfcli's cache folder (`machine.cache_dir()`, in `kernels/`), trusted only when it is
ours and not writable by everyone (else the library is built in a scratch folder for this process only).
The compiler writes a temporary file that is moved into place whole, its sha256 digest written beside it
last; a library whose digest does not match is never loaded (the loader can crash the process on a cut-off
file before saying anything) but built again. A build that fails is remembered (a `.failed` JSON file with the
reason), so no compiler runs again until the source, the compiler or the processor changes; a passing failure
(no compiler, no process to run it for now) is not. A compiler that hangs is killed, with all it started.
Processes that want the same library at once build it once: the builder holds a lock (`NAME.lock`, flock) and
the others wait for it, then find the library built.

Example: `obtain(Build("demo", Path("demo.c"), variants=(("-O3", "-fopenmp"), ("-O3",))))` builds
`kernels/demo-<key>.so` with OpenMP, else without, and returns the loaded `ctypes.CDLL`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import os
import platform
import shlex
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from tfcli.accel.machine import cache_dir, processor_key
from tfcli.fsutil import atomic_write_json
from tfcli.jsontext import loads_json

BUILD_TIMEOUT_S = 60  # one compile; a compiler that takes longer is killed
COMMON = ("-shared", "-fPIC")  # every library is a shared one, loaded with ctypes
LOCK_POLL_S = 0.05

Loaded = TypeVar("Loaded")


class Unavailable(Exception):
    """No library: the reason is the message."""


class PassingFailure(Unavailable):
    """Not remembered as a failed build: the next process may well succeed."""


class NoCompiler(PassingFailure):
    """Looking for a compiler costs nothing, and one may be installed."""

    def __init__(self, compiler: str) -> None:
        super().__init__(f"no C compiler {compiler!r}; set CC to one")
        self.compiler = compiler


class BuildFailed(Unavailable):
    """The compiler ran and made no library: `error` is its first error line (or that it took too long);
    `remembered` is the `.failed` file when this is an earlier build's failure."""

    def __init__(self, compiler: str, error: str, *, timed_out: bool = False, remembered: Path | None = None) -> None:
        self.compiler, self.error, self.timed_out, self.remembered = compiler, error, timed_out, remembered
        reason = f"{compiler} {error}" if timed_out else f"{compiler} could not build it: {error}"
        if remembered is not None:
            reason += f" (remembered from an earlier build; delete {remembered} to try again)"
        super().__init__(reason)


@dataclasses.dataclass(frozen=True)
class Build:
    """What to build: `name` starts the library's file name; each of `variants` is a list of compiler flags,
    tried in turn until one builds (OpenMP first, then serial); `headers` are written into an include folder
    (name -> text) and, like everything here, change the cache key."""

    name: str
    source: Path
    variants: tuple[tuple[str, ...], ...]
    libraries: tuple[str, ...] = ("-lm",)  # after the source, so the linker keeps them
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = BUILD_TIMEOUT_S


def compiler() -> list[str]:
    """The C compiler and its own arguments: `$CC`, else `cc`."""
    return shlex.split(os.environ.get("CC") or "cc") or ["cc"]


def file_name(build: Build, command: list[str]) -> str:
    """`NAME-<key>.so`, the key a digest of all that makes the library what it is."""
    flags = [*(flag for variant in build.variants for flag in variant), *COMMON, *build.libraries]
    parts = [build.source.read_bytes(), *(f"{name}\n{text}".encode() for name, text in build.headers)]
    parts += [" ".join(command).encode(), " ".join(flags).encode(), processor_key().encode()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return f"{build.name}-{key}.so"


def private(path: Path) -> bool:
    """Ours and not writable by everyone: no other user can have put a file there for us to load."""
    info = path.stat()
    return info.st_uid == os.getuid() and not info.st_mode & stat.S_IWOTH


def kernel_folder() -> Path | None:
    """The private folder that holds built libraries (and accel's decisions), or None where there is none to trust."""
    try:
        folder = cache_dir() / "kernels"
        folder.mkdir(parents=True, exist_ok=True)
        return folder if private(folder) and os.access(folder, os.W_OK) else None
    except (OSError, RuntimeError):  # RuntimeError: no home folder to hold the cache
        return None


@contextlib.contextmanager
def exclusive(lock: Path, wait_s: float) -> Iterator[bool]:
    """Hold an exclusive flock on `lock` (made if missing) while the block runs; yields whether it is held.
    Waits at most `wait_s` for another holder, then goes on without it: every write here is atomic, so the
    lock only saves doing the same work twice."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    held = False
                    break
                time.sleep(LOCK_POLL_S)
            except OSError:  # a file system without locks
                held = False
                break
        yield held
    finally:
        os.close(fd)  # lets the lock go


def load_library(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as error:
        raise Unavailable(f"could not load {path.name}: {error}") from None


def obtain(build: Build, load: Callable[[Path], Loaded] = load_library) -> Loaded:
    """The library `build` describes, built if needed and loaded by `load` (`load_library`, or a caller's
    own, which may check the file first and what it loaded after, raising Unavailable to refuse it). A cached
    library that `load` refuses is built again once. Raises Unavailable (NoCompiler, BuildFailed, ...)."""
    if os.name != "posix":
        raise Unavailable(f"not built on {platform.system()}")
    command = compiler()
    name = file_name(build, command)
    folder = kernel_folder()
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="tfcli-kernel-") as scratch:  # for this process only
            library = Path(scratch) / name
            _compile(build, command, library)
            return load(library)  # the loaded library outlives its file
    library = folder / name
    failed = library.with_suffix(".failed")
    refused = None  # the cached file `load` refused, so as not to load it twice
    if failed.exists():
        raise _remembered(failed)
    if _usable(library):
        refused = _identity(library)
        with contextlib.suppress(Unavailable):
            return load(library)
    with exclusive(library.with_suffix(".lock"), wait_s=len(build.variants) * build.timeout_s + 30):
        if failed.exists():  # another process's build failed while this one waited
            raise _remembered(failed)
        if _usable(library) and _identity(library) != refused:  # another process built it while this one waited
            with contextlib.suppress(Unavailable):
                return load(library)
        with contextlib.suppress(OSError):
            library.unlink()  # damaged, refused, or not ours: build it again
        try:
            _compile(build, command, library)
        except PassingFailure:
            raise
        except BuildFailed as reason:
            _remember(failed, reason)
            raise
    return load(library)


def _usable(library: Path) -> bool:
    try:
        return private(library) and intact(library)
    except OSError:  # not there
        return False


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _remembered(failed: Path) -> BuildFailed:
    try:
        record = loads_json(failed.read_text())
        return BuildFailed(str(record["compiler"]), str(record["error"]), timed_out=bool(record.get("timed_out")), remembered=failed)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return BuildFailed("the compiler", "the build failed", remembered=failed)


def _remember(failed: Path, reason: BuildFailed) -> None:
    with contextlib.suppress(OSError):
        atomic_write_json(failed, {"reason": str(reason), "compiler": reason.compiler, "error": reason.error, "timed_out": reason.timed_out})


def digest_file(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def intact(library: Path) -> bool:
    """The library is byte for byte what its build wrote. A cut-off or damaged one is never loaded: the
    loader can crash the process on it before saying anything."""
    try:
        recorded = digest_file(library).read_text().strip()
        return recorded == hashlib.sha256(library.read_bytes()).hexdigest()
    except OSError:
        return False


def run_compiler(command: list[str], timeout_s: float) -> str | None:
    """Run one compile; None on success, else its first error line. A compiler that hangs is killed with
    everything it started (its own process group)."""
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    except FileNotFoundError:
        raise NoCompiler(command[0]) from None
    except OSError as error:
        raise PassingFailure(f"{command[0]} could not start: {error}") from None  # out of processes or memory for now
    try:
        _, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise BuildFailed(command[0], f"took more than {timeout_s:g} s", timed_out=True) from None
    if process.returncode == 0:
        return None
    return next((line.strip() for line in stderr.splitlines() if line.strip()), f"exit code {process.returncode}")


def _compile(build: Build, command: list[str], library: Path) -> None:
    """Compile (each variant in turn until one builds) into a private file, then move it into place and write
    its digest last, so that no process ever loads half a file."""
    fd, partial = tempfile.mkstemp(dir=library.parent, prefix=library.stem, suffix=".partial")
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory(prefix="tfcli-include-") as include:
            for header, text in build.headers:
                Path(include, header).write_text(text)
            error = None
            for variant in build.variants:
                error = run_compiler([*command, *variant, *COMMON, "-I", include, "-o", partial, str(build.source), *build.libraries], build.timeout_s)
                if error is None:
                    break
            if error is not None:
                raise BuildFailed(command[0], error)  # the last variant's error: the plainest build's
        with open(partial, "rb") as built:
            digest = hashlib.sha256(built.read()).hexdigest()
            os.fsync(built.fileno())
        os.chmod(partial, 0o755)  # the compiler made it private to this user; loading needs read access
        os.replace(partial, library)
        fd, digest_partial = tempfile.mkstemp(dir=library.parent, prefix=library.stem, suffix=".partial")
        with os.fdopen(fd, "w") as record:
            record.write(digest + "\n")
        os.replace(digest_partial, digest_file(library))  # written last: a library without it is built again
    finally:
        if os.path.exists(partial):
            os.remove(partial)
