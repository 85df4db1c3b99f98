"""docs/development.md says what the code is: its layer list is pyproject.toml's contract, and its module map
names every package and module of tfcli."""

from __future__ import annotations

import re
import sys

from tests.conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PAGE = REPO / "docs" / "development.md"


def block_after(heading: str) -> str:
    """The first fenced block under a `## heading` of the page."""
    section = PAGE.read_text(encoding="utf-8").split(f"## {heading}\n", 1)[1]
    return section.split("```", 2)[1].split("\n", 1)[1]


def test_the_layer_list_is_the_contract():
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    layers = next(contract["layers"] for contract in contracts if contract["type"] == "layers")
    contract = [" | ".join(name.strip().removeprefix("tfcli.") for name in floor.split("|")) for floor in layers]
    assert block_after("The layers").strip().splitlines() == contract


def test_the_module_map_names_every_package_and_module():
    text = block_after("The module map")
    named = set(re.findall(r"\b([a-z_0-9]+)(?:/|\.py\b)", text))
    package = REPO / "tfcli"
    present = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present |= {p.stem for p in package.glob("*.py") if not p.stem.startswith("__")}
    assert present - named == set(), "docs/development.md's module map leaves these out"


def test_every_test_that_starts_torchrun_is_in_the_slow_tier():
    """`pytest -m "not slow"` is the quick loop: it must not start ranks of their own."""
    import ast

    unmarked = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        slow_module = any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets) and "slow" in ast.unparse(node.value)
            for node in tree.body
        )
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            calls = {getattr(call.func, "id", getattr(call.func, "attr", "")) for call in ast.walk(node) if isinstance(call, ast.Call)}
            marked = slow_module or any("mark.slow" in ast.unparse(decorator) for decorator in node.decorator_list)
            if "torchrun" in calls and not marked:
                unmarked.append(f"{path.name}::{node.name}")
    assert not unmarked, "these start torchrun without the slow mark: " + ", ".join(unmarked)


def test_the_docs_site_asks_no_outside_host(tmp_path):
    """The built site works offline: no repository facts fetched from api.github.com (the theme does that
    wherever repo_url is set), no fonts from a CDN."""
    import subprocess
    import sys

    import pytest

    pytest.importorskip("mkdocs", reason="could not import mkdocs")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--site-dir", str(tmp_path / "site"), "-q"], cwd=REPO, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    pages = list((tmp_path / "site").rglob("*.html"))
    assert len(pages) > 20
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert 'data-md-component="source"' not in html, page
        assert "fonts.googleapis.com" not in html and "fonts.gstatic.com" not in html, page
