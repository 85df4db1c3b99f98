"""MkDocs hook: the reference pages made from the code itself, so they cannot drift from it: Reference > Commands,
one page per command (each command's --help as `tfcli CMD --help` prints it), and Reference > Settings (every
key of the model and training dataclasses, with its default and the comment beside it in the source).
Nothing is written to docs/."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INDEX = "reference/commands.md"
SETTINGS = "reference/settings.md"
FIELD = re.compile(r"^    (?P<name>[a-z_0-9]+): (?P<type>[^=]+?) = (?P<default>.+?)(?:  # (?P<comment>.*))?$")
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
    files.append(File.generated(config, SETTINGS, content=settings_page()))
    for path, command, ctx in found:
        files.append(File.generated(config, f"reference/commands/{slug(path)}.md", content=page(path, command, ctx)))
    return files


def fields(source: Path, class_name: str) -> list[tuple[str, str, str, str]]:
    """(name, type, default, comment) of each field of a dataclass, read from its source lines."""
    lines = source.read_text(encoding="utf-8").splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(f"class {class_name}("))
    found = []
    for line in lines[start + 1 :]:
        if line.startswith("    def ") or (line and not line.startswith(" ")):
            break
        match = FIELD.match(line)
        if match:
            found.append((match["name"], match["type"], match["default"], match["comment"] or ""))
    return found


def settings_page() -> str:
    from tfcli.model.config import PRESETS

    def table(rows):
        rows = [(name, kind.replace("|", "\\|"), default, comment.replace("|", "\\|")) for name, kind, default, comment in rows]
        return "| key | type | default | what it is |\n|---|---|---|---|\n" + "\n".join(
            f"| `{name}` | `{kind}` | `{default}` | {comment} |" for name, kind, default, comment in rows
        )

    presets = "\n".join(f"| `{name}` | " + ", ".join(f"`{k}={v!r}`" for k, v in values.items()) + " |" for name, values in PRESETS.items())
    return (
        "# Settings and config files\n\n"
        "A training run's settings come from a preset, then `--config FILE.toml`, then `--set key=value` (repeatable), then "
        "the plain options (`--max-steps`, `--lr`, ...); the resolved settings are saved in the run's `config.json`. A "
        'config file holds `preset = "NAME"`, a `[model]` and a `[train]` table, or flat keys; `--set` takes `model.` / '
        "`train.` prefixes where a name is in both. `examples/` in the repository holds a config file per preset. This "
        "page is made from the source (`tfcli/model/config.py`, `tfcli/training_config.py`) when the site is built.\n\n"
        '```toml\npreset = "small"\n\n[model]\nn_kv_heads = 2\npositions = "rotary"\n\n[train]\nlr = 3e-3\n'
        'batch_size = 32\ntime_budget = "10m"\n```\n\n'
        f"## Presets\n\n| preset | settings over the model defaults |\n|---|---|\n{presets}\n\n"
        f"## Model keys (`[model]`)\n\n{table(fields(REPO / 'tfcli/model/config.py', 'ModelConfig'))}\n\n"
        f"## Training keys (`[train]`)\n\n{table(fields(REPO / 'tfcli/training_config.py', 'TrainConfig'))}\n"
    )
