"""MkDocs hook: Reference > Commands, one page per command, made from the CLI itself (each command's --help as
`tfcli CMD --help` prints it), so the reference cannot drift from the code. Nothing is written to docs/."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INDEX = "reference/commands.md"
HELP_WIDTH = 100
_found: list = []  # on_config reads the CLI, on_files writes its pages


def commands() -> list[tuple[str, object, object]]:
    """(`tfcli name ...`, click command, its click context) for every command that runs something, in the
    order `tfcli --help` lists them."""
    import typer

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tfcli.cli.app import app

    found = []

    def walk(command, ctx):
        if hasattr(command, "list_commands"):  # a group (typer carries its own copy of click)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, sub.context_class(sub, info_name=name, parent=ctx, terminal_width=HELP_WIDTH, max_content_width=HELP_WIDTH))
        else:
            found.append((ctx.command_path, command, ctx))

    root = typer.main.get_command(app)
    walk(root, root.context_class(root, info_name="tfcli", terminal_width=HELP_WIDTH, max_content_width=HELP_WIDTH))
    return found


def slug(command_path: str) -> str:
    return command_path.removeprefix("tfcli ").replace(" ", "-")


def page(command_path: str, command, ctx) -> str:
    summary = command.get_short_help_str(limit=300)
    return f"# `{command_path}`\n\n{summary}\n\n```text\n$ {command_path} --help\n{command.get_help(ctx).rstrip()}\n```\n"


def index(found) -> str:
    rows = "\n".join(f"| [`{path}`](commands/{slug(path)}.md) | {command.get_short_help_str(limit=120)} |" for path, command, _ in found)
    return (
        "# Commands\n\nEvery command, with its `--help` as the command prints it (these pages are made from the CLI when the "
        "site is built). Exit codes: 0 success, 1 `tfcli info` found a problem, 2 a user error (one red line: what is "
        "wrong and what to do), 130 Ctrl-C, 143 SIGTERM. `tfcli --debug CMD` shows the traceback of an error.\n\n"
        f"| command | what it does |\n|---|---|\n{rows}\n"
    )


def on_config(config, **kwargs):
    """Put a page per command under the nav's `Commands` entry."""
    _found[:] = commands()
    found = _found
    entries = [INDEX, *({path: f"reference/commands/{slug(path)}.md"} for path, _, _ in found)]

    def expand(items):
        for n, item in enumerate(items):
            if isinstance(item, dict):
                for title, value in item.items():
                    if value == INDEX:
                        items[n] = {title: entries}
                    elif isinstance(value, list):
                        expand(value)

    expand(config["nav"])
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    found = _found
    files.append(File.generated(config, INDEX, content=index(found)))
    for path, command, ctx in found:
        files.append(File.generated(config, f"reference/commands/{slug(path)}.md", content=page(path, command, ctx)))
    return files
