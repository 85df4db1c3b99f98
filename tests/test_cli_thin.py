"""The CLI layer stays thin: no command function (one typer registers) runs past MAX_LINES lines, counted from
its first decorator to its last line, signature included."""

from __future__ import annotations

import ast

from tests.conftest import REPO

CLI = REPO / "tfcli" / "cli"
MAX_LINES = 80


def _is_command_call(node: ast.expr) -> bool:
    """`something.command(...)` (a typer app's)."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "command"


def _imported_names(tree: ast.Module) -> dict[str, tuple[str, str | None]]:
    """name -> (module file stem in tfcli/cli, function or None for a module): `from tfcli.cli.x import f` and
    `from tfcli.cli import x [as y]`."""
    names: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "tfcli.cli":
            names.update({alias.asname or alias.name: (alias.name, None) for alias in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfcli.cli."):
            stem = node.module.removeprefix("tfcli.cli.")
            names.update({alias.asname or alias.name: (stem, alias.name) for alias in node.names})
    return names


def registered_commands() -> set[tuple[str, str]]:
    """(module stem, function name) of every function typer registers: decorated `@app.command(...)`, or passed
    to `app.command(...)(function)`."""
    found: set[tuple[str, str]] = set()
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = _imported_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(_is_command_call(d) for d in node.decorator_list):
                found.add((path.stem, node.name))
            elif isinstance(node, ast.Call) and _is_command_call(node.func) and len(node.args) == 1:
                target = node.args[0]
                if isinstance(target, ast.Name):
                    stem, name = imported.get(target.id, (path.stem, target.id))
                    found.add((stem, name or target.id))
                elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in imported:
                    found.add((imported[target.value.id][0], target.attr))
    return found


def _function_lengths(stem: str) -> dict[str, int]:
    tree = ast.parse((CLI / f"{stem}.py").read_text(encoding="utf-8"))
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
    assert ("bench_generate", "generate") in commands  # app.command("generate")(generate) in bench.py
    assert ("tokenize_views", "show") in commands  # app.command("show")(show) in tokenize.py
    assert len(commands) >= 25


def test_no_command_function_is_longer_than_the_limit():
    too_long = []
    for stem, name in sorted(registered_commands()):
        lengths = _function_lengths(stem)
        assert name in lengths, f"{name} is registered but not defined at the top of tfcli/cli/{stem}.py"
        if lengths[name] > MAX_LINES:
            too_long.append(f"tfcli/cli/{stem}.py {name}: {lengths[name]} lines")
    assert not too_long, f"command functions over {MAX_LINES} lines (move the work into the library or a helper): {'; '.join(too_long)}"
