"""`tfcli eval --tasks`: the harness's results rendered: its own table for one run, one table across runs with
--compare, its results JSON with --json or -o. Imported by the eval command's body only (lm_eval is heavy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfcli.cli.common import print_table, stderr_console, stdout_console, write_stdout

HIGHER_IS_BETTER = {True: "↑", False: "↓"}


def evaluate_tasks_command(
    runs: list[Path],
    tasks: str,
    include_paths: list[Path],
    num_fewshot: int | None,
    limit: int | None,
    batch_size: int,
    chat_template: bool,
    compare: bool,
    output: Path | None,
    device: str,
    json_output: bool,
    trust_remote_code: bool = False,
) -> None:
    import importlib.util

    from tfcli.errors import TfcliError

    if importlib.util.find_spec("lm_eval") is None:
        raise TfcliError("--tasks needs EleutherAI's lm-evaluation-harness, which is not installed", hint="pip install 'tfcli[eval]'")
    if compare and len(runs) < 2:
        raise TfcliError("--compare needs two runs or more", hint="tfcli eval --compare RUN_A RUN_B --tasks ...")
    from tfcli.harness.evaluate import TaskOptions, compare_runs, evaluate_tasks, results_json
    from tfcli.harness.tasks import split_names
    from tfcli.inspect.session import check_output

    options = TaskOptions(tuple(split_names(tasks)), tuple(include_paths), num_fewshot, limit, batch_size, chat_template, trust_remote_code=trust_remote_code)
    if output is not None:
        check_output(output)  # before the scoring, which can take hours
    stderr_console().print(f"scoring {', '.join(options.tasks)} ...", markup=False, highlight=False)
    if compare:
        by_run = compare_runs(runs, options, device=device)
        text = "{\n" + ",\n".join(f"  {_json_key(run)}: " + _indented(results_json(r)) for run, r in by_run.items()) + "\n}\n"
        _write(output, text)
        if json_output:
            write_stdout(text)
        else:
            print_table(stdout_console(), _comparison_table(by_run))
        return
    results = evaluate_tasks(runs[0], options, device=device)
    text = results_json(results)
    _write(output, text)
    if json_output:
        write_stdout(text)
        return
    from lm_eval.utils import make_table

    write_stdout(make_table(results) + "\n")
    if results.get("groups"):
        write_stdout(make_table(results, "groups") + "\n")


def _write(output: Path | None, text: str) -> None:
    if output is None:
        return
    from tfcli.inspect.session import write_output

    write_output(output, text)
    stderr_console().print(f"wrote {output}", markup=False, highlight=False)


def _json_key(run: str) -> str:
    import json

    return json.dumps(run, ensure_ascii=False)


def _indented(text: str) -> str:
    return text.rstrip("\n").replace("\n", "\n  ")


def _column_names(runs: list[str]) -> list[str]:
    """The runs as the shortest names that tell them apart: their paths below the folder they share.

    Example: ["/tmp/a/runs/gpt2", "/tmp/a/runs/llama/best"] -> ["gpt2", "llama/best"]"""
    import os

    try:
        shared = os.path.commonpath([os.path.abspath(run) for run in runs])
    except ValueError:  # different drives
        return runs
    names = [os.path.relpath(os.path.abspath(run), shared) for run in runs]
    return runs if "." in names or len(set(names)) < len(names) else names


def _comparison_table(by_run: dict[str, dict[str, Any]]):
    """One row per (task, filter, metric), one column per run; the best value of a row in bold."""
    from rich.table import Table
    from rich.text import Text

    from tfcli.harness.evaluate import metric_rows

    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("task")
    table.add_column("n-shot", justify="right")
    table.add_column("metric")
    for name in _column_names(list(by_run)):
        table.add_column(Text(name), justify="right", overflow="fold")
    values: dict[tuple[str, str, str], dict[str, float]] = {}
    for run, results in by_run.items():
        for task, filter_name, metric, value, _ in metric_rows(results):
            values.setdefault((task, filter_name, metric), {})[run] = value
    first = next(iter(by_run.values()))
    for (task, filter_name, metric), row in values.items():
        higher = first.get("higher_is_better", {}).get(task, {}).get(metric)
        best = None
        if higher is not None and row:
            best = (max if higher else min)(row.values())
        name = metric if filter_name == "none" else f"{metric} ({filter_name})"
        cells = [Text(f"{row[run]:.4f}", style="bold" if row.get(run) == best and len(row) > 1 else "") if run in row else Text("-") for run in by_run]
        table.add_row(Text(task), str(first.get("n-shot", {}).get(task, "")), Text(f"{name} {HIGHER_IS_BETTER.get(higher, '')}".rstrip()), *cells)
    return table
