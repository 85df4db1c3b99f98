"""`tfcli bench recipe`: the classic training recipe beside the modern one at equal wall time (tfcli.bench.recipe)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.bench.common import machine_line, scratch
from tfcli.cli.common import at_least, counted, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import JsonFlag, Workdir


def recipe(
    texts: Annotated[
        Optional[list[Path]],
        typer.Option("--text", help="A text to train on (repeat for more) [default: the sample stories and Python's language reference].", show_default=False),
    ] = None,
    budget: Annotated[str, typer.Option("--budget", help="Wall-clock training time of every run (90s, 2m).")] = "60s",
    seeds: Annotated[int, typer.Option("--seeds", help="Runs of each recipe on each text, seeds 0..N-1.")] = 3,
    ablate: Annotated[bool, typer.Option("--ablate", help="Also run modern with each of its tricks left out in turn.")] = False,
    threads: Annotated[int, typer.Option("--threads", help="torch threads in every run.")] = 1,
    workdir: Workdir = None,
    json_output: JsonFlag = False,
) -> None:
    """The classic recipe (AdamW, cosine, GELU, LayerNorm, tied head) beside the modern one (Muon, warmup-stable-decay,
    rotary, RMSNorm, QK-norm, ReLU², zero-init projections, untied soft-capped head) at equal wall time.

    Every run trains the one-command path's model (tiny preset, batch 32, lr 3e-3, early stopping) for --budget
    in its own `tfcli train pretrain` process, on the same shards, the recipes interleaved seed by seed. Reports
    each recipe's validation bits per byte of the best checkpoint (mean and spread over seeds), the steps it
    took, and the bits per byte at the last evaluation step every run reached (equal steps). How long: one
    --budget run per text, recipe and seed, each with a few seconds' start: about 13 minutes at the defaults
    (2 texts x 2 recipes x 3 seeds x 60 s); --ablate adds a run per trick and seed.

    \b
    Example: tfcli bench recipe --budget 60s --seeds 3
    """
    from tfcli.bench.recipe import default_texts, run_recipe_bench, summarize
    from tfcli.errors import TfcliError
    from tfcli.quickstart import find_sample_data
    from tfcli.train.command_line import parse_duration

    at_least(1, seeds=seeds, threads=threads)
    seconds = parse_duration(budget)
    for text in texts or []:
        if not text.is_file():
            raise TfcliError(f"--text {text} is not a file", hint="pass a text file to train on")
    runs = []
    with scratch(workdir) as folder:
        chosen = list(texts) if texts else default_texts(folder, find_sample_data() / "corpus" / "stories.txt")
        console = stderr_console()
        with console.status(f"training on {len(chosen)} text(s), {seconds:g} s a run"):
            for run in run_recipe_bench(chosen, folder, budget=seconds, seeds=seeds, ablate=ablate, threads=threads):
                runs.append(run)
                if not json_output:
                    console.print(
                        f"{run.text}  {run.variant:<24} seed {run.seed}: {counted(run.steps, 'step'):>11}, best val {run.best_bpb:.4f} bpb", soft_wrap=True
                    )
    summaries = summarize(runs)
    machine = f"{machine_line()}, {counted(threads, 'thread')} a run"
    if json_output:
        print_json({"machine": machine, "budget_seconds": seconds, "runs": [r.__dict__ for r in runs], "summary": [s.__dict__ for s in summaries]})
        return
    from rich.table import Table

    table = Table(title=f"validation bits per byte after {seconds:g} s of training, {counted(seeds, 'seed')}; {machine}")
    for column in ("text", "recipe", "steps", "best val bpb", "spread", "vs classic", "bpb at equal steps"):
        table.add_column(column, justify="left" if column in ("text", "recipe") else "right")
    for s in summaries:
        table.add_row(
            s.text,
            s.variant,
            f"{s.steps:,.0f}",
            f"{s.best_bpb:.4f}",
            f"{s.spread:.4f}",
            f"{s.versus_classic:+.1%}",
            f"{s.bpb_at_equal_steps:.4f} @ {s.equal_steps}" if s.equal_steps else "-",
        )
    print_table(stdout_console(), table)
