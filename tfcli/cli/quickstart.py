"""`tfcli quickstart`: run the chain on sample_data/ and say what to run next."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import at_least, stderr_console, stdout_console
from tfcli.cli.options import Device

PIPED_EVERY_S = 10.0


def quickstart(
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for everything the chain makes.")] = Path("runs/quickstart"),
    data: Annotated[
        Optional[Path],
        typer.Option(
            help="The data folder: corpus/ (text) and, for the classifier, reviews.jsonl; a step whose data is missing is skipped with a line (default: ./sample_data, else the one beside the tfcli sources).",
            show_default=False,
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Redo every step, even those whose output is already there.")] = False,
    steps: Annotated[int, typer.Option("--steps", help="Pretraining steps for the tiny decoder (fewer: faster and rougher).")] = 400,
    classifier_steps: Annotated[int, typer.Option("--classifier-steps", help="Fine-tuning steps for the review classifier.")] = 200,
    device: Device = "auto",
) -> None:
    """Run the whole chain on sample_data/: train a tokenizer, encode the stories into shards, pretrain the
    tiny decoder on them, and fine-tune a review classifier from it: about a minute on 2 CPU cores.

    Steps whose output is already there are kept, so a second run is instant; --force redoes them. A
    training step that was interrupted resumes where it stopped.

    \b
    Example: tfcli quickstart
    """
    at_least(1, steps=steps, classifier_steps=classifier_steps)
    import time

    from rich.text import Text

    from tfcli.quickstart import QuickstartSkip, QuickstartStep, find_sample_data, run_quickstart
    from tfcli.runtime import keep_freed_memory
    from tfcli.train.events import Started, StepDone

    keep_freed_memory()  # as `tfcli train` sets it for its process
    console = stdout_console()
    data_dir = find_sample_data(data)
    skipped = set()
    said = stderr_console()
    piped = not said.is_terminal  # no spinner there: a line every PIPED_EVERY_S seconds of training instead
    last_said = 0.0
    with said.status("running the quickstart chain") as status:
        for event in run_quickstart(data_dir, output, force=force, pretrain_steps=steps, classifier_steps=classifier_steps, device=device):
            if isinstance(event, QuickstartStep):
                line = Text(f"{'made' if event.made else 'kept'} ", style="green" if event.made else "dim")
                line.append(f"{event.name:<10} ", style="bold")
                line.append(f"{event.path}  ")
                line.append(event.detail, style="dim")
                console.print(line, soft_wrap=True)
            elif isinstance(event, QuickstartSkip):
                skipped.add(event.name)
                line = Text("skipped ", style="yellow")
                line.append(f"{event.name:<10} ", style="bold")
                line.append(event.reason)
                console.print(line, soft_wrap=True)
            elif isinstance(event, Started):
                name, total = event.run_dir.name, event.max_steps
                status.update(f"training {name} ({event.parameters:,} parameters)")
                if piped:
                    said.print(Text(f"training {name}: {event.parameters:,} parameters, {total:,} steps"), soft_wrap=True)
                    last_said = time.monotonic()
            elif isinstance(event, StepDone):
                progress = f"training {name}: step {event.step:,} of {total:,}, {event.tokens_per_sec:,.0f} tokens/s, about {event.remaining or 0:.0f} s left"
                status.update(progress)
                if piped and time.monotonic() - last_said >= PIPED_EVERY_S:
                    said.print(Text(progress), soft_wrap=True)
                    last_said = time.monotonic()
    console.print(Text("next:", style="bold"))
    for command in (
        f'tfcli generate {output / "model"} --prompt "Once upon a time"',
        f'tfcli inspect-attention {output / "model"} --text "The fox saw the ball and it rolled away."',
        *([] if "classifier" in skipped else [f'tfcli generate {output / "classifier"} --classify "The zipper was horrible."']),
        f"tfcli info {output / 'model'}",
        'tfcli tokenize trace "a sailor went to sea sea sea " --merges 5',
    ):
        console.print(Text(f"  {command}"), soft_wrap=True)  # unwrapped, so it can be copied
