"""`tfcli eval RUN --data ...`: score a run on held-out data; `tfcli eval RUN --tasks ...`: lm-eval's tasks on it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import at_least, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import Device, JsonFlag
from tfcli.cli.sae import SaeOption, evaluate_sae_command

EvalData = Annotated[
    Optional[Path],
    typer.Option(
        "--data",
        help="A shard folder, a text file (or folder of them), or a labeled set (JSON lines, CSV or Parquet; read with the field names the run was fine-tuned with), or conversations for a chat run.",
        show_default=False,
    ),
]

Tasks = Annotated[
    Optional[str],
    typer.Option(
        "--tasks",
        help="lm-eval tasks, comma-separated: tfcli's own (tfcli_story_choice, tfcli_last_word, tfcli_dates, or tfcli for all three), those in --include-path, or the harness's registry (offline: local data only).",
        show_default=False,
    ),
]

IncludePath = Annotated[Optional[list[Path]], typer.Option("--include-path", help="A folder of lm-eval task .yaml files (repeatable).", show_default=False)]

TrustRemoteCode = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code",
        help="Run the code an --include-path folder's task files name (!function, class:, metrics from HF evaluate) and let them read data outside the folder. Without it such a folder is refused.",
    ),
]

NumFewshot = Annotated[Optional[int], typer.Option("--num-fewshot", help="Examples before each question [default: each task's own].", show_default=False)]

ChatTemplatePrompts = Annotated[bool, typer.Option("--chat-template", help="Write each prompt with the run's chat template (few-shot examples as turns).")]

MaxBatches = Annotated[Optional[int], typer.Option("--max-batches", help="Stop after this many batches [default: all the data].", show_default=False)]


def evaluate(
    runs: Annotated[list[Path], typer.Argument(help="The run directory to score (several with --compare).", show_default=False)],
    data: EvalData = None,
    sae: SaeOption = None,
    tasks: Tasks = None,
    include_path: IncludePath = None,
    trust_remote_code: TrustRemoteCode = False,
    num_fewshot: NumFewshot = None,
    limit: Annotated[
        Optional[int], typer.Option("--limit", help="Score only the first N documents of each task [default: every document].", show_default=False)
    ] = None,
    chat_template: ChatTemplatePrompts = False,
    compare: Annotated[bool, typer.Option("--compare", help="Score several runs on the same --tasks and show one table.")] = False,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the harness's results JSON here (with --tasks).", show_default=False)] = None,
    split: Annotated[str, typer.Option("--split", help="Which shard split to score: val or train.")] = "val",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Windows, examples or requests per forward pass.")] = 16,
    max_batches: MaxBatches = None,
    device: Device = "auto",
    json_output: JsonFlag = False,
) -> None:
    """Loss, perplexity and bits per byte of a language model on shards or text; accuracy and macro-F1 of
    a classifier (or the loss of an encoder-decoder) on a labeled set (JSON lines, CSV or Parquet); the
    loss per assistant token and the share of replies exactly right of a chat run on conversations.
    With --tasks: EleutherAI's lm-evaluation-harness tasks (multiple choice, last word, generation),
    offline; `tfcli eval RUN --tasks tfcli` runs tfcli's three, `--compare RUN_A RUN_B` puts runs side by side.

    \b
    Example: tfcli eval runs/quickstart/model --data runs/quickstart/shards
    """
    from tfcli.errors import TfcliError

    at_least(1, batch_size=batch_size, max_batches=max_batches, limit=limit)
    if num_fewshot is not None and num_fewshot < 0:
        raise TfcliError(f"--num-fewshot must be 0 or more, not {num_fewshot}")
    if (data is None) == (tasks is None):
        raise TfcliError("pass --data (loss, perplexity, accuracy) or --tasks (lm-eval tasks), one of the two")
    if sae is not None:  # an SAE's metrics on the run (cli/sae.py)
        return evaluate_sae_command(runs, sae, data, tasks, device, json_output)
    if len(runs) > 1 and not compare:
        raise TfcliError(f"{len(runs)} runs given", hint="pass one run, or --compare RUN_A RUN_B ... with --tasks")
    if tasks is not None:
        if max_batches is not None or split != "val":
            raise TfcliError("--split and --max-batches go with --data", hint="with --tasks, --limit N scores the first N documents")
        from tfcli.cli.evaluate_tasks import evaluate_tasks_command

        evaluate_tasks_command(
            runs, tasks, include_path or [], num_fewshot, limit, batch_size, chat_template, compare, output, device, json_output, trust_remote_code
        )
        return
    if compare or include_path or num_fewshot is not None or limit is not None or chat_template or output is not None or trust_remote_code:
        raise TfcliError("--compare, --include-path, --trust-remote-code, --num-fewshot, --limit, --chat-template and -o go with --tasks")
    from tfcli.train.evaluate import evaluate_run

    run = runs[0]
    if split not in ("val", "train"):
        raise TfcliError(f"--split must be val or train, not {split!r}")
    _refuse_a_batch_memory_cannot_hold(run, batch_size)
    result = evaluate_run(run, data, split=split, batch_size=batch_size, max_batches=max_batches, device=device)
    if "note" in result:
        stderr_console().print(f"note: {result['note']}", markup=False, highlight=False)
    if json_output:
        print_json(result)
        return
    _print_result(result)


def _refuse_a_batch_memory_cannot_hold(run: Path, batch_size: int) -> None:
    """A language model's logits for one batch of windows (batch x block size x vocabulary floats) past this
    machine's memory end in the kernel's kill; counted low (the logits alone), so only a batch that surely fails
    is refused."""
    from tfcli.errors import TfcliError
    from tfcli.rundir import read_run_config
    from tfcli.runtime import physical_memory

    model = read_run_config(run).model
    total, need = physical_memory(), 4 * batch_size * model.block_size * model.vocab_size
    if total and need > total and not model.n_classes:
        raise TfcliError(
            f"--batch-size {batch_size:,} windows of {model.block_size:,} tokens need {need / 1e9:,.1f} GB for their logits alone; "
            f"this machine has {total / 1e9:,.1f} GB",
            hint="use a smaller --batch-size (the default is 16)",
        )


def _print_result(result: dict) -> None:
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    names = {"loss": "loss (nats)", "ppl": "perplexity", "bpb": "bits per byte", "accuracy": "accuracy", "macro_f1": "macro-F1"}
    for key in ("run", "data", "split", "task", "tokens", "examples"):
        if key in result:
            table.add_row(key, f"{result[key]:,}" if isinstance(result[key], int) else str(result[key]))
    for key, name in names.items():
        if key in result:
            table.add_row(name, f"{result[key]:.4f}")
    print_table(stdout_console(), table)
