"""Every example in the README and the documentation runs, in page order, in a fresh folder holding
sample_data/, and prints what the page shows (tests/docs_examples.py reads the pages)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLE_DATA
from tests.docs_examples import TINY_QUICKSTART, Page, lines_match, output_differs, read_page, tfcli_args

pytestmark = pytest.mark.slow  # the real commands on sample_data/

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
RUNNABLE = [page for page in PAGES if any(block.commands or block.session for block in read_page(page).blocks)]


@pytest.fixture(scope="session")
def quickstarts(tmp_path_factory):
    """`tfcli quickstart` lines already run this session: the arguments, the folder made, the output."""
    return {"folder": tmp_path_factory.mktemp("docs-quickstarts"), "made": {}}


def run_line(line: str, folder: Path, quickstarts: dict, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    args = tfcli_args(line)
    if args is None:
        command = line + (" " + " ".join(extra) if extra and line.startswith("tfcli ") else "")
        return _in_shell(command, folder)
    args = [*args, *extra]
    if args and args[0] == "quickstart":
        return _quickstart(args, folder, quickstarts)
    return _in_process(args, folder)


def _in_process(args: list[str], folder: Path) -> tuple[int, str]:
    from tfcli.cli.app import main
    from tfcli.cli.common import state

    state.debug = False
    said = io.StringIO()
    before = Path.cwd()
    os.chdir(folder)
    code = 0
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            main(args)
    except SystemExit as ended:
        code = ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1)
    finally:
        os.chdir(before)
    return code, said.getvalue()


def _in_shell(line: str, folder: Path) -> tuple[int, str]:
    define = f'tfcli() {{ "{sys.executable}" -m tfcli "$@"; }}; '
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(["bash", "-c", define + line], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def _quickstart(args: list[str], folder: Path, quickstarts: dict) -> tuple[int, str]:
    """The same quickstart on the sample data twice in a session is made once: a copy of the first one's
    folder goes where the page wants it, with what it printed."""
    out = args[args.index("-o") + 1] if "-o" in args else "runs/quickstart"
    key = tuple(a for a in args if a != out)
    if key in quickstarts["made"] and not (folder / out).exists():
        said, made = quickstarts["made"][key]
        shutil.copytree(made, folder / out)
        return 0, said
    code, said = _in_process(args, folder)
    if code == 0 and "--data" not in args and key not in quickstarts["made"]:
        made = quickstarts["folder"] / f"q{len(quickstarts['made'])}"
        shutil.copytree(folder / out, made)
        quickstarts["made"][key] = (said, made)
    return code, said


def run_session(session: str, folder: Path, name: str) -> str:
    """A `pycon` block as a doctest, in the page's folder; returns the report of what failed ('' when none)."""
    import doctest

    test = doctest.DocTestParser().get_doctest(session, {}, name, name, 0)
    report = io.StringIO()
    runner = doctest.DocTestRunner(verbose=False, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    before = Path.cwd()
    os.chdir(folder)
    try:
        runner.run(test, out=report.write)
    finally:
        os.chdir(before)
    return report.getvalue()


def page_folder(page: Page, tmp_path: Path, quickstarts: dict) -> Path:
    shutil.copytree(SAMPLE_DATA, tmp_path / "sample_data")
    if page.needs_quickstart:
        code, said = run_line("tfcli quickstart " + " ".join(TINY_QUICKSTART), tmp_path, quickstarts)
        assert code == 0, said
    return tmp_path


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: str(p.relative_to(REPO)))
def test_the_page_prints_what_it_shows(path: Path, tmp_path, quickstarts, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    page = read_page(path)
    folder = page_folder(page, tmp_path, quickstarts)
    ran = 0
    for block in page.blocks:
        if block.skip:
            continue
        if block.session is not None:
            failures = run_session(block.session, folder, f"{path.relative_to(REPO)}:{block.page_line}")
            assert not failures, failures
            ran += 1
        for command in block.commands:
            code, said = run_line(command.line, folder, quickstarts, block.tiny or ())
            where = f"{path.relative_to(REPO)}:{command.page_line}: $ {command.line}"
            assert code == 0, f"{where}\nexit code {code}\n{said}"
            if block.tiny is None:
                differs = output_differs(command.expected, said.splitlines())
                assert differs is None, f"{where}\n{differs}"
            ran += 1
    assert ran, f"{path} has examples but all of them are skipped"


def test_the_comparison_holds_numbers_to_ten_percent():
    assert lines_match("loss 2.00  lr 3.0e-03", "loss 2.15  lr 3.2e-03")
    assert not lines_match("loss 2.00", "loss 2.30")
    assert not lines_match("loss 2.00 nats", "loss 2.00 bits")
    assert lines_match("+0.001", "+0.002")  # one unit of the last digit shown
    assert lines_match("108,608 train", "110,000 train")
    assert output_differs(["step 10 loss 6.80 ...", "step 20 ..."], ["step 10  loss 6.71  lr 3e-3  2,100 tok/s", "step 20 loss 1"]) is None
    assert output_differs(["step 10 loss 6.80 ..."], ["step 10  loss 5.71  lr 3e-3"]) is not None
    assert output_differs(["a b c d"], ["a b", "c d"]) is None  # wrapped by a narrower terminal
    assert output_differs(["a 1", "...", "z 2"], ["a 1", "b", "c", "z 2"]) is None
    assert output_differs(["a 1", "z 2"], ["a 1", "b", "z 2"]) is not None
    assert output_differs(["a 1"], ["a 1", "more"]) is not None


def test_markers_are_read(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- docs-test: needs quickstart -->\n# P\n\n<!-- docs-test: skip a download -->\n```console\n$ tfcli import x\n```\n\n"
        "<!-- docs-test: tiny --steps 2 -->\n```console\n$ tfcli quickstart\nmade...\n```\n\n```console\n$ tfcli info a\nrun a\n\n$ ls | wc -l\n3\n```\n"
    )
    read = read_page(page)
    assert read.needs_quickstart
    assert [b.skip for b in read.blocks] == ["a download", None, None]
    assert read.blocks[1].tiny == ("--steps", "2")
    assert [(c.line, c.expected) for c in read.blocks[2].commands] == [("tfcli info a", ["run a"]), ("ls | wc -l", ["3"])]
    assert run_session(">>> 1 + 1\n2\n", tmp_path, "right") == ""
    assert "Expected:" in run_session(">>> 1 + 1\n3\n", tmp_path, "wrong")
    assert tfcli_args("tfcli info a") == ["info", "a"]
    assert tfcli_args('tfcli generate r -p "Once upon a time"') == ["generate", "r", "-p", "Once upon a time"]
    assert tfcli_args('tfcli inspect-attention r --text "$(sed -n 1p x)"') is None


def test_ci_runs_exactly_the_readmes_test_command():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = readme.split("Install and run the tests", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0].strip()
    ci = [line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines() if line.startswith("python3 -m pip")]
    assert ci == [command]
    assert "--require-hashes --no-deps -r requirements/test.txt" in command  # the test tools from the lock (tests/test_lock.py)
    assert "mkdocs build --strict" in command and "apt-get install -y chromium" in command
