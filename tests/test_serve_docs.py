"""The serving examples of the README and docs/serve.md (blocks under `<!-- docs-test: serve -->`), run as
written against `tfcli serve` on a free port: curl's commands in a shell, the `openai` client's code in
Python. Only the port changes (8000 in the pages); the run served is a tiny chat run, under the folder name
the example asks for (`model`, or `chat`)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import missing_tool
from tests.serving import make_chat_run, running_server

openai = pytest.importorskip("openai")

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "docs" / "serve.md"]
MARKER = "<!-- docs-test: serve -->"
PAGE_URL = "http://127.0.0.1:8000"


def serve_blocks(path: Path) -> list[tuple[str, str, int]]:
    """(info string, body, line) of each fenced block right under the marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() == MARKER:
            fence = lines[i + 1]
            assert fence.startswith("```"), f"{path}:{i + 2}: the marker is not above a block"
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            blocks.append((fence[3:].strip(), "\n".join(lines[i + 2 : end]), i + 3))
    return blocks


def curl_commands(body: str) -> list[str]:
    """The block's curl commands, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", "", body)
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("curl ")]


BLOCKS = [(path, *block) for path in PAGES for block in serve_blocks(path)]


def test_the_pages_have_serve_examples():
    kinds = {(path.name, info) for path, info, _, _ in BLOCKS}
    assert {("README.md", "bash"), ("README.md", "python"), ("serve.md", "bash"), ("serve.md", "python")} <= kinds


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    chat = make_chat_run(tmp_path_factory, trained_tokenizer)
    folder = tmp_path_factory.mktemp("served")
    return {name: Path(shutil.copytree(chat, folder / name)) for name in ("model", "chat")}


@pytest.mark.parametrize(("path", "info", "body", "line"), BLOCKS, ids=[f"{p.name}:{line}" for p, _, _, line in BLOCKS])
def test_the_example_runs_as_written(path, info, body, line, runs):
    name = "chat" if 'model="chat"' in body or '"model": "chat"' in body else "model"
    with running_server(runs[name]) as server:
        here = body.replace(PAGE_URL, server.url)
        if info == "bash":
            commands = curl_commands(here)
            assert commands, f"{path.name}:{line}: no curl command"
            for command in commands:
                if shutil.which("curl") is None:
                    missing_tool("curl is not installed")
                done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
                assert done.returncode == 0, done.stderr
                if '"stream": true' in command:
                    events = [e for e in done.stdout.splitlines() if e.startswith("data: ")]
                    assert events[-1] == "data: [DONE]" and len(events) > 2, done.stdout[-500:]
                else:
                    answer = json.loads(done.stdout)
                    assert answer["object"] == "text_completion" and answer["choices"][0]["text"], answer
        else:
            assert info == "python", f"{path.name}:{line}: a serve example is bash or python"
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(here, f"{path.name}:{line}", "exec"), {"__name__": "__docs__"})
            assert printed.getvalue().strip(), f"{path.name}:{line} printed nothing"
