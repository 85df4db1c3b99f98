"""`tfcli bench eval`: tfcli's lm-eval model class beside the harness's own `hf` model, scoring the same task's
requests on the same run (tfcli.bench.eval)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.bench.common import machine_line, require_peer, scratch
from tfcli.cli.common import at_least, counted, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import JsonFlag, Repeat, Workdir


def eval_(
    run: Annotated[Path, typer.Argument(help="The decoder run to score.", show_default=False)],
    task: Annotated[str, typer.Option("--task", help="A log-likelihood or multiple-choice lm-eval task.")] = "tfcli_story_choice",
    limit: Annotated[int, typer.Option("--limit", help="Documents of the task whose requests are scored.")] = 100,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Requests per forward pass, for both models.")] = 16,
    threads: Annotated[int, typer.Option("--threads", help="Threads of each scoring process.")] = 1,
    repeat: Repeat = 1,
    workdir: Workdir = None,
    json_output: JsonFlag = False,
) -> None:
    """Scoring speed of `tfcli eval --tasks` beside the harness's own `hf` model: the task's requests (its
    documents' contexts and choices) scored on the run by tfcli's model class and by `hf` on the run exported
    with `tfcli export --to hf`, each in its own process with the same threads. Reports CPU seconds and
    requests per CPU second of both, and the ratio (target: tfcli >= 2x).

    \b
    Example: tfcli bench eval runs/quickstart/model --task tfcli_story_choice --limit 100
    """
    at_least(1, limit=limit, batch_size=batch_size, threads=threads, repeat=repeat)
    require_peer("bench eval", "lm-eval")
    from tfcli.bench.eval import run_eval_bench

    with scratch(workdir, "eval") as folder, stderr_console().status(f"scoring {task} ({counted(limit, 'document')}) with tfcli and with lm-eval's hf model"):
        result = run_eval_bench(run, task, limit, batch_size, threads, repeat, folder)
    machine = f"{machine_line()}, device cpu, {counted(threads, 'thread')}"
    if json_output:
        print_json(
            {
                "machine": machine,
                "run": str(run),
                "task": task,
                "limit": limit,
                "batch_size": batch_size,
                "tfcli": result.tfcli.__dict__,
                "hf": result.hf.__dict__,
                "speedup": round(result.speedup, 4),
            }
        )
        return
    from rich.table import Table

    table = Table(title=f"{task}, {counted(result.tfcli.requests, 'request')}, batch {batch_size}; {machine}")
    for column in ("model", "CPU s", "requests / CPU s", "wall s", "peak RSS"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for m, label in ((result.tfcli, "tfcli (shared scorer)"), (result.hf, "lm-eval hf (exported run)")):
        table.add_row(label, f"{m.cpu_seconds:.2f}", f"{m.requests_per_cpu_second:,.1f}", f"{m.wall_seconds:.2f}", f"{m.peak_rss_mb:,.0f} MB")
    console = stdout_console()
    print_table(console, table)
    console.print(f"tfcli / hf, requests per CPU second: {result.speedup:.2f}x (target >= 2: {'ok' if result.speedup >= 2 else 'MISSED'})")
