"""`tfcli bench`: speed on this machine, side by side with peers, as ratios measured in one run."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import JsonFlag, human_bytes, print_json, stderr_console, stdout_console

app = typer.Typer(help="Measure tfcli's speed beside its peers (ratios from one run, on this machine).", no_args_is_help=True, rich_markup_mode=None)


@app.command("tokenize")
def tokenize(
    corpus: Annotated[Optional[list[str]], typer.Option("--corpus", help="Text to measure on (repeatable); default: synthesized from sample_data/.", show_default=False)] = None,
    size_mb: Annotated[float, typer.Option(help="Size of the synthesized corpus in MB.")] = 50.0,
    repeat: Annotated[int, typer.Option(help="Rounds of all four jobs, interleaved; each job keeps its best time.")] = 3,
    workdir: Annotated[Optional[Path], typer.Option(help="Scratch folder (default: a temporary one, removed afterwards).", show_default=False)] = None,
    data: Annotated[Optional[Path], typer.Option(help="Sample data to synthesize from (default: ./sample_data).", show_default=False)] = None,
    json_output: JsonFlag = False,
) -> None:
    """Time `tokenize train` and `tokenize encode` against raw `tokenizers` calls on the same text.

    Targets: train time <= 1.10x raw BpeTrainer; encode throughput >= 0.9x raw encode_batch;
    encode peak RSS under 500 MB.

    Example: tfcli bench tokenize --size-mb 50
    """
    import os
    import shutil
    import tempfile

    from tfcli.bench.tokenize import run_tokenize_bench
    from tfcli.errors import TfcliError
    from tfcli.quickstart import find_sample_data

    if size_mb <= 0:
        raise TfcliError(f"--size-mb must be positive, not {size_mb}")
    sample = None if corpus else find_sample_data(data) / "corpus"
    scratch = Path(tempfile.mkdtemp(prefix="tfcli-bench-")) if workdir is None else workdir
    console = stderr_console()
    try:
        with console.status("benchmarking") as status:
            result = run_tokenize_bench(scratch, corpus=corpus, size_mb=size_mb, sample=sample, repeat=repeat,
                                        progress=lambda job: status.update(f"benchmarking: {job}"))
    finally:
        if workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    if json_output:
        print_json({"machine": machine, **result.to_json()})
        return
    from rich.table import Table

    table = Table(title=f"tokenize bench: {human_bytes(result.corpus_bytes)} ({result.corpus}), best of {result.repeat}; {machine}")
    for column in ("job", "seconds", "MB/s", "tokens", "peak RSS"):
        table.add_column(column, justify="left" if column == "job" else "right")
    names = {"train_raw": "train, raw tokenizers", "train_tfcli": "train, tfcli", "encode_raw": "encode, raw encode_batch", "encode_tfcli": "encode, tfcli (to shards)"}
    for m in (result.train_raw, result.train_tfcli, result.encode_raw, result.encode_tfcli):
        table.add_row(names[m.job], f"{m.seconds:.2f}", f"{m.mb_per_s:.2f}", f"{m.tokens:,}" if m.tokens else "", f"{m.peak_rss_mb:.0f} MB")
    console_out = stdout_console()
    console_out.print(table)
    train_ok = "ok" if result.train_ratio <= 1.10 else "MISSED"
    encode_ok = "ok" if result.encode_ratio >= 0.9 else "MISSED"
    rss_ok = "ok" if result.encode_tfcli.peak_rss_mb < 500 else "MISSED"
    console_out.print(f"train time ratio tfcli/raw: {result.train_ratio:.3f} (target <= 1.10: {train_ok})")
    console_out.print(f"encode throughput ratio tfcli/raw: {result.encode_ratio:.3f} (target >= 0.90: {encode_ok})")
    console_out.print(f"encode peak RSS: {result.encode_tfcli.peak_rss_mb:.0f} MB (target < 500 MB: {rss_ok})")


@app.command("model")
def model(
    preset: Annotated[str, typer.Option(help="The model shape (a preset name).")] = "gpt2-small",
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 4,
    length: Annotated[int, typer.Option(help="Tokens per sequence.")] = 256,
    steps: Annotated[int, typer.Option(help="Timed steps per implementation (best kept), after one warm-up step.")] = 3,
    json_output: JsonFlag = False,
) -> None:
    """Time one training step (forward + backward, fp32 on CPU) of tfcli's model beside transformers' GPT-2.

    Both build the same shape from the preset (which must be GPT-2-expressible), each in its own
    process; the table gives seconds per step and peak memory. Target: tfcli <= 0.8x the time.

    Example: tfcli bench model --preset gpt2-small --batch 4 --length 256
    """
    import os

    from tfcli.bench.model import run_model_bench
    from tfcli.errors import TfcliError
    from tfcli.hf import gpt2_incompatibility
    from tfcli.model.config import preset as make_preset

    shape = make_preset(preset)
    problem = gpt2_incompatibility(shape)
    if problem:
        raise TfcliError(f"preset {preset!r} cannot be built as GPT-2: {problem}", hint="use a decoder preset such as gpt2-small or tiny")
    if min(batch, length, steps) < 1:
        raise TfcliError("--batch, --length and --steps must be at least 1")
    if length > shape.block_size:
        raise TfcliError(f"--length {length} is longer than {preset}'s block size ({shape.block_size})", hint=f"pass --length {shape.block_size} or less")
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise TfcliError("bench model compares against transformers, which is not installed", hint="pip install transformers") from exc
    with stderr_console().status(f"benchmarking {preset} at {batch} x {length}"):
        results = run_model_bench(preset, batch, length, steps)
    ours, theirs = results
    ratio = ours.seconds_per_step / theirs.seconds_per_step
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    if json_output:
        print_json({"machine": machine, "preset": preset, "batch": batch, "length": length,
                    "results": [r.__dict__ for r in results], "time_ratio": round(ratio, 4),
                    "memory_ratio": round(ours.peak_rss_mb / theirs.peak_rss_mb, 4)})
        return
    from rich.table import Table

    table = Table(title=f"{preset}, batch {batch} x {length} tokens, forward + backward, fp32; {machine}")
    for column in ("implementation", "s / step", "peak RSS", "parameters"):
        table.add_column(column, justify="left" if column == "implementation" else "right")
    for r in results:
        table.add_row(r.implementation, f"{r.seconds_per_step:.3f}", f"{r.peak_rss_mb:,.0f} MB", f"{r.parameters:,}")
    console = stdout_console()
    console.print(table)
    console.print(f"time ratio tfcli/transformers: {ratio:.3f} (target <= 0.80: {'ok' if ratio <= 0.8 else 'MISSED'})")
    console.print(f"peak memory ratio tfcli/transformers: {ours.peak_rss_mb / theirs.peak_rss_mb:.3f} (target <= 1.00)")
