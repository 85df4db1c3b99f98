"""Faults while writing: SIGINT, SIGTERM (and a second Ctrl-C) and a full disk at the points where `tokenize
encode`, `tokenize train`, `train` (its checkpoint saves), `export` and `import` write. Whatever the point,
the command ends with its documented exit code (130, 143, or 2 with one line), what was on disk before is
intact or replaced whole, no temp file is left, and the next run resumes or redoes the work cleanly.

The points are found by counting the calls of the write path's functions (mkstemp, fsync, replace,
copyfile, safetensors' save_file, a shard's write) in a clean run; a fault is injected before the chosen
call, in-process. A few points are drawn per run (TFCLI_SWEEP_EXAMPLES=N: N of them, up to all), and one
test sends a real signal to a real process at a random moment; on a machine where the test may mount a
tmpfs (root), the disk fills for real.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, TINY_TEXT, snapshot
from tests.helpers import mounted_tmpfs, run

pytestmark = pytest.mark.sweep

EXAMPLES = int(os.environ.get("TFCLI_SWEEP_EXAMPLES", "0"))
WRITE_PATH = [
    (os, "replace"),
    (os, "fsync"),
    (shutil, "copyfile"),
    (tempfile, "mkstemp"),
    ("safetensors.torch", "save_file"),
    ("tfcli.data.shards.ShardWriter", "write"),
]
EXIT = {"SIGINT": 130, "SIGTERM": 143, "SIGINT twice": 130, "ENOSPC": 2}
TINY_MODEL = ["--set", "d_model=16", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "eval_batches=1"]


def _resolve(owner):
    if not isinstance(owner, str):
        return owner
    module, _, attribute = owner.rpartition(".")
    try:
        return importlib.import_module(owner)
    except ImportError:
        return getattr(importlib.import_module(module), attribute)


def _in_cache(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a call writes tfcli's cache (the measured speed decisions, the C kernel), which only a first
    run does: such calls are not counted, so the same point is the same call in every run."""
    cache = os.environ.get("TFCLI_CACHE_DIR")
    if not cache:
        return False
    if name == "fsync":
        try:
            where = os.readlink(f"/proc/self/fd/{args[0]}")
        except (OSError, TypeError):
            return False
    elif name == "mkstemp":
        where = str(kwargs.get("dir", ""))
    elif name in ("replace", "copyfile", "save_file") and len(args) > 1:
        where = str(args[1])
    else:
        return False
    return where.startswith(cache)


@dataclasses.dataclass
class Calls:
    names: list[str] = dataclasses.field(default_factory=list)  # the write path's calls, counted
    faulted: str | None = None  # the one the fault came before


@contextlib.contextmanager
def fault_at(point: int | None, fault: Callable[[], None], skip: tuple[str, ...] = ()) -> Iterator[Calls]:
    """Count the write path's calls (but those named in `skip`, and the cache's); before the `point`-th
    (from 1), run `fault`: raise a signal in this process, or an OSError."""
    calls = Calls()
    with pytest.MonkeyPatch.context() as patch:
        for owner, name in WRITE_PATH:
            target = _resolve(owner)
            original = getattr(target, name)

            def hooked(*args, _original=original, _name=name, **kwargs):
                if _name not in skip and not _in_cache(_name, args, kwargs):
                    calls.names.append(_name)
                    if len(calls.names) == point:
                        calls.faulted = _name
                        fault()
                return _original(*args, **kwargs)

            patch.setattr(target, name, hooked)
        yield calls


def make_fault(kind: str, before: Callable[[], None] = lambda: None) -> Callable[[], None]:
    def fault() -> None:
        before()
        if kind == "ENOSPC":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        signal.raise_signal(signal.SIGTERM if kind == "SIGTERM" else signal.SIGINT)
        if kind == "SIGINT twice":  # an impatient user: training waits for the step in hand, the second stops it at once
            signal.raise_signal(signal.SIGINT)

    return fault


def skipped(kind: str) -> tuple[str, ...]:
    """A full disk fails the writes, not the renames (a file renamed onto an existing name takes no space)."""
    return ("replace",) if kind == "ENOSPC" else ()


def points(calls: Calls, kind: str, default: int, rng: random.Random) -> list[int]:
    """Which of the calls a clean run made to fault (1-based, among those `kind` may fail): `default`
    drawn at random, or TFCLI_SWEEP_EXAMPLES of them (all, if fewer)."""
    total = sum(name not in skipped(kind) for name in calls.names)
    chosen = sorted(rng.sample(range(1, total + 1), min(total, EXAMPLES or default)))
    print(f"{kind}: {len(chosen)} of {total} points: {chosen}")
    return chosen


@contextlib.contextmanager
def faulted(point: int, kind: str, before: Callable[[], None] = lambda: None) -> Iterator[Calls]:
    """Run the block with `kind` injected before the `point`-th call it may fail; check it got there."""
    with fault_at(point, make_fault(kind, before), skip=skipped(kind)) as calls:
        yield calls
    assert calls.faulted, f"the run made fewer than {point} calls"


def check_end(result, kind: str, calls: Calls, done: bool = False) -> None:
    """The exit code `kind` calls for; 0 too where the run was `done` before a signal could stop it, or the
    full disk failed only a folder's fsync (which a rename's durability needs, not its correctness)."""
    assert "Traceback" not in result.stderr, result.stderr
    codes = {EXIT[kind]} | ({0} if done or (kind == "ENOSPC" and calls.faulted == "fsync") else set())
    assert result.code in codes, (kind, result.code, result.stderr[-2000:])
    if result.code == 2:
        lines = result.stderr.strip().split("\n")
        assert lines[-1].startswith("error: ") and "No space left on device" in lines[-1], result.stderr


def no_temp_files(folder: Path) -> None:
    left = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name in ("trainer.next", "trainer.prev")]
    assert not left, left


@pytest.fixture
def rng() -> random.Random:
    seed = int(os.environ.get("TFCLI_FAULT_SEED") or random.randrange(1 << 30))
    print(f"fault points drawn with seed {seed} (TFCLI_FAULT_SEED={seed} draws them again)")
    return random.Random(seed)


@pytest.fixture(scope="module", autouse=True)
def quick_training():
    """A training run times the machine's peak FLOP/s for its MFU once (0.3 s of matmuls) and draws loss.png
    at the end (0.3 s): neither is on the checkpoint's write path, and these tests look at neither."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tfcli.train.setup.peak_matmul_flops", lambda *args, **kwargs: 1e12)
        patch.setattr("tfcli.train.loop.plot_loss_curve", lambda *args, **kwargs: False)
        yield


# ---- tokenize encode and tokenize train ----------------------------------------------------------------


def shard_state(folder: Path) -> dict:
    """What a shard folder holds, less what differs between two encodings of the same text (time, paths)."""
    import json

    state = snapshot(folder)
    state.pop(".lock", None)
    if "meta.json" in state:
        meta = json.loads(state["meta.json"])
        state["meta.json"] = {k: v for k, v in meta.items() if k not in ("seconds", "sources")}
        for check in (meta.get("checks") or {}).values():
            check.pop("mtime_ns")  # when the file was written
    return state


@dataclasses.dataclass
class Clean:
    """A command's clean run: what it leaves (`state`), the write path's calls it made, and the folder the
    faulted runs start from (`before`, a copy of an older artifact, with what it holds)."""

    args: list
    state: Any
    calls: list[str]
    before: Path
    before_state: Any


@pytest.fixture(scope="module")
def encoding(tmp_path_factory, trained_tokenizer) -> Clean:
    folder = tmp_path_factory.mktemp("encode")
    (folder / "old.txt").write_text(TINY_TEXT * 3, encoding="utf-8")
    (folder / "new.txt").write_text(TINY_TEXT.upper() * 40, encoding="utf-8")
    encode = ["tokenize", "encode", "-t", trained_tokenizer, "--val-fraction", "0.2"]
    assert run(*encode, folder / "old.txt", "-o", folder / "old").code == 0
    with fault_at(None, lambda: None) as calls:
        assert run(*encode, folder / "new.txt", "-o", folder / "new").code == 0
    return Clean([*encode, folder / "new.txt"], shard_state(folder / "new"), calls, folder / "old", shard_state(folder / "old"))


@pytest.mark.parametrize("kind", ["SIGINT", "SIGTERM", "ENOSPC"])
def test_encode_interrupted_or_out_of_space_keeps_the_old_shards(encoding, tmp_path, rng, kind):
    for point in points(encoding.calls, kind, 2, rng):
        out = tmp_path / f"at-{point}"
        shutil.copytree(encoding.before, out)
        with faulted(point, kind) as calls:
            result = run(*encoding.args, "-o", out)
        check_end(result, kind, calls)
        assert shard_state(out) in (encoding.before_state, encoding.state), f"{kind} before call {point} ({calls.faulted}) left a mix"
        no_temp_files(out)
        assert run(*encoding.args, "-o", out).code == 0
        assert shard_state(out) == encoding.state


def whole_wordpiece(folder: Path, reference: dict[str, bytes]) -> bool:
    """The three files of one WordPiece training (its ties fall either way, so not the reference's bytes)."""
    import json

    files = snapshot(folder)
    if files.get("tokenizer_config.json") != reference["tokenizer_config.json"] or "vocab.txt" not in files:
        return False
    vocab = json.loads(files["tokenizer.json"])["model"]["vocab"]
    return files["vocab.txt"].decode().split("\n")[:-1] == sorted(vocab, key=vocab.get)


@pytest.fixture(scope="module")
def tokenizer_training(tmp_path_factory) -> Clean:
    folder = tmp_path_factory.mktemp("tokenizer")
    corpus = folder / "corpus.txt"
    corpus.write_text(TINY_TEXT * 10, encoding="utf-8")
    train = ["tokenize", "train", corpus, "--vocab-size", "300"]
    assert run(*train, "-m", "bpe", "-o", folder / "old").code == 0
    with fault_at(None, lambda: None) as calls:  # three files: tokenizer.json, its config, vocab.txt
        assert run(*train, "-m", "wordpiece", "-o", folder / "new").code == 0
    return Clean([*train, "-m", "wordpiece"], snapshot(folder / "new"), calls, folder / "old", snapshot(folder / "old"))


@pytest.mark.parametrize("kind", ["SIGINT", "SIGTERM", "ENOSPC"])
def test_tokenizer_training_interrupted_or_out_of_space_keeps_the_old_tokenizer(tokenizer_training, tmp_path, rng, kind):
    clean = tokenizer_training
    for point in points(clean.calls, kind, 2, rng):
        out = tmp_path / f"at-{point}"
        shutil.copytree(clean.before, out)
        with faulted(point, kind) as calls:
            result = run(*clean.args, "-o", out)
        check_end(result, kind, calls)
        assert snapshot(out) == clean.before_state or whole_wordpiece(out, clean.state), f"{kind} before call {point} ({calls.faulted}) left a mix"
        no_temp_files(out)
        assert run(*clean.args, "-o", out).code == 0
        assert whole_wordpiece(out, clean.state)


# ---- train: a fault during a checkpoint save ---------------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory, trained_tokenizer) -> Path:
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.tokenizer.core import TextTokenizer

    folder = tmp_path_factory.mktemp("fault-data")
    (folder / "corpus.txt").write_text(TINY_TEXT * 30, encoding="utf-8")
    shutil.copytree(trained_tokenizer, folder / "tokenizer")
    encode_corpus(resolve_corpus([folder / "corpus.txt"]), TextTokenizer.load(folder / "tokenizer"), folder / "shards", val_fraction=0.2)
    return folder / "shards"


CHECKPOINT = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "trainer/state.json", "trainer/optimizer.safetensors")


def checkpoint_files(run: Path) -> dict[str, bytes]:
    return {name: (run / name).read_bytes() for name in CHECKPOINT if (run / name).is_file()}


def train_args(shards: Path, *extra) -> list:
    return ["train", "pretrain", "--data", shards, "--block-size", "16", "--batch-size", "4", "--device", "cpu", *TINY_MODEL, *extra]


@pytest.fixture(scope="module")
def training(tmp_path_factory, shards) -> Clean:
    """Four steps, a checkpoint every two, an evaluation (and a best/ save) at the end."""
    from safetensors.torch import load_file

    from tfcli.train.state import read_metrics

    run_dir = tmp_path_factory.mktemp("train") / "whole"
    args = train_args(shards, "--max-steps", "4", "--save-every", "2", "--eval-every", "4", "--log-every", "1")
    with fault_at(None, lambda: None) as calls:
        assert run(*args, "-o", run_dir).code == 0
    state = (load_file(str(run_dir / "model.safetensors")), [timeless(r) for r in read_metrics(run_dir / "metrics.jsonl")])
    return Clean(args, state, calls, run_dir, None)


def timeless(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("tokens_per_sec", "mfu", "elapsed")}


@pytest.mark.parametrize("kind", ["SIGINT", "SIGTERM", "SIGINT twice", "ENOSPC"])
def test_a_fault_during_a_checkpoint_save_keeps_a_checkpoint_that_resumes_exactly(training, tmp_path, rng, kind):
    from safetensors.torch import load_file

    from tfcli.checkpoint import load_checkpoint
    from tfcli.train.state import find_trainer_state, read_metrics

    weights, records = training.state
    for point in points(training.calls, kind, 1, rng):
        run_dir = tmp_path / f"at-{point}"
        seen: dict[str, bytes] = {}
        with faulted(point, kind, before=lambda run_dir=run_dir, seen=seen: seen.update(checkpoint_files(run_dir))) as calls:
            result = run(*training.args, "-o", run_dir)
        check_end(result, kind, calls, done=kind != "ENOSPC")  # a signal in the last save ends a run that was done
        where = f"{kind} before call {point} ({calls.faulted})"
        no_temp_files(run_dir)
        if result.code == 2:  # the disk was full: the checkpoint is the one before the failed save
            assert checkpoint_files(run_dir) == seen, where
        if (run_dir / "model.safetensors").is_file():
            load_checkpoint(run_dir)  # whole: the weights, config and tokenizer belong together
            find_trainer_state(run_dir)  # and the trainer state belongs to the weights
            again = run(*training.args, "-o", run_dir, "--resume")
        else:  # the fault came before the first checkpoint was complete: a new start
            again = run(*training.args, "-o", run_dir)
        assert again.code == 0, (where, again.stderr)
        resumed = load_file(str(run_dir / "model.safetensors"))
        assert all((resumed[k] == weights[k]).all() for k in weights), where
        assert [timeless(r) for r in read_metrics(run_dir / "metrics.jsonl")] == records, where


# ---- export and import ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory, trained_tokenizer) -> Path:
    """A run that exports as GPT-2 (random weights)."""
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    tokenizer = TextTokenizer.load(trained_tokenizer)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layers=2, n_heads=2, d_model=16, activation="gelu_tanh")
    run = tmp_path_factory.mktemp("gpt2") / "run"
    save_checkpoint(run, Transformer(config), tokenizer)
    return run


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, trained_tokenizer) -> Path:
    """A tiny random GPT-2 made by transformers itself."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(1)
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=320, n_positions=32, n_embd=16, n_layer=2, n_head=2))
    model.save_pretrained(str(folder), safe_serialization=True)
    shutil.copy(trained_tokenizer / "tokenizer.json", folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="module")
def conversions(tmp_path_factory, gpt2_run, hf_folder) -> dict[str, Clean]:
    found = {}
    for direction, source in (("export", gpt2_run), ("import", hf_folder)):
        out = tmp_path_factory.mktemp(direction) / "out"
        with fault_at(None, lambda: None) as calls:
            assert run(direction, source, "-o", out).code == 0
        found[direction] = Clean([direction, source], sorted(snapshot(out)), calls, out, None)
    return found


@pytest.mark.parametrize("kind", ["SIGINT", "SIGTERM", "ENOSPC"])
@pytest.mark.parametrize("direction", ["export", "import"])
def test_export_and_import_leave_the_folder_as_it_was_on_a_fault(conversions, tmp_path, rng, kind, direction):
    clean = conversions[direction]
    for point in points(clean.calls, kind, 1, rng):
        out = tmp_path / f"at-{point}"
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")  # what was in the folder before
        with faulted(point, kind) as calls:
            result = run(*clean.args, "-o", out)
        check_end(result, kind, calls)
        if result.code != 0:
            assert snapshot(out) == {"notes.txt": b"mine\n"}, f"{kind} before call {point} ({calls.faulted})"
            assert run(*clean.args, "-o", out).code == 0
        assert sorted(snapshot(out)) == sorted([*clean.state, "notes.txt"])


@pytest.fixture(scope="module")
def gguf_conversions(tmp_path_factory, gpt2_run) -> dict[str, Clean]:
    """The run exported to GGUF (a temp file beside the target), and that file imported (a staging folder
    beside the run), each counted in a clean run."""
    pytest.importorskip("gguf")
    folder = tmp_path_factory.mktemp("gguf")
    exported = folder / "clean" / "model.gguf"
    with fault_at(None, lambda: None) as calls:
        assert run("export", gpt2_run, "--to", "gguf", "-o", exported).code == 0
    found = {"export": Clean(["export", gpt2_run, "--to", "gguf"], snapshot(exported.parent), calls, exported.parent, None)}
    with fault_at(None, lambda: None) as calls:
        assert run("import", exported, "-o", folder / "imported").code == 0
    found["import"] = Clean(["import", exported], sorted(snapshot(folder / "imported")), calls, folder / "imported", None)
    return found


@pytest.mark.parametrize("kind", ["SIGINT", "SIGTERM", "ENOSPC"])
@pytest.mark.parametrize("direction", ["export", "import"])
def test_a_gguf_export_or_import_leaves_the_folder_as_it_was_on_a_fault(gguf_conversions, tmp_path, rng, kind, direction):
    """As above, for GGUF: no temp file or staging folder is left beside the target either, and an export
    that went through is the clean run's file, byte for byte."""
    clean = gguf_conversions[direction]
    for point in points(clean.calls, kind, 2, rng):
        out = tmp_path / f"at-{point}"
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")
        target = out / "model.gguf" if direction == "export" else out
        with faulted(point, kind) as calls:
            result = run(*clean.args, "-o", target)
        check_end(result, kind, calls)
        where = f"{kind} before call {point} ({calls.faulted})"
        if result.code != 0:
            assert snapshot(out) == {"notes.txt": b"mine\n"}, where
            no_temp_files(tmp_path)
            assert run(*clean.args, "-o", target).code == 0
        no_temp_files(tmp_path)
        if direction == "export":
            assert snapshot(out) == {**clean.state, "notes.txt": b"mine\n"}, where
        else:
            assert sorted(snapshot(out)) == sorted([*clean.state, "notes.txt"]), where


# ---- a real signal at a random moment -------------------------------------------------------------------


def _wait_until_open(process: subprocess.Popen, path: Path, timeout: float = 60.0) -> bool:
    """Wait until the process has `path` open (it is past Python's start and into the command), or has ended."""
    if not Path("/proc/self/fd").is_dir():
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == str(path) for fd in Path(f"/proc/{process.pid}/fd").iterdir()):
                return True
        time.sleep(0.002)
    return False


def test_a_real_signal_at_a_random_moment_of_an_encode(trained_tokenizer, tmp_path, cli):
    signum = random.choice([signal.SIGINT, signal.SIGTERM])
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TINY_TEXT * 7000, encoding="utf-8")  # 2.5 MB: an encode of about half a second
    encode = ["tokenize", "encode", "-t", trained_tokenizer, corpus]
    assert cli(*encode, "-o", tmp_path / "reference").code == 0
    new = shard_state(tmp_path / "reference")
    (tmp_path / "old.txt").write_text(TINY_TEXT, encoding="utf-8")
    assert cli("tokenize", "encode", "-t", trained_tokenizer, "-o", tmp_path / "out", tmp_path / "old.txt").code == 0
    old = shard_state(tmp_path / "out")
    process = subprocess.Popen(
        [sys.executable, "-m", "tfcli", *map(str, encode), "-o", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    started = _wait_until_open(process, corpus)  # a busy machine can take longer to start Python than the encode takes
    delay = random.uniform(0.0, 0.6)
    time.sleep(delay)
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    print(f"{signal.Signals(signum).name} {delay:.2f} s after {'the corpus was opened' if started else 'a wait'}: exit {process.returncode}")
    assert "Traceback" not in err, err
    if process.returncode == -signum:
        # The signal came after the command had finished, while Python was shutting down and had put the
        # default handlers back: the shell reports the same 128 + signum, and the new shards must be whole.
        assert shard_state(tmp_path / "out") == new
    else:
        assert process.returncode in (0, 128 + signum), err
        assert shard_state(tmp_path / "out") in (old, new)
    no_temp_files(tmp_path / "out")


# ---- a disk that fills for real -------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 2 MB tmpfs, where this process may mount one (root); skipped elsewhere."""
    with mounted_tmpfs(tmp_path / "disk", "2m") as disk:
        yield disk


def fill(disk: Path, leave: int) -> None:
    """Take all the free space but `leave` bytes."""
    stats = os.statvfs(disk)
    free = stats.f_bavail * stats.f_frsize
    with open(disk / "filler", "wb") as handle:
        os.posix_fallocate(handle.fileno(), 0, max(free - leave, 0))


def test_a_full_disk_for_real(cli, trained_tokenizer, shards, small_disk, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TINY_TEXT * 40, encoding="utf-8")
    encode = ["tokenize", "encode", "-t", trained_tokenizer, "-o", small_disk / "shards"]
    assert cli(*encode, corpus).code == 0
    old = snapshot(small_disk / "shards")
    fill(small_disk, 20_000)
    corpus.write_text(TINY_TEXT * 400, encoding="utf-8")  # shards of about 100 KB
    result = cli(*encode, corpus)
    assert result.code == 2 and "No space left on device" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert snapshot(small_disk / "shards") == old
    no_temp_files(small_disk)
    (small_disk / "filler").unlink()
    # training: the first checkpoint fits, the next does not
    run_dir = small_disk / "run"
    assert cli(*train_args(shards, "-o", run_dir, "--max-steps", "2")).code == 0
    before = checkpoint_files(run_dir)
    fill(small_disk, 30_000)
    result = cli(*train_args(shards, "-o", run_dir, "--max-steps", "4", "--resume"))
    assert result.code == 2 and "No space left on device" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert checkpoint_files(run_dir) == before
    no_temp_files(run_dir)
    (small_disk / "filler").unlink()
    assert cli(*train_args(shards, "-o", run_dir, "--max-steps", "4", "--resume")).code == 0


# ---- SIGKILL at random moments of training, during saves too, then --resume ----------------------------


def _kill_during_a_save(process: subprocess.Popen, run_dir: Path, timeout: float = 120.0) -> bool:
    """Wait until a save is under way (a save's temp file or trainer.next is in the run folder), then SIGKILL;
    False if the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError):
            if any(p.name.endswith(".tmp") or p.name == "trainer.next" for p in run_dir.iterdir()):
                process.kill()
                return True
        time.sleep(0.0005)
    return False


def test_sigkill_at_random_moments_of_training_then_resume_gives_the_uninterrupted_weights(shards, tmp_path, rng):
    """Five rounds of `train` killed with SIGKILL (odd rounds as soon as a save has begun, even ones at a
    random moment), each followed by --resume (or a new start where no checkpoint was complete yet); the
    last resume runs to the end. The weights equal an uninterrupted run's bit for bit, the metrics too, and
    no temp file is left."""
    from safetensors.torch import load_file

    from tests.training import spawn
    from tfcli.train.state import read_metrics

    args = train_args(shards, "--max-steps", "30", "--save-every", "2", "--eval-every", "6", "--log-every", "1")
    whole = tmp_path / "whole"
    assert run(*args, "-o", whole).code == 0
    broken = tmp_path / "broken"
    for round_ in range(5):
        resume = ["--resume"] if (broken / "config.json").is_file() else []
        process = spawn([*args, "-o", broken, *resume])
        if round_ % 2:
            how = "during a save" if _kill_during_a_save(process, broken) else "(it ended first)"
        else:
            delay = rng.uniform(0.0, 4.0)
            time.sleep(delay)
            process.kill()
            how = f"{delay:.2f} s after its start"
        _, err = process.communicate(timeout=120)
        print(f"round {round_ + 1}: killed {how}, exit {process.returncode}")
        assert "Traceback" not in err, err
    resume = ["--resume"] if (broken / "config.json").is_file() else []
    result = run(*args, "-o", broken, *resume)
    assert result.code == 0, result.stderr
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(broken / "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert [timeless(r) for r in read_metrics(broken / "metrics.jsonl")] == [timeless(r) for r in read_metrics(whole / "metrics.jsonl")]
    no_temp_files(broken)
