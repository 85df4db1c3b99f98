"""Reading the examples out of a Markdown page and checking a command's output against what the page shows.

The convention (docs/development.md says it for authors): a fenced block whose info string is `console` is an
example; each line starting with `$ ` is a command, the lines under it are its expected output; `...` on a line
of its own stands for any number of lines, and ` ...` at the end of a line for the rest of that line (a
timing, say); numbers may differ by 10% (or by one unit of their last digit). Output is compared word by
word, so a line wrapped at another terminal width still matches.
Markers in HTML comments steer the test:

- `<!-- docs-test: needs quickstart -->` as the page's first line: the page's folder gets a small
  `runs/quickstart` first (TINY_QUICKSTART's settings, made once per test session);
- `<!-- docs-test: skip REASON -->` on the line before a block: the block is not run (a download, a GPU);
- a `pycon` block (`>>> ` lines and what they print) runs as a doctest in the page's folder;
- `<!-- docs-test: tiny FLAGS -->` on the line before a block: its `tfcli` commands run with FLAGS added
  (fewer steps) and the output the page shows is an example from the full run, not compared;
- `<!-- docs-test: unchecked REASON -->` on the line before a block: it runs, but its output (a machine's
  description, timings) is not compared.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from pathlib import Path

TINY_QUICKSTART = ("--steps", "60", "--classifier-steps", "20")  # what `needs quickstart` and the README's tour run
MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<kind>[a-z-]+)\s*(?P<rest>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[\w-]*)")
NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
RELATIVE_TOLERANCE = 0.10


@dataclasses.dataclass
class Command:
    line: str  # as the page writes it, without the `$ `
    expected: list[str]  # the lines the page shows under it
    page_line: int


@dataclasses.dataclass
class Block:
    commands: list[Command]
    skip: str | None = None  # the reason, when a marker says not to run it
    tiny: tuple[str, ...] | None = None  # flags added to each tfcli command; output not compared
    session: str | None = None  # a `pycon` block: a Python session, run as a doctest
    page_line: int = 0


@dataclasses.dataclass
class Page:
    path: Path
    needs_quickstart: bool
    blocks: list[Block]


def read_page(path: Path) -> Page:
    lines = path.read_text(encoding="utf-8").splitlines()
    first = MARKER.match(lines[0]) if lines else None
    needs_quickstart = bool(first and first["kind"] == "needs" and first["rest"] == "quickstart")
    blocks: list[Block] = []
    marker = None
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            found = MARKER.match(lines[i].strip())
            if found and i > 0:
                marker = found
            elif lines[i].strip():
                marker = None
            i += 1
            continue
        indent, close = fence["indent"], fence["fence"]
        body, start = [], i + 1
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(close):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1
        if fence["info"] in ("console", "pycon"):
            block = Block(_commands(body, start), page_line=start)
            if fence["info"] == "pycon":
                block = Block([], session="\n".join(body) + "\n", page_line=start)
            if marker is not None:
                if marker["kind"] == "skip":
                    block.skip = marker["rest"] or "the page says so"
                elif marker["kind"] == "tiny":
                    block.tiny = tuple(shlex.split(marker["rest"]))
                elif marker["kind"] == "unchecked":
                    block.tiny = ()
                else:
                    raise ValueError(f"{path}:{start}: unknown docs-test marker {marker['kind']!r}")
            blocks.append(block)
        marker = None
    return Page(path, needs_quickstart, blocks)


def _commands(body: list[str], start: int) -> list[Command]:
    commands: list[Command] = []
    for n, line in enumerate(body):
        if line.startswith("$ "):
            commands.append(Command(line[2:].strip(), [], start + n + 1))
        elif commands:
            commands[-1].expected.append(line.rstrip())
    for command in commands:
        while command.expected and not command.expected[-1].strip():
            command.expected.pop()
    return commands


def tfcli_args(line: str) -> list[str] | None:
    """The arguments of a plain `tfcli ...` line, to run in this process; None when it needs a shell."""
    if not line.startswith("tfcli ") or "$" in line or "`" in line:
        return None
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    args = list(lexer)
    if any(arg and set(arg) <= set("|&;<>()") for arg in args):
        return None
    return shlex.split(line)[1:]


def output_differs(expected: list[str], actual: list[str]) -> str | None:
    """None when `actual` is what the page shows; else both. Compared word by word, so a line that a
    narrower terminal wraps still matches; `...` (a line, or a line's end) stands for any words."""
    items: list[str | None] = []  # None: any number of words
    for line in expected:
        if line.strip() == "...":
            items.append(None)
        elif line.rstrip().endswith(" ..."):
            items.extend([*line.rstrip()[:-4].split(), None])
        else:
            items.extend(line.split())
    words = " ".join(actual).split()
    at = {0}
    for item in items:
        if item is None:
            at = set(range(min(at), len(words) + 1)) if at else at
        else:
            at = {p + 1 for p in at if p < len(words) and lines_match(item, words[p])}
    if len(words) in at:
        return None
    return "expected:\n" + "\n".join(expected) + "\n\ngot:\n" + "\n".join(actual)


def lines_match(want: str, have: str) -> bool:
    """The same text around the numbers, and each number within 10% (or one unit of its last shown digit)."""
    if NUMBER.sub("#", want) != NUMBER.sub("#", have):
        return False
    return all(_close(a, b) for a, b in zip(NUMBER.findall(want), NUMBER.findall(have)))


def _close(want: str, have: str) -> bool:
    a, b = float(want.replace(",", "")), float(have.replace(",", ""))
    decimals = len(want.split(".")[1]) if "." in want and "e" not in want.lower() else 0
    unit = 10.0**-decimals
    return math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE) or abs(a - b) <= unit + 1e-12
