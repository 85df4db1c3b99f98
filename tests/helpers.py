"""Helpers the tests share that the library has no use for: documents joined from their pieces, `--help`
checked for heavy imports, the page's weights unpacked as the browser does, a headless Chromium to look at
a page with, and `run`, a command in-process with a real process's streams (for module-scoped fixtures too,
where the `cli` fixture cannot go)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest


def heavy_imports_of(args: list[str], heavy: tuple[str, ...]) -> list[str]:
    """The modules of `heavy` that `tfcli ARGS...` (e.g. a --help) imports, run in a fresh interpreter."""
    code = (
        "import sys\n"
        "from tfcli.cli.app import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        f"print('HEAVY=' + ','.join(m for m in {heavy!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    return [m for m in done.stdout.strip().splitlines()[-1].removeprefix("HEAVY=").split(",") if m]


def join_documents(pieces) -> list[str]:
    """The documents that `DocumentPiece`s spell, each joined from its pieces; the last piece ends one."""
    documents, current = [], ""
    for piece in pieces:
        current += piece.text
        if piece.ends_document:
            documents.append(current)
            current = ""
    assert current == ""
    return documents


def unpack_weights(data: list[str], shape: tuple[int, int, int, int], causal: bool) -> np.ndarray:
    """The inverse of `tfcli.inspect.html.pack_weights` (what the page does): float32 [L, H, T, S]."""
    _, H, T, S = shape
    out = np.zeros(shape, dtype=np.float32)
    rows, cols = np.tril_indices(T)
    for layer, chunk in enumerate(data):
        raw = np.frombuffer(zlib.decompress(base64.b64decode(chunk)), dtype=np.uint8).astype(np.float32) / 255.0
        raw = raw * raw
        if causal and T == S:
            out[layer][:, rows, cols] = raw.reshape(H, -1)
        else:
            out[layer] = raw.reshape(H, T, S)
    return out


def chromium() -> str | None:
    """A headless-capable Chromium or Chrome on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def in_ci() -> bool:
    """CI sets CI (GitHub Actions, GitLab, .ci/run): there a missing outside tool fails its tests instead of skipping them."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def missing_tool(reason: str) -> NoReturn:
    """An outside tool this test needs is missing: the test fails under CI (.ci/run installs every one), and skips
    elsewhere (a developer's machine without the extra)."""
    if in_ci():
        pytest.fail(f"CI is set and a tool this test needs is missing: {reason}")
    pytest.skip(reason)


def force_quant_path(name: str, monkeypatch) -> str:
    """Force accel's block products onto SIMD path `name` for one test: a path this processor lacks is skipped (and
    named); one it has must build (under CI; elsewhere a missing compiler skips, as `missing_tool` does)."""
    from tfcli.accel import quant

    if not quant.runnable(name):
        pytest.skip(f"this processor lacks {', '.join(quant.PATHS[name][1])}")
    if quant.kernel(name) is None:
        missing_tool(f"this processor runs {name} but its kernels did not build: {quant.problem(name)}")
    monkeypatch.setenv(quant.FORCE_VARIABLE, name)
    return name


def one_line(result, *needles: str) -> str:
    """Exit 2 and a single `error:` line on stderr holding each needle."""
    assert result.code == 2 and "Traceback" not in result.stderr, (result.code, result.stderr[-2000:])
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    return result.stderr


# Without CI a test that needs the browser is skipped where there is none; in CI it runs, and `browse` fails it.
needs_chromium = pytest.mark.skipif(chromium() is None and not in_ci(), reason="Chromium is not installed")


# node runs the pages' scripts outside a browser: skipped where it is missing, except in CI (.ci/run installs nodejs).
needs_node = pytest.mark.skipif(shutil.which("node") is None and not in_ci(), reason="node is not installed")


def require(module: str):
    """The outside client `module`, imported; missing, the test fails under CI and skips elsewhere (`missing_tool`)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        missing_tool(f"{module} is not installed (pip install {module}, or the lock: requirements/test.txt)")


def require_chromium() -> str:
    """The browser, or a skip (a failure in CI: .ci/run installs Debian's chromium)."""
    browser = chromium()
    if browser is None:
        if in_ci():
            pytest.fail("Chromium is not installed, and CI needs it for the browser tests: apt-get install -y chromium")
        missing_tool("Chromium is not installed")
    return browser


_PROBE = """<script>setTimeout(function () {
  var result;
  try { result = JSON.stringify((function () { %s })()); } catch (err) { result = JSON.stringify({ error: String(err) }); }
  var out = document.createElement("pre");
  out.id = "tfcli-probe";
  out.textContent = result;
  document.body.appendChild(out);
}, 1500);</script>
"""


def browse(page: Path, probe: str, *, size: tuple[int, int] = (1400, 1000), timeout: float = 120, console: list[str] | None = None) -> tuple[Path, Any]:
    """Open `page` in headless Chromium at `size` (CSS pixels): take a screenshot beside it (PAGE.png), and
    run `probe`, the body of a JavaScript function returning JSON-able data, once the page has drawn; returns
    the screenshot and the probe's result. The probe runs in a copy of the page (the page stays as written;
    a page whose policy allows no script gets `script-src 'unsafe-inline'` in the copy, and nothing else).
    `console`: a list that gets every console message of the page as it was written (errors, a blocked
    fetch of anything), from the screenshot's run.

    Skips the calling test where Chromium is not installed (fails it in CI). With TFCLI_SCREENSHOTS=DIR the screenshot is
    also copied into DIR, for a person to look at.
    """
    browser = require_chromium()
    profile = Path(tempfile.mkdtemp(prefix="tfcli-chromium-"))
    base = [
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={size[0]},{size[1]}",
        "--virtual-time-budget=10000",
        "--enable-logging=stderr",
        "--v=0",
    ]
    try:
        png = page.with_suffix(".png")
        shot = subprocess.run([*base, f"--screenshot={png}", page.resolve().as_uri()], capture_output=True, text=True, timeout=timeout, check=False)
        assert png.is_file(), shot.stderr[-2000:]
        if console is not None:
            console.extend(line for line in shot.stderr.splitlines() if ":CONSOLE" in line)
        probed = page.with_name(page.stem + "-probe.html")
        text = page.read_text(encoding="utf-8")
        if "script-src" not in text:
            text = text.replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';", 1)
        body, end, rest = text.rpartition("</body>")
        probed.write_text(body + _PROBE % probe + end + rest, encoding="utf-8")
        dump = subprocess.run([*base, "--dump-dom", probed.resolve().as_uri()], capture_output=True, text=True, timeout=timeout, check=False)
        found = re.search(r'<pre id="tfcli-probe">(.*?)</pre>', dump.stdout, re.DOTALL)
        assert found, dump.stderr[-2000:]
        result = json.loads(html.unescape(found.group(1)))
        assert not (isinstance(result, dict) and "error" in result and len(result) == 1), result
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    keep = os.environ.get("TFCLI_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)
    return png, result


@dataclasses.dataclass
class Ran:
    code: int
    stdout: bytes  # a file name that is not UTF-8 goes out as its own bytes, as `ls` prints it
    stderr: str

    def json(self):
        return json.loads(self.stdout.decode("utf-8"))  # JSON escapes such names: it is always UTF-8


def run(*args) -> Ran:
    """`tfcli ARGS` in-process, with the streams a UTF-8 terminal gives a process (stdout strict, stderr with
    backslash escapes); an exception other than SystemExit escapes to the test, as a traceback would."""
    from tfcli.cli.app import main
    from tfcli.cli.common import state

    state.debug = False
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Ran(code, out.buffer.getvalue(), err.buffer.getvalue().decode("utf-8"))


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, size: str):
    """A tmpfs of `size` (`2m`, `256k`) mounted at `folder`, where this process may mount one (root on Linux);
    the test is skipped elsewhere. A disk that fills for real."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root on Linux")
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def ddp_start_up_broadcast(model, inputs=None) -> tuple[list, object]:
    """What DDP sends from rank 0 as tfcli's trainer wraps `model` (tfcli.train.setup.wrapped): the tensors its
    start-up broadcast carries, with the wrapped model. One rank of a gloo group in this process; with `inputs`
    (ids), a forward and backward through the wrapper runs before the group ends."""
    import torch
    import torch.distributed as dist

    from tfcli.train.distributed import World
    from tfcli.train.setup import wrapped
    from tfcli.training_config import TrainConfig

    sent: list = []
    broadcast = dist._broadcast_coalesced

    def recorded(group, tensors, *args):
        sent.extend(tensors)
        return broadcast(group, tensors, *args)

    dist._broadcast_coalesced = recorded
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp, _ = wrapped(model, TrainConfig(task="lm"), World(0, 2, 0), torch.device("cpu"), fsdp=False)
        if inputs is not None:
            ddp(inputs).logits.sum().backward()
    finally:
        dist.destroy_process_group()
        dist._broadcast_coalesced = broadcast
    return sent, ddp
