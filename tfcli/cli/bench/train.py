"""`tfcli bench train`: training throughput of tfcli's loop beside a plain loop over transformers' GPT-2 (tfcli.bench.train)."""

from __future__ import annotations

from typing import Annotated

import typer

from tfcli.cli.bench.common import accel_summary, machine_line
from tfcli.cli.common import at_least, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import Device, FirstRun, JsonFlag, Precision, Repeat


def train(
    presets: Annotated[str, typer.Option("--presets", help="Comma-separated decoder presets to measure.")] = "tiny,small",
    batch: Annotated[int, typer.Option(help="Sequences per step (each the preset's block size long).")] = 16,
    steps: Annotated[int, typer.Option(help="Timed steps per run, after 3 warm-up steps.")] = 10,
    repeat: Repeat = 1,
    device: Device = "cpu",
    precision: Precision = "auto",
    first_run: FirstRun = True,
    json_output: JsonFlag = False,
) -> None:
    """Training throughput: tfcli's training loop beside a plain loop over transformers' GPT-2 of the same
    shape, batch and optimizer (AdamW, clipping), on the same random token shards, each in its own process.

    Reports tokens/s and MFU, the model FLOPs per second over the fastest matmul rate measured on the same
    device. Targets: tfcli >= 1.0x the peer's tokens/s on every machine, 1.3x where a library faster than
    PyTorch's default was measured; MFU at small >= 80%.

    \b
    Example: tfcli bench train --presets tiny,small --batch 16
    """

    at_least(1, batch=batch, steps=steps, repeat=repeat)
    from tfcli.bench.train import run_train_bench
    from tfcli.errors import TfcliError
    from tfcli.hf import gpt2_incompatibility
    from tfcli.model.config import preset as make_preset

    names = [p.strip() for p in presets.split(",") if p.strip()]
    if not names:
        raise TfcliError("--presets names no preset", hint="for example --presets tiny,small")
    for name in names:
        problem = gpt2_incompatibility(make_preset(name))
        if problem:
            raise TfcliError(f"preset {name!r} cannot be built as GPT-2: {problem}", hint="use decoder presets such as tiny, small or gpt2-small")
    from tfcli.runtime import resolve_device

    resolve_device(device)  # a device tfcli knows, and there on this machine
    if precision not in ("auto", "fp32", "bf16"):
        raise TfcliError(f"--precision must be auto, fp32 or bf16, not {precision!r}")
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise TfcliError("bench train compares against transformers, which is not installed", hint="pip install transformers") from exc
    with stderr_console().status(f"benchmarking training of {', '.join(names)} at batch {batch}"):
        results = run_train_bench(names, batch, steps, repeat=repeat, device=device, precision=precision, first_run=first_run)
    machine = f"{machine_line()}, device {device}"
    ratios = {
        name: next(r for r in results if r.preset == name and r.implementation == "tfcli").tokens_per_sec
        / next(r for r in results if r.preset == name and r.implementation == "transformers").tokens_per_sec
        for name in names
    }
    if json_output:
        print_json(
            {"machine": machine, "batch": batch, "results": [r.__dict__ for r in results], "throughput_ratio": {k: round(v, 4) for k, v in ratios.items()}}
        )
        return
    from rich.table import Table

    table = Table(title=f"training step, batch {batch} x block size; {machine}")
    for column in ("preset", "implementation", "tokens/s", "MFU", "s / step", "peak RSS", "parameters"):
        table.add_column(column, justify="left" if column in ("preset", "implementation") else "right")
    for r in results:
        table.add_row(
            r.preset, r.implementation, f"{r.tokens_per_sec:,.0f}", f"{r.mfu:.1%}", f"{r.seconds_per_step:.3f}", f"{r.peak_rss_mb:,.0f} MB", f"{r.parameters:,}"
        )
    console = stdout_console()
    print_table(console, table)
    peak = results[0].peak_flops
    console.print(f"peak matmul rate measured: {peak / 1e9:,.1f} GFLOP/s")
    for name, ratio in ratios.items():
        console.print(
            f"{name}: tokens/s ratio tfcli/transformers {ratio:.3f} (target >= 1.0: {'ok' if ratio >= 1.0 else 'MISSED'}; "
            "1.3 where a library faster than PyTorch's default was chosen)"
        )
    console.print(f"tfcli's choices on this machine: {accel_summary()}")
