"""`tfcli bench model`: one training step of tfcli's model beside transformers' GPT-2 (tfcli.bench.model)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tfcli.cli.bench.common import accel_summary, machine_line, require_peer, verdict
from tfcli.cli.common import at_least, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import FirstRun, JsonFlag, Repeat


def model(
    preset: Annotated[str, typer.Option(help="The model shape (a preset name).")] = "gpt2-small",
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 4,
    length: Annotated[
        Optional[int], typer.Option(help="Tokens per sequence [default: 256, or the preset's context where shorter].", show_default=False)
    ] = None,
    steps: Annotated[int, typer.Option(help="Timed steps per implementation (best kept), after one warm-up step.")] = 3,
    repeat: Repeat = 2,
    first_run: FirstRun = True,
    json_output: JsonFlag = False,
) -> None:
    """Time one training step (forward + backward, fp32 on CPU) of tfcli's model beside transformers' GPT-2.

    Both build the same shape from the preset (which must be GPT-2-expressible), each in its own
    process; the table gives seconds per step and peak memory. Targets: tfcli <= 1.0x the time on every
    machine (0.8x where a library faster than PyTorch's default was measured), <= 0.6x the memory. At the
    defaults (gpt2-small, with the first run) it takes more than three minutes on 2 CPU cores; --preset tiny
    --no-first-run, seconds.

    \b
    Example: tfcli bench model --preset gpt2-small --batch 4 --length 256 --repeat 3
    """

    from tfcli.bench.model import run_model_bench
    from tfcli.errors import TfcliError
    from tfcli.hf import gpt2_incompatibility
    from tfcli.model.config import preset as make_preset

    shape = make_preset(preset)
    problem = gpt2_incompatibility(shape)
    if problem:
        raise TfcliError(f"preset {preset!r} cannot be built as GPT-2: {problem}", hint="use a decoder preset such as gpt2-small or tiny")
    if length is None:
        length = min(256, shape.block_size)
    at_least(1, batch=batch, length=length, steps=steps, repeat=repeat)
    if length > shape.block_size:
        raise TfcliError(f"--length {length} is longer than {preset}'s block size ({shape.block_size})", hint=f"pass --length {shape.block_size} or less")
    require_peer("bench model", "transformers")
    with stderr_console().status(f"benchmarking {preset} at {batch} x {length}"):
        results = run_model_bench(preset, batch, length, steps, repeat=repeat, first_run=first_run)
    ours, theirs = results
    ratio = ours.seconds_per_step / theirs.seconds_per_step
    machine = machine_line()
    if json_output:
        print_json(
            {
                "machine": machine,
                "preset": preset,
                "batch": batch,
                "length": length,
                "results": [r.__dict__ for r in results],
                "time_ratio": round(ratio, 4),
                "memory_ratio": round(ours.peak_rss_mb / theirs.peak_rss_mb, 4),
            }
        )
        return
    from rich.table import Table

    table = Table(title=f"{preset}, batch {batch} x {length} tokens, forward + backward, fp32; {machine}")
    for column in ("implementation", "s / step", "peak RSS", "parameters"):
        table.add_column(column, justify="left" if column == "implementation" else "right")
    for r in results:
        table.add_row(r.implementation, f"{r.seconds_per_step:.3f}", f"{r.peak_rss_mb:,.0f} MB", f"{r.parameters:,}")
    console = stdout_console()
    print_table(console, table)
    console.print(
        f"time ratio tfcli/transformers: {ratio:.3f} (target <= 1.0: {'ok' if ratio <= 1.0 else 'MISSED'}; "
        "0.8 where a library faster than PyTorch's default was chosen)"
    )
    memory = ours.peak_rss_mb / theirs.peak_rss_mb
    console.print(f"peak memory ratio tfcli/transformers: {memory:.3f} (target <= 0.6: {verdict(memory <= 0.6)})")
    console.print(f"tfcli's choices on this machine: {accel_summary()}")
