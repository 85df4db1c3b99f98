"""`tfcli quickstart`: run the chain on sample_data/ and say what to run next."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import stdout_console


def quickstart(
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for everything the chain makes.")] = Path("runs/quickstart"),
    data: Annotated[Optional[Path], typer.Option(help="The sample data folder (default: ./sample_data, else the one beside the tfcli sources).", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Redo every step, even those whose output is already there.")] = False,
) -> None:
    """Run the whole chain on sample_data/: train a tokenizer, encode the corpus into shards.

    Steps whose output is already there are kept, so a second run is instant; --force redoes them.

    Example: tfcli quickstart
    """
    from rich.text import Text

    from tfcli.quickstart import find_sample_data, run_quickstart

    console = stdout_console()
    data_dir = find_sample_data(data)
    with console.status("running the quickstart chain"):
        for step in run_quickstart(data_dir, output, force=force):
            line = Text(f"{'made' if step.made else 'kept'} ", style="green" if step.made else "dim")
            line.append(f"{step.name:<10} ", style="bold")
            line.append(f"{step.path}  ")
            line.append(step.detail, style="dim")
            console.print(line)
    console.print(Text("next:", style="bold"))
    tokenizer = output / "tokenizer"
    for command in (
        f'tfcli tokenize show "Once upon a time, a little fox found a red ball." -t {tokenizer}',
        'tfcli tokenize trace "a sailor went to sea sea sea " --merges 5',
    ):
        console.print(Text(f"  {command}"), soft_wrap=True)  # unwrapped, so it can be copied
