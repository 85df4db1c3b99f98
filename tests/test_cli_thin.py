"""The CLI layer stays thin: no command function (one typer registers) runs past MAX_LINES lines, counted from
its first decorator to its last line, signature included."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

CLI = REPO / "tfcli" / "cli"
MAX_LINES = 80


def _is_command_call(node: ast.expr) -> bool:
    """`something.command(...)` (a typer app's)."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "command"


def _module(path: Path) -> str:
    """A file's module below tfcli.cli: tfcli/cli/train.py -> "train", tfcli/cli/bench/generate.py -> "bench.generate",
    tfcli/cli/bench/__init__.py -> "bench"."""
    parts = path.relative_to(CLI).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _file(module: str) -> Path:
    """The file of a module below tfcli.cli (a package's __init__.py)."""
    folder = CLI.joinpath(*module.split("."))
    return folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")


def _imported_names(tree: ast.Module) -> dict[str, tuple[str, str | None]]:
    """name -> (module below tfcli.cli, function or None for a module): `from tfcli.cli.x import f`,
    `from tfcli.cli.x.y import f` and `from tfcli.cli import x [as y]`."""
    names: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "tfcli.cli":
            names.update({alias.asname or alias.name: (alias.name, None) for alias in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfcli.cli."):
            stem = node.module.removeprefix("tfcli.cli.")
            names.update({alias.asname or alias.name: (stem, alias.name) for alias in node.names})
    return names


def registered_commands() -> set[tuple[str, str]]:
    """(module below tfcli.cli, function name) of every function typer registers: decorated `@app.command(...)`,
    or passed to `app.command(...)(function)`."""
    found: set[tuple[str, str]] = set()
    for path in sorted(CLI.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = _imported_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(_is_command_call(d) for d in node.decorator_list):
                found.add((_module(path), node.name))
            elif isinstance(node, ast.Call) and _is_command_call(node.func) and len(node.args) == 1:
                target = node.args[0]
                if isinstance(target, ast.Name):
                    stem, name = imported.get(target.id, (_module(path), target.id))
                    found.add((stem, name or target.id))
                elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in imported:
                    found.add((imported[target.value.id][0], target.attr))
    return found


def _function_lengths(module: str) -> dict[str, int]:
    tree = ast.parse(_file(module).read_text(encoding="utf-8"))
    lengths = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lengths[node.name] = node.end_lineno - first + 1
    return lengths


def test_the_walk_finds_the_commands_both_ways_of_registering():
    commands = registered_commands()
    assert ("train", "pretrain") in commands  # @app.command("pretrain")
    assert ("generate", "generate") in commands  # app.command("generate")(generate.generate) in app.py
    assert ("bench.generate", "generate") in commands  # app.command("generate")(generate) in bench/__init__.py
    assert ("tokenize_views", "show") in commands  # app.command("show")(show) in tokenize.py
    assert len(commands) >= 25


def test_no_command_function_is_longer_than_the_limit():
    too_long = []
    for module, name in sorted(registered_commands()):
        lengths = _function_lengths(module)
        where = _file(module).relative_to(REPO)
        assert name in lengths, f"{name} is registered but not defined at the top of {where}"
        if lengths[name] > MAX_LINES:
            too_long.append(f"{where} {name}: {lengths[name]} lines")
    assert not too_long, f"command functions over {MAX_LINES} lines (move the work into the library or a helper): {'; '.join(too_long)}"
