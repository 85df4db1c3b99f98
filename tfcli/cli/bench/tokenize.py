"""`tfcli bench tokenize`: `tokenize train` and `tokenize encode` timed beside raw `tokenizers` calls (tfcli.bench.tokenize)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tfcli.cli.bench.common import installed, machine_line, scratch
from tfcli.cli.common import human_bytes, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import JsonFlag, Repeat, SampleData, Workdir


def tokenize(
    corpus: Annotated[
        Optional[list[str]], typer.Option("--corpus", help="Text to measure on (repeatable); default: synthesized from sample_data/.", show_default=False)
    ] = None,
    size_mb: Annotated[float, typer.Option(help="Size of the synthesized corpus in MB.")] = 50.0,
    repeat: Repeat = 3,
    workdir: Workdir = None,
    data: SampleData = None,
    json_output: JsonFlag = False,
) -> None:
    """Time `tokenize train` and `tokenize encode` against raw `tokenizers` calls on the same text.

    Targets: train time <= 1.10x raw BpeTrainer; encode throughput >= 2.5x raw encode_batch where tfcli
    encodes with tiktoken (installed, and a byte-level BPE tokenizer), else >= 0.9x; encode peak RSS under 500 MB.

    \b
    Example: tfcli bench tokenize --size-mb 50
    """
    from tfcli.bench.tokenize import run_tokenize_bench
    from tfcli.errors import TfcliError
    from tfcli.quickstart import find_sample_data

    if size_mb <= 0:
        raise TfcliError(f"--size-mb must be positive, not {size_mb}")
    sample = None if corpus else find_sample_data(data) / "corpus"
    with scratch(workdir) as folder, stderr_console().status("benchmarking") as status:
        result = run_tokenize_bench(
            folder, corpus=corpus, size_mb=size_mb, sample=sample, repeat=repeat, progress=lambda job: status.update(f"benchmarking: {job}")
        )
    machine = machine_line()
    if json_output:
        print_json({"machine": machine, **result.to_json()})
        return
    from rich.table import Table

    table = Table(title=f"tokenize bench: {human_bytes(result.corpus_bytes)} ({result.corpus}), best of {result.repeat}; {machine}")
    for column in ("job", "seconds", "MB/s", "tokens", "peak RSS"):
        table.add_column(column, justify="left" if column == "job" else "right")
    names = {
        "train_raw": "train, raw tokenizers",
        "train_tfcli": "train, tfcli",
        "encode_raw": "encode, raw encode_batch",
        "encode_tfcli": "encode, tfcli (to shards)",
    }
    names["encode_tfcli"] = f"encode, tfcli (to shards, {result.encode_tfcli.encoder})"
    for m in (result.train_raw, result.train_tfcli, result.encode_raw, result.encode_tfcli):
        table.add_row(names[m.job], f"{m.seconds:.2f}", f"{m.mb_per_s:.2f}", f"{m.tokens:,}" if m.tokens else "", f"{m.peak_rss_mb:.0f} MB")
    console_out = stdout_console()
    print_table(console_out, table)
    train_ok = "ok" if result.train_ratio <= 1.10 else "MISSED"
    encode_ok = "ok" if result.encode_ratio >= result.encode_target else "MISSED"
    rss_ok = "ok" if result.encode_tfcli.peak_rss_mb < 500 else "MISSED"
    console_out.print(f"train time ratio tfcli/raw: {result.train_ratio:.3f} (target <= 1.10: {train_ok})")
    console_out.print(f"encode throughput ratio tfcli/raw: {result.encode_ratio:.3f} (target >= {result.encode_target:.2f}: {encode_ok})")
    if result.encode_tfcli.encoder != "tiktoken" and not installed("tiktoken"):
        console_out.print(
            "tiktoken is not installed, so tfcli encoded with tokenizers (target >= 0.90); pip install tiktoken for its faster path (target >= 2.50)",
            soft_wrap=True,
        )
    console_out.print(f"encode peak RSS: {result.encode_tfcli.peak_rss_mb:.0f} MB (target < 500 MB: {rss_ok})")
