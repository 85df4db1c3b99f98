"""`tfcli eval RUN --tasks ...`: lm-eval's tasks on a run, offline, through the harness's own evaluator, and
the same tasks across several runs. Returns the harness's results dictionary; the CLI renders it."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import platform
import subprocess
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from tfcli import __version__
from tfcli.errors import TfcliError
from tfcli.harness.sandbox import sandboxed_templates
from tfcli.harness.tasks import SHIPPED_TASKS, check_tasks, go_offline, load_tasks, task_manager
from tfcli.rundir import read_run_config

BOOTSTRAP_ITERS = 1000  # resamples for the standard error of a non-mean metric (perplexity); the harness's 100,000 take minutes


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    tasks: tuple[str, ...]
    include_paths: tuple[Path, ...] = ()
    num_fewshot: int | None = None
    limit: int | None = None
    batch_size: int = 16
    chat_template: bool = False
    log_samples: bool = False  # keep each document's requests and responses under results["samples"]
    trust_remote_code: bool = False  # run the code an --include-path folder's task files name (!function, class:)


def check_decoder(run: Path) -> None:
    """Only a decoder (a language model) runs the harness's tasks; said before anything heavy loads."""
    config = read_run_config(Path(run))
    if config.model.arch != "decoder":
        raise TfcliError(f"{run} is an {config.model.arch}; lm-eval tasks score a decoder (a language model)", hint="evaluate a decoder run")


def prepare(options: TaskOptions):
    """(the task manager, the loaded and checked tasks) for these options: an --include-path folder's code
    refused and its data kept inside it unless trust_remote_code; templates rendered in the sandbox throughout;
    with --limit, a local JSON-lines task's first rows read, not its whole files."""
    go_offline()
    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # the harness's info lines would bury the table
    confined = bool(options.include_paths) and not options.trust_remote_code
    manager = task_manager(options.tasks, options.include_paths, trust_remote_code=options.trust_remote_code)
    folders = [SHIPPED_TASKS, *options.include_paths] if confined else None
    tasks = load_tasks(manager, options.tasks, folders, limit=options.limit, num_fewshot=options.num_fewshot)  # --limit: first rows only
    check_tasks(tasks, options.num_fewshot, options.limit)
    return manager, tasks


def run_harness(lm, options: TaskOptions, prepared=None) -> dict[str, Any]:
    """The harness's evaluator on `lm` (any lm-eval model object), on tasks `prepare` made for it (built
    afresh when not given: a task keeps the requests of the model it ran on)."""
    from lm_eval import simple_evaluate

    manager, tasks = prepared if prepared is not None else prepare(options)
    # the harness prints its bootstrap notes on stdout (where --json goes), lets git complain on stderr, and
    # runs `pip list` and more for its environment record (seconds): the same record, asked quietly and briefly
    quiet = contextlib.ExitStack()
    quiet.enter_context(contextlib.redirect_stdout(io.StringIO()))
    quiet.enter_context(mock.patch("lm_eval.evaluator.get_git_commit_hash", _git_commit))
    quiet.enter_context(mock.patch("lm_eval.evaluator.add_env_info", _add_env_info))
    # its bootstrap (one chunk of BOOTSTRAP_ITERS) would fork a pool from a process that runs torch's threads,
    # the server's or the tokenizer's: a fork can inherit a held lock and hang; in this process it cannot
    quiet.enter_context(mock.patch.dict(os.environ, {"DISABLE_MULTIPROC": "1"}))
    quiet.enter_context(sandboxed_templates())  # prompts, targets, choices and descriptions are rendered here too
    with quiet:
        results = simple_evaluate(
            model=lm,
            tasks=tasks,
            num_fewshot=options.num_fewshot,
            limit=options.limit,
            task_manager=manager,
            log_samples=options.log_samples,
            bootstrap_iters=BOOTSTRAP_ITERS,
            apply_chat_template=options.chat_template,
            fewshot_as_multiturn=options.chat_template,
        )
    if results is None:
        raise TfcliError("the harness returned no results")
    return results


def _git_commit() -> str | None:
    """What the harness records as the git commit of the current folder, asked quietly."""
    try:
        return subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def _add_env_info(storage: dict[str, Any]) -> None:
    """The harness's environment record (versions, the machine), without its `pip list` and compiler probes."""

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "N/A"

    storage.update(
        {
            "pretty_env_info": f"PyTorch {torch.__version__}, Python {platform.python_version()}, {platform.platform()}, {platform.machine()}, tfcli {__version__}",
            "transformers_version": installed("transformers"),
            "lm_eval_version": installed("lm_eval"),
            "upper_git_hash": None,
        }
    )


def evaluate_tasks(run: Path, options: TaskOptions, *, device: str = "auto") -> dict[str, Any]:
    """The harness's results dictionary for one run."""
    check_decoder(run)
    prepared = prepare(options)  # a broken task is said before the run loads
    from tfcli.harness.model import TfcliLM  # noqa: PLC0415  lm_eval's model classes: after the tasks are checked

    lm = TfcliLM(run, batch_size=options.batch_size, device=device)
    if options.chat_template:
        lm.template  # noqa: B018  a run without a chat template is said before any scoring
    return run_harness(lm, options, prepared)


def compare_runs(runs: Sequence[Path], options: TaskOptions, *, device: str = "auto") -> dict[str, dict[str, Any]]:
    """Each run's results on the same tasks, by run path (every run checked before the first is scored)."""
    for run in runs:
        check_decoder(run)
    prepare(options)
    return {str(run): evaluate_tasks(run, options, device=device) for run in runs}


def metric_rows(results: dict[str, Any]) -> list[tuple[str, str, str, float, float | None]]:
    """(task, filter, metric, value, stderr) for every metric the harness reported, in its order.

    Example: {"results": {"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": 0.1}}} -> [("t", "none", "acc", 0.5, 0.1)]"""
    rows = []
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or metric.endswith("_stderr") or not isinstance(value, (int, float)):
                continue
            stderr = metrics.get(f"{metric}_stderr,{filter_name}")
            rows.append((task, filter_name, metric, float(value), stderr if isinstance(stderr, (int, float)) else None))
    return rows


def results_json(results: dict[str, Any]) -> str:
    """The harness's results file: everything but the per-document samples, as the harness writes it."""
    from lm_eval.utils import handle_non_serializable

    kept = {k: v for k, v in results.items() if k != "samples"}
    return json.dumps(kept, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n"
