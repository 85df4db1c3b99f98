"""Shared fixtures: a CLI runner that goes through `main()` (exit codes, error lines), tiny corpora and
a tokenizer trained once per session."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DATA = REPO / "sample_data"

TINY_TEXT = (
    "Once upon a time a little fox found a red ball in the park.\n"
    "The fox was happy, so it played with the ball all day.\n"
    "\n"
    "Tom had three apples. He gave one to Mia because she was hungry.\n"
    '"Thank you!" said Mia. Zoë smiled at the café. 🦊\n'
    "\n"
    "The dog did not like the rain, but the cat liked to watch it fall.\n"
)


# The longest files (subprocesses, torchrun ranks, the benches' workers) go first, so that the workers of
# `-n auto --dist loadfile` end together instead of one of them finishing a long file alone.
RUN_FIRST = (  # by their CPU time in one run (2026-11-28), longest first
    "test_docs_examples.py",
    "test_bench.py",
    "test_train_distributed.py",
    "test_train_resume.py",
    "test_gguf.py",
    "test_tokenizer_corpus.py",
    "test_word2vec.py",
    "test_lora.py",
    "test_quickstart.py",
    "test_gguf_vocab_vectors.py",
    "test_qlora.py",
    "test_sae.py",
    "test_cli_basics.py",
    "test_bounded.py",
    "test_attention_views.py",
    "test_generate_bench.py",
    "test_faults.py",
    "test_chat.py",
    "test_native.py",
    "test_gguf_families.py",
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        name = item.path.name
        return RUN_FIRST.index(name) if name in RUN_FIRST else len(RUN_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order
    if os.environ.get("PYTEST_XDIST_WORKER") and any("llama_cpp_models" in getattr(item, "fixturenames", ()) for item in items):
        _fetch_llama_cpp_models_meanwhile(items[0].config)


@pytest.fixture(autouse=True, scope="session")
def kernel_cache(tmp_path_factory):
    """Build the C code and keep accel's measured choices in one temporary folder for the whole pytest run,
    not the user's cache (commands run as subprocesses inherit it). Under pytest-xdist every worker of the
    run uses the same folder (beside their own temporary folders): the first to need a library builds it
    while the others wait for it (`tfcli.accel.build` locks the build), and a choice one worker measured the
    others read. Tests that break a build set a cache folder of their own."""
    before = os.environ.get("TFCLI_CACHE_DIR")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "tfcli-cache"  # the run's folder, above each worker's
        shared.mkdir(exist_ok=True)
    else:
        shared = tmp_path_factory.mktemp("tfcli-cache")
    os.environ["TFCLI_CACHE_DIR"] = str(shared)
    yield
    if before is None:
        os.environ.pop("TFCLI_CACHE_DIR", None)
    else:
        os.environ["TFCLI_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def llama_cpp_models(kernel_cache) -> Path:
    """llama.cpp's vocabulary files (models/ggml-vocab-*.gguf with their test vectors) and its LICENSE,
    taken from the llama-cpp-python sdist the lock pins, checked against the lock's sha256, once per run's cache
    (tests/llama_cpp_sdist.py). Where pip or the registry cannot be had the tests skip, and fail under CI."""
    from tests.llama_cpp_sdist import Unavailable, models_folder

    try:
        return models_folder(Path(os.environ["TFCLI_CACHE_DIR"]))
    except Unavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and llama.cpp's test data cannot be had: {exc}")
        pytest.skip(f"llama.cpp's test data cannot be had: {exc}")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests' models are tiny: their steps are too short to share between threads, which only wait on
    each other (and on a busy machine far longer than they compute). Tests that are about threads set them
    themselves; subprocesses inherit OMP_NUM_THREADS."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(threads)


def forget_accel() -> None:
    """Drop what tfcli.accel loaded and decided in this process, so the next use builds, checks or reads
    its files again (tests change the settings between uses)."""
    from tfcli.accel import choices, native, products

    native._library, native._problem, native._tried = None, None, False
    products._checked.clear()
    products._decided.clear()
    choices._choices = None


@pytest.fixture(scope="session")
def build_problem(kernel_cache):
    """Why this machine cannot build tfcli's C code (no compiler, no OpenMP, ...), or None: tests that need a
    real build are skipped where it cannot be had, and only there."""
    from tfcli.accel import native

    before = os.environ.pop("TFCLI_NATIVE_KERNELS", None)
    forget_accel()
    reason = native.problem()
    forget_accel()
    if before is not None:
        os.environ["TFCLI_NATIVE_KERNELS"] = before
    return reason


@pytest.fixture
def buildable(build_problem, monkeypatch):
    if build_problem is not None:
        pytest.skip(f"the C code cannot be built here: {build_problem}")
    monkeypatch.delenv("TFCLI_NATIVE_KERNELS", raising=False)
    monkeypatch.delenv("TFCLI_ACCEL", raising=False)
    forget_accel()
    yield
    forget_accel()


@dataclasses.dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys):
    """Run `tfcli ARGS...` in-process through the real entry point; returns code, stdout, stderr."""
    from tfcli.cli.app import main
    from tfcli.cli.common import state

    def run(*args: str) -> CliResult:
        state.debug = False
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return run


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.txt"
    path.write_text(TINY_TEXT * 20, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def trained_tokenizer(tmp_path_factory) -> Path:
    """A byte-level tokenizer (vocab 320) trained on the tiny text; returns its folder."""
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    folder = tmp_path_factory.mktemp("tok")
    corpus = folder / "corpus.txt"
    corpus.write_text(TINY_TEXT * 20, encoding="utf-8")
    train_tokenizer(resolve_corpus([corpus]), folder / "tokenizer", TokenizerTrainingConfig(vocab_size=320))
    return folder / "tokenizer"


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` and its bytes, to prove a failed command changed nothing."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def shards(tmp_path_factory, trained_tokenizer) -> Path:
    """Shards of the tiny text, with the tokenizer beside them (found without --tokenizer)."""
    import shutil

    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.tokenizer.core import TextTokenizer

    folder = tmp_path_factory.mktemp("data")
    corpus = folder / "corpus.txt"
    corpus.write_text(TINY_TEXT * 30, encoding="utf-8")
    shutil.copytree(trained_tokenizer, folder / "tokenizer")
    encode_corpus(resolve_corpus([corpus]), TextTokenizer.load(folder / "tokenizer"), folder / "shards", val_fraction=0.2)
    return folder / "shards"


@pytest.fixture(scope="module")
def reviews(tmp_path_factory) -> Path:
    """A labeled set a tiny model can learn: the label is whether the text mentions the fox."""
    import random

    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("labeled")
    lines = []
    for i in range(120):
        fox = i % 2 == 0
        words = rng.sample(["the", "dog", "ball", "park", "rain", "cat", "apple", "day"], 4)
        words.insert(rng.randrange(5), "fox" if fox else "tom")
        lines.append(json.dumps({"text": " ".join(words), "label": "fox" if fox else "other"}))
    path = folder / "reviews.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


MISSING_TOOL = ("could not import", "is not installed", "cannot be built")


def _missing_tool(reason: str) -> bool:
    return bool(os.environ.get("CI")) and any(words in reason for words in MISSING_TOOL)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped while it is collected (a module-level `pytest.importorskip`)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _missing_tool(str(report.longrepr)):
        report.outcome = "failed"
        report.longrepr = f"CI is set and a tool this module needs is missing: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI a test skipped for a missing outside tool fails instead: CI installs every tool
    (`.ci/run`), and the outside clients are the point of those tests."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and call.excinfo is not None:
        reason = str(call.excinfo.value)
        if _missing_tool(reason):
            report.outcome = "failed"
            report.longrepr = f"CI is set and a tool this test needs is missing: {reason}"


_SESSION_START = [0.0]


def pytest_sessionstart(session):
    import time

    _SESSION_START[0] = time.monotonic()


def _fetch_llama_cpp_models_meanwhile(config) -> None:
    """Under pytest-xdist, where a worker's tests include one that needs llama.cpp's test data, start downloading
    it into the workers' shared cache folder (the `kernel_cache` fixture's) in a thread, while the tests run, so
    that the first test to need it does not wait on the registry. The thread holds the file lock the fixture takes,
    so a test that needs the files sooner waits for this download rather than starting another (and the other
    worker's thread finds them there); a failure here is left to the fixture, which tries again and says why."""
    import threading

    from tests.llama_cpp_sdist import models_folder

    shared = config._tmp_path_factory.getbasetemp().parent / "tfcli-cache"  # as `kernel_cache` names it

    def fetch() -> None:
        try:
            shared.mkdir(exist_ok=True)
            models_folder(shared)
        except Exception:  # the fixture reports it: the tests that need the files skip, or fail under CI
            pass

    threading.Thread(target=fetch, name="llama.cpp test data", daemon=True).start()


def pytest_terminal_summary(terminalreporter):
    """One line for .ci/run's log: how many tests ran and the suite's wall time (the budget is 6 minutes of
    pytest on 2 idle cores)."""
    import time

    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    counts = {key: len(terminalreporter.stats.get(key, [])) for key in ("passed", "failed", "skipped", "error")}
    ran = counts["passed"] + counts["failed"]
    workers = getattr(terminalreporter.config.option, "numprocesses", None) or 1
    terminalreporter.write_line(
        f"suite: {ran} tests ran ({counts['skipped']} skipped, {counts['error']} errors) in {time.monotonic() - _SESSION_START[0]:.0f} s of pytest, {workers} worker(s), {os.cpu_count()} cores"
    )
