"""`tfcli eval RUN --data ...`: score a run on held-out data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import JsonFlag, at_least, print_json, print_table, stderr_console, stdout_console


def evaluate(
    run: Annotated[Path, typer.Argument(help="The run directory to score.", show_default=False)],
    data: Annotated[
        Path,
        typer.Option(
            "--data",
            help="A shard folder, a text file (or folder of them), or a labeled set (JSON lines, CSV or Parquet; read with the field names the run was fine-tuned with), or conversations for a chat run.",
            show_default=False,
        ),
    ],
    split: Annotated[str, typer.Option("--split", help="Which shard split to score: val or train.")] = "val",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Windows or examples per forward pass.")] = 16,
    max_batches: Annotated[
        Optional[int], typer.Option("--max-batches", help="Stop after this many batches [default: all the data].", show_default=False)
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto (a GPU if there is one), cpu, cuda, cuda:N or mps.")] = "auto",
    json_output: JsonFlag = False,
) -> None:
    """Loss, perplexity and bits per byte of a language model on shards or text; accuracy and macro-F1 of
    a classifier (or the loss of an encoder-decoder) on a labeled set (JSON lines, CSV or Parquet); the
    loss per assistant token and the share of replies exactly right of a chat run on conversations.

    \b
    Example: tfcli eval runs/quickstart/model --data runs/quickstart/shards
    """
    from rich.table import Table

    from tfcli.errors import TfcliError
    from tfcli.train.evaluate import evaluate_run

    at_least(1, batch_size=batch_size, max_batches=max_batches)
    if split not in ("val", "train"):
        raise TfcliError(f"--split must be val or train, not {split!r}")
    result = evaluate_run(run, data, split=split, batch_size=batch_size, max_batches=max_batches, device=device)
    if "note" in result:
        stderr_console().print(f"note: {result['note']}", markup=False, highlight=False)
    if json_output:
        print_json(result)
        return
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
