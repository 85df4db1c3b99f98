"""`tfcli bench train`: training throughput of tfcli's loop beside a plain loop over transformers' GPT-2 (tfcli.bench.train)."""

from __future__ import annotations

from typing import Annotated

import typer

from tfcli.cli.bench.common import accel_summary, machine_line, require_peer
from tfcli.cli.common import at_least, counted, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import Device, FirstRun, JsonFlag, Precision, Repeat


def train(
    presets: Annotated[str, typer.Option("--presets", help="Comma-separated decoder presets to measure.")] = "tiny,small",
    batch: Annotated[
        str, typer.Option(help="Sequences per step (each the preset's block size long), or max: the largest power of two that fits (see --max-batch).")
    ] = "16",
    max_batch: Annotated[int, typer.Option(help="With --batch max: the largest batch tried (on a CPU the memory also caps it, by an estimate).")] = 1024,
    steps: Annotated[int, typer.Option(help="Timed steps per run, after 3 warm-up steps (untimed, on both loops).")] = 10,
    compile: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="Run both loops under torch.compile (tfcli's as `train --compile` does); the 3 warm-up steps absorb the compiling, "
            "whose time is shown apart. The batch search (--batch max) does not compile.",
        ),
    ] = False,
    repeat: Repeat = 1,
    device: Device = "cpu",
    precision: Precision = "auto",
    first_run: FirstRun = True,
    json_output: JsonFlag = False,
) -> None:
    """Training throughput: tfcli's training loop beside a plain loop over transformers' GPT-2 of the same
    shape, batch and optimizer (AdamW, clipping), on the same random token shards, each in its own process.

    Reports tokens/s and MFU, the model FLOPs per second over the fastest matmul rate measured on the same
    device, and on a CUDA card tfcli knows, in bf16, MFU against the card's datasheet dense bf16 peak too.
    --batch max doubles the batch from 1 through tfcli's loop until the device runs out of memory (or
    --max-batch), then measures at the largest that ran (on a GPU: `--device cuda --precision bf16 --batch
    max`). --compile runs both loops compiled by torch.compile, the compile time shown apart from the timed
    steps. Targets: tfcli >= 1.0x the peer's tokens/s on every machine, 1.3x where a library faster than
    PyTorch's default was measured; MFU at small >= 80%; on a GPU, gpt2-small in bf16 at the largest batch
    >= 40% of the card's datasheet peak.

    \b
    Example: tfcli bench train --presets tiny,small --batch 16
    """

    from tfcli.errors import TfcliError

    if batch != "max" and not batch.isdigit():
        raise TfcliError(f"--batch must be a number or max, not {batch!r}", hint="for example --batch 16, or --batch max")
    at_least(1, batch=None if batch == "max" else int(batch), max_batch=max_batch, steps=steps, repeat=repeat)
    from tfcli.bench.train import run_train_bench

    names = _presets_to_measure(presets, device, precision)
    searching = " (finding the largest that fits first)" if batch == "max" else ""
    compiling = ", compiled" if compile else ""
    with stderr_console().status(f"benchmarking training of {', '.join(names)} at batch {batch}{searching}{compiling}"):
        bench = run_train_bench(
            names,
            batch if batch == "max" else int(batch),
            steps,
            repeat=repeat,
            device=device,
            precision=precision,
            first_run=first_run,
            max_batch=max_batch,
            compile=compile,
        )
    machine = f"{machine_line()}, device {device}"
    ratios = {name: _ratio(bench.results, name) for name in names}
    if json_output:
        print_json(_as_json(bench, machine, ratios))
        return
    _print_report(bench, machine, ratios)


def _presets_to_measure(presets: str, device: str, precision: str) -> list[str]:
    """The presets named, each one GPT-2 can be built as, on a device there on this machine, with transformers installed."""
    from tfcli.errors import TfcliError
    from tfcli.hf import gpt2_incompatibility
    from tfcli.model.config import preset as make_preset
    from tfcli.runtime import resolve_device

    names = [p.strip() for p in presets.split(",") if p.strip()]
    if not names:
        raise TfcliError("--presets names no preset", hint="for example --presets tiny,small")
    for name in names:
        problem = gpt2_incompatibility(make_preset(name))
        if problem:
            raise TfcliError(f"preset {name!r} cannot be built as GPT-2: {problem}", hint="use decoder presets such as tiny, small or gpt2-small")
    resolve_device(device)  # a device tfcli knows, and there on this machine
    if precision not in ("auto", "fp32", "bf16"):
        raise TfcliError(f"--precision must be auto, fp32 or bf16, not {precision!r}")
    require_peer("bench train", "transformers")
    return names


def _as_json(bench, machine: str, ratios: dict[str, float | None]) -> dict:
    from tfcli.bench.train import WARMUP_STEPS

    search = bench.search
    return {
        "machine": machine,
        "batch": bench.batch,
        "compile": bench.compile,
        "warmup_steps": WARMUP_STEPS,
        "timed_steps": bench.steps,
        "batch_search": None if search is None else {"largest": search.largest, "tried": search.tried, "stopped_by": search.stopped_by},
        "card": bench.yardstick.__dict__,
        "results": [r.__dict__ for r in bench.results],
        "throughput_ratio": {k: None if v is None else round(v, 4) for k, v in ratios.items()},
    }


def _print_report(bench, machine: str, ratios: dict[str, float | None]) -> None:
    """The table (MFU against the datasheet in a column of its own where the card has one), the batch search,
    the two yardsticks and the ratio to the peer per preset."""
    from rich.table import Table

    from tfcli.bench.train import WARMUP_STEPS

    results, card = bench.results, bench.yardstick
    compiled = " under torch.compile" if bench.compile else ""
    table = Table(title=f"training step{compiled}, batch {bench.batch} x block size; {machine}")
    columns = ["preset", "implementation", "tokens/s", "MFU", *(["MFU (datasheet)"] if card.bf16_peak_flops else []), "s / step", "CPU s / step", "peak RSS"]
    columns += [*(["peak GPU memory"] if any(r.peak_device_mb for r in results) else []), "parameters"]
    columns += ["compiled in"] if bench.compile else []
    for column in columns:
        table.add_column(column, justify="left" if column in ("preset", "implementation") else "right")
    for r in results:
        if r.out_of_memory:
            table.add_row(r.preset, r.implementation, "out of memory", *[""] * (len(columns) - 3))
            continue
        cells = [r.preset, r.implementation, f"{r.tokens_per_sec:,.0f}", f"{r.mfu:.1%}"]
        cells += [f"{r.card_mfu:.1%}" if r.card_mfu is not None else ""] if card.bf16_peak_flops else []
        cells += [f"{r.seconds_per_step:.3f}", f"{r.cpu_seconds_per_step:.3f}", f"{r.peak_rss_mb:,.0f} MB"]
        cells += [f"{r.peak_device_mb:,.0f} MB"] if "peak GPU memory" in columns else []
        cells += [f"{r.parameters:,}"]
        cells += [(f"{r.compile_seconds:.1f} s" if r.compiled else "not compiled")] if bench.compile else []
        table.add_row(*cells)
    console = stdout_console()
    print_table(console, table)
    if bench.search is not None:
        tried = ", ".join(f"{b}{'' if ok else ' (out of memory)'}" for b, ok in bench.search.tried)
        console.print(f"largest batch that fits: {bench.search.largest} (tried {tried}; stopped by {bench.search.stopped_by})")
    if bench.compile:
        console.print(
            "compiled in: the 3 warm-up steps' time beyond that of as many timed steps (torch.compile compiles in the first steps, "
            "inductor's cache on disk shortens it); tokens/s counts only the timed steps"
        )
        for r in results:
            if r.note:
                console.print(f"{r.preset}, {r.implementation}: {r.note}")
    peak = next(r.peak_flops for r in results if not r.out_of_memory)
    console.print(f"peak matmul rate measured: {peak / 1e9:,.1f} GFLOP/s")
    if card.bf16_peak_flops:
        console.print(f"datasheet: {card.device_name} is the {card.card}, dense bf16 peak {card.bf16_peak_flops / 1e12:,.1f} TFLOP/s")
    else:
        console.print(f"no datasheet MFU: {card.note}")
    console.print(
        f"each loop: {counted(WARMUP_STEPS, 'warm-up step')} untimed, then {counted(bench.steps, 'timed step')}; s / step is wall time, "
        "CPU s / step the worker's CPU time over the same steps"
    )
    for name, ratio in ratios.items():
        if ratio is None:
            console.print(f"{name}: no tokens/s ratio (a loop ran out of memory at batch {bench.batch})")
            continue
        ours, theirs = _rows(results, name)
        by_cpu = f"; by CPU time {theirs.cpu_seconds_per_step / ours.cpu_seconds_per_step:.3f}" if ours.cpu_seconds_per_step else ""
        console.print(
            f"{name}: tokens/s ratio tfcli/transformers {ratio:.3f} (target >= 1.0: {'ok' if ratio >= 1.0 else 'MISSED'}; "
            f"1.3 where a library faster than PyTorch's default was chosen){by_cpu}"
        )
    console.print(f"tfcli's choices on this machine: {accel_summary()}")


def _rows(results, name: str) -> tuple:
    """A preset's two rows: tfcli's, then transformers'."""
    ours, theirs = (next(r for r in results if r.preset == name and r.implementation == impl) for impl in ("tfcli", "transformers"))
    return ours, theirs


def _ratio(results, name: str) -> float | None:
    """tfcli's tokens/s over transformers' for a preset; None where either ran out of memory."""
    ours, theirs = _rows(results, name)
    return None if ours.out_of_memory or theirs.out_of_memory else ours.tokens_per_sec / theirs.tokens_per_sec
