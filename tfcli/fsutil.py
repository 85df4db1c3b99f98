"""Atomic writes and output-folder checks, so nothing already on disk is lost or half-written.

Every artifact is written to a temporary path in the destination folder, flushed, fsynced and renamed
over the final name; a crash leaves either the old file or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from safetensors import SafetensorError

from tfcli.errors import TfcliError
from tfcli.jsontext import dumps_json

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock
    fcntl = None


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_current_umask()
_DIR_MODE = 0o777 & ~_current_umask()


def temp_path_beside(path: Path) -> Path:
    """An empty temp file in `path`'s folder, with the permissions a plain open() would give it
    (mkstemp makes files private to the owner)."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, _FILE_MODE)
    os.close(fd)
    return Path(tmp_name)


def set_default_mode(path: Path) -> None:
    """Give a file the permissions a plain open() would (some writers create private files)."""
    os.chmod(path, _FILE_MODE)


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems cannot open folders; the rename is still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "wb", **kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; on a clean exit fsync it and rename it onto `path`.

    On an exception the temp file is removed and `path` is left as it was.
    """
    path = Path(path)
    tmp = temp_path_beside(path)
    try:
        with open(tmp, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)


def atomic_write_json(path: Path, obj: Any) -> None:
    """Strict JSON (NaN and infinities refused), UTF-8, indented, with a final newline."""
    atomic_write_text(path, dumps_json(obj, indent=2) + "\n")


def stage_file(path: Path, data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to a temp file beside `path`, fsynced, and return the temp path, for
    `commit_staged` to rename into place with the other files of the same artifact. On an error (a full
    disk) the temp file is removed."""
    tmp = temp_path_beside(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def stage_json(path: Path, obj: Any) -> Path:
    """`stage_file` of `obj` as `atomic_write_json` writes it."""
    return stage_file(path, dumps_json(obj, indent=2) + "\n")


def stage_written(path: Path, write: Callable[[Path], None]) -> Path:
    """Have `write(temp)` fill a temp file beside `path` (for libraries that write files themselves:
    safetensors, a copy), give it a plain file's mode, fsync it and return it, as `stage_file` does."""
    tmp = temp_path_beside(path)
    try:
        write(tmp)
        set_default_mode(tmp)
        fsync_file(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def stage_copy(origin: Path, path: Path) -> Path:
    """A staged copy of `origin`, to become `path`."""
    return stage_written(path, lambda tmp: shutil.copyfile(origin, tmp))


@contextlib.contextmanager
def staging(sweep: Path | None = None) -> Iterator[list[tuple[Path, Path]]]:
    """The (temp, final) pairs of one artifact, for `commit_staged`; if the block fails, every temp staged so
    far is removed, and with `sweep` every temp file in that folder too (one a callback staged and lost)."""
    staged: list[tuple[Path, Path]] = []
    try:
        yield staged
    except BaseException:
        discard_staged(staged)
        if sweep is not None:
            for leftover in sweep.glob(".*.tmp"):
                leftover.unlink(missing_ok=True)
        raise


def commit_staged(staged: list[tuple[Path, Path]], then: Callable[[], None] | None = None) -> None:
    """Rename each staged (temp, final) pair in order, then run `then` (the trainer state's swap), with
    SIGINT and SIGTERM held until all is done: an artifact of several files (shards and their meta.json, a
    checkpoint, a tokenizer and its config) is replaced whole or not at all by a Ctrl-C or a kill.
    Everything that can fail for want of space happened while staging; should a rename still fail, the
    temp files not yet renamed are removed."""
    done = 0
    try:
        with signals_deferred():
            for tmp, final in staged:
                os.replace(tmp, final)
                done += 1
            if then is not None:
                then()
    except BaseException:
        discard_staged(staged[done:])
        raise
    for folder in dict.fromkeys(final.parent for _, final in staged):
        fsync_dir(folder)


def discard_staged(staged: list[tuple[Path, Path]]) -> None:
    for tmp, _ in staged:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs and deliver them when it ends, in the order they
    came. Python runs signal handlers in the main thread, whichever thread the signal reached, so swapping
    the handlers there is enough; elsewhere (another thread, a handler set outside Python) the block runs as is."""
    signums = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or any(signal.getsignal(s) is None for s in signums):
        yield
        return
    received: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum)) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)


def prepare_output_dir(path: Path, what: str = "output", option: str = "-o") -> Path:
    """Create `path` as a folder (parents too) and check we can write there; a clear error, naming the
    command-line `option` that gave the path, if not."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise TfcliError(f"{what} path {path} is a file, not a folder", hint=f"pass a folder path with {option}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TfcliError(f"cannot create {what} folder {path}: {exc.strerror}", hint=f"pick another path with {option}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise TfcliError(f"{what} folder {path} is not writable", hint=f"pick another path with {option} or fix its permissions")
    return path


def sha256_file(path: Path, block_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(block_size):
            digest.update(block)
    return digest.hexdigest()


GIT_LFS_POINTER = b"version https://git-lfs.github.com/spec/"  # how a pointer file starts (git-lfs's spec)


def refuse_git_lfs_pointer(path: Path) -> None:
    """One line when `path` is a Git LFS pointer (a model repository cloned without git-lfs holds one, some
    130 bytes, where each large file should be); nothing otherwise, the file's own reader says what else is wrong."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(len(GIT_LFS_POINTER))
    except OSError:
        return
    if start == GIT_LFS_POINTER:
        raise TfcliError(
            f"{path} is a Git LFS pointer, not the file itself: the repository was cloned without Git LFS",
            hint="run `git lfs install && git lfs pull` in it, or download the model with `huggingface-cli download`",
        )


def artifact_kind(path: Path) -> str | None:
    """What tfcli artifact `path` is, told by the files in it: a run directory, a token-shard folder or a
    tokenizer folder, or one of their JSON files; None for anything else (text, say)."""
    path = Path(path)
    if path.is_dir():
        if (path / "model.safetensors").is_file() or ((path / "config.json").is_file() and (path / "tokenizer.json").is_file()):
            return "a run directory"
        if (path / "meta.json").is_file() and any((path / f"{split}.bin").is_file() for split in ("train", "val")):
            return "a token-shard folder"
        names = {p.name for p in path.iterdir() if not p.name.startswith(".")}
        if "tokenizer.json" in names and names <= {"tokenizer.json", "tokenizer_config.json"}:
            return "a tokenizer folder"
        return None
    if path.name == "tokenizer.json":
        return "a tokenizer"
    container = artifact_kind(path.parent) if path.suffix == ".json" else None
    if container in ("a run directory", "a token-shard folder"):
        return f"{path.name} of {container}"
    return None


LOCK_FILE = ".lock"


@contextlib.contextmanager
def exclusive_lock(folder: Path, doing: str) -> Iterator[None]:
    """Hold FOLDER/.lock while the block runs, so two processes never write one folder at once; the
    second gets a TfcliError. The lock goes with the process (a crash releases it); the file stays."""
    if fcntl is None:  # not a POSIX system: no lock
        yield
        return
    with open(Path(folder) / LOCK_FILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise TfcliError(f"another process is {doing} {folder}", hint="wait for it to finish, or choose another -o") from exc
        yield


@contextlib.contextmanager
def no_empty_folder_left(folder: Path, leftovers: Iterable[str] = ()) -> Iterator[None]:
    """A command that fails or is interrupted before writing anything into FOLDER takes away the folder
    if it made it (never one that was there before). `leftovers`: what a failed start may have written
    there and is no use alone (a run's empty metrics.jsonl, its best/ without a run): removed with it,
    so long as nothing else is in the folder."""
    folder = Path(folder)
    existed = folder.exists()
    removable = {LOCK_FILE, *leftovers}
    try:
        yield
    except BaseException:
        if not existed and folder.is_dir() and all(p.name in removable for p in folder.iterdir()):
            with _unless_locked(folder) as free:
                if free:  # else another process made the folder at the same moment and is writing there now
                    shutil.rmtree(folder, ignore_errors=True)
        raise


@contextlib.contextmanager
def _unless_locked(folder: Path) -> Iterator[bool]:
    """Hold FOLDER/.lock, if there is one, while the block runs; yields False where another process holds it."""
    if fcntl is None or not (Path(folder) / LOCK_FILE).is_file():
        yield True
        return
    with open(Path(folder) / LOCK_FILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True


@contextlib.contextmanager
def nothing_left_on_failure(folder: Path, doing: str) -> Iterator[None]:
    """For a command that makes FOLDER's whole content at once (import, export): if it fails or is
    interrupted, every entry it added is removed, and the folder too if it made it. A write error (a
    full disk, a read-only folder) becomes one line."""
    folder = Path(folder)
    existed = folder.exists()
    if not existed:
        with contextlib.suppress(OSError):  # made now to be locked; where it cannot be, the command says why
            folder.mkdir(parents=True)
    own_lock_file = not (folder / LOCK_FILE).exists()
    # Two commands writing one folder at once would mix their files (and each report success): the second is refused.
    with exclusive_lock(folder, "writing into") if folder.is_dir() else contextlib.nullcontext():
        before = {p.name for p in folder.iterdir()} - ({LOCK_FILE} if own_lock_file else set()) if folder.is_dir() else set()
        try:
            yield
        except BaseException as exc:
            if folder.is_dir():
                for entry in folder.iterdir():
                    if entry.name not in before:
                        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink(missing_ok=True)
                if not existed and not any(folder.iterdir()):
                    folder.rmdir()
            if isinstance(exc, (OSError, SafetensorError)):
                raise TfcliError(
                    f"could not finish {doing} {folder}: {describe_write_error(exc)}",
                    hint="check the free space and the folder's permissions, or choose another -o",
                ) from exc
            raise
        if own_lock_file:
            (folder / LOCK_FILE).unlink(missing_ok=True)  # an exported folder is left as it was written


def describe_write_error(exc: BaseException) -> str:
    """What went wrong, in a line: OSError's own words, or safetensors' (it reports a full disk as its own error)."""
    if isinstance(exc, OSError):
        return str(exc.strerror or exc)
    text = str(exc)
    return text.split("I/O error: ", 1)[-1] if "I/O error: " in text else text


_MKSTEMP_TAIL = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")  # temp_path_beside's names: .NAME.<8 random>.tmp
_PID_TAIL = re.compile(r"^\.(?P<name>.+)\.(?P<pid>[0-9]+)\.tmp$")  # a shard writer's: .train.bin.PID.tmp


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process, or no such number: leave the file alone
    return True


def remove_stale_temp_files(folder: Path, names: Iterable[str], *, locked: bool, older_than: float = 600.0) -> list[Path]:
    """Remove the temp files a crashed writer left in FOLDER beside the artifacts `names` (a kill -9 during
    a save leaves a whole model's copy there): only files of tfcli's own naming (.NAME.<8 random>.tmp,
    .NAME.PID.tmp), and only stale ones: every one where the caller holds the folder's lock (`locked`: no
    other writer can be at work), else those of a process that is gone or older than `older_than` seconds.
    Returns what was removed."""
    wanted = set(names)
    removed: list[Path] = []
    if not Path(folder).is_dir():
        return removed
    now = time.time()
    for entry in Path(folder).iterdir():
        by_pid = _PID_TAIL.match(entry.name)
        by_stemp = _MKSTEMP_TAIL.match(entry.name)
        match = by_pid or by_stemp
        if match is None or match.group("name") not in wanted or not entry.is_file() or entry.is_symlink():
            continue
        if not locked:
            if by_pid and int(by_pid.group("pid")) != os.getpid() and not _pid_alive(int(by_pid.group("pid"))):
                pass  # its writer is gone
            else:
                try:
                    if now - entry.stat().st_mtime < older_than:
                        continue
                except OSError:
                    continue
        try:
            entry.unlink()
        except OSError:
            continue
        removed.append(entry)
    return removed


def removed_note(removed: list[Path]) -> str:
    """The line that says what `remove_stale_temp_files` removed."""
    names = ", ".join(p.name for p in removed[:3]) + (f" and {len(removed) - 3} more" if len(removed) > 3 else "")
    return f"removed {len(removed)} temporary file{'s' if len(removed) != 1 else ''} left by an interrupted run in {removed[0].parent}: {names}"


def refuse_non_utf8_path(path: Path, option: str = "-o") -> None:
    """A folder whose name is not UTF-8 (a byte Python decodes to a lone surrogate) cannot hold safetensors
    files: the library refuses such paths, so a run saved there could never be read back. Said up front."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise TfcliError(
            f"the path {shown} is not UTF-8, and the safetensors library cannot open files under it", hint=f"choose a UTF-8 name with {option}"
        ) from None


# ---- writes that a kill -9 may cut short: held temp files and staging folders, and their leftovers ------------


def _hold(fd: int) -> None:
    """Lock an open temp file or staging folder for as long as this process keeps `fd` open (or lives). A file
    system without locks (some network ones) refuses: the write goes on unheld, and no cleaner there can take
    a lock to remove it either."""
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


@contextlib.contextmanager
def held_temp_file(path: Path) -> Iterator[Path]:
    """A temp file beside `path` (.NAME.<random>.tmp, as `temp_path_beside` names it), locked while the block
    runs, so `remove_abandoned_temps` leaves it alone however long the write takes and takes it once a kill -9
    has ended its writer. The block fills it and renames it into place; otherwise it is removed at the end."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, _FILE_MODE)
        _hold(fd)
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)  # before the lock goes: never a moment unheld
        os.close(fd)


@contextlib.contextmanager
def held_temp_folder(path: Path) -> Iterator[Path]:
    """A staging folder beside `path` (.NAME.<random>.tmp), locked as `held_temp_file` locks its file, for an
    artifact of several files that `place_folder` then puts at `path` whole. Unless it was placed, it is
    removed with what it holds at the end of the block."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    fd = None
    try:
        if fcntl is not None:  # elsewhere a folder cannot be opened, nor locked
            fd = os.open(tmp, os.O_RDONLY)
            _hold(fd)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already where it was placed
        if fd is not None:
            os.close(fd)


def place_folder(staged: Path, folder: Path, last: tuple[str, ...] = ()) -> None:
    """Put a staging folder's files at `folder`, with SIGINT and SIGTERM held until done: where `folder` is
    absent, the staging folder is renamed to it (one atomic rename); into a folder that is there (kept as it
    is: its mode, its other files, a shell's current folder) the entries are renamed one by one, those named
    in `last` last, in that order (a run's config.json: a folder without it holds no run)."""
    staged, folder = Path(staged), Path(folder)
    os.chmod(staged, _DIR_MODE)  # mkdtemp makes folders private to the owner
    with signals_deferred():
        whole = not folder.is_dir()
        if whole:
            try:
                os.replace(staged, folder)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not folder.is_dir():
                    raise
                whole = False  # made meanwhile: its entries, one by one
        if not whole:
            for entry in sorted(staged.iterdir(), key=lambda p: last.index(p.name) + 1 if p.name in last else 0):
                os.replace(entry, folder / entry.name)
    fsync_dir(folder)
    fsync_dir(folder.parent)


def remove_abandoned_temps(path: Path, older_than: float = 5.0) -> list[Path]:
    """Remove what killed writers of `path` left beside it: temp files and staging folders of its own naming
    (.NAME.<random>.tmp) that no live process holds (`held_temp_file`, `held_temp_folder`) and that are more
    than `older_than` seconds old (a writer takes its lock a moment after making its file). Returns what was
    removed; without flock (not a POSIX system) nothing can be told apart, and nothing is."""
    path = Path(path)
    removed: list[Path] = []
    if fcntl is None or not path.parent.is_dir():
        return removed
    now = time.time()
    for entry in path.parent.iterdir():
        match = _MKSTEMP_TAIL.match(entry.name)
        if match is None or match.group("name") != path.name:
            continue
        try:
            info = entry.lstat()
            if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)) or now - info.st_mtime < older_than:
                continue
            fd = os.open(entry, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # refused while its writer lives
            if os.fstat(fd).st_ino != info.st_ino:
                continue
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            continue
        finally:
            os.close(fd)
        removed.append(entry)
    return removed
