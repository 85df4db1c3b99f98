"""`tfcli bench lora`: what LoRA saves over training every weight, memory and time (tfcli.bench.lora)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.bench.common import machine_line
from tfcli.cli.common import at_least, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import FirstRun, JobThreads, JsonFlag, Repeat


def lora(
    preset: Annotated[str, typer.Option("--preset", help="The decoder preset of the parent model (random weights).")] = "gpt2-small",
    rank: Annotated[int, typer.Option("--rank", help="The LoRA rank.")] = 8,
    targets: Annotated[str, typer.Option("--targets", help="The LoRA target groups: qkv, out, mlp.")] = "qkv,out,mlp",
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 2,
    block_size: Annotated[
        Optional[int],
        typer.Option("--block-size", help="Tokens per sequence, at most the preset's context [default: 256, or the context if shorter].", show_default=False),
    ] = None,
    steps: Annotated[int, typer.Option(help="Timed steps per run, after 2 warm-up steps.")] = 3,
    repeat: Repeat = 1,
    threads: JobThreads = 0,
    first_run: FirstRun = True,
    workdir: Annotated[Optional[Path], typer.Option("--workdir", help="Where the parent run and the shards are written [default: a temporary folder].")] = None,
    json_output: JsonFlag = False,
) -> None:
    """What LoRA saves over training every weight: the same fine-tune (continued LM on random tokens) of a
    random parent of the preset's shape, through tfcli's real training path on the CPU, once in full and once
    with LoRA adapters, each in its own process. Reports peak RSS and seconds per step of both, and the ratios
    (targets at gpt2-small: RSS <= 0.6x, step time <= 0.8x). LoRA saves the frozen weights' gradients and
    optimizer state; the activations are the same in both, so the RSS ratio rises with batch x block size.

    \b
    Example: tfcli bench lora --preset gpt2-small --rank 8 --batch 2 --block-size 256
    """
    at_least(1, rank=rank, batch=batch, steps=steps, repeat=repeat)
    at_least(0, threads=threads)
    from tfcli.runtime import check_threads

    check_threads(threads)
    from tfcli.bench.lora import run_lora_bench

    block_size, groups = _checked_shape(preset, rank, targets, block_size)
    if workdir is not None:
        from tfcli.fsutil import prepare_output_dir

        prepare_output_dir(workdir, "scratch", option="--workdir")
    with stderr_console().status(f"benchmarking full fine-tuning and LoRA rank {rank} of {preset} at batch {batch} x {block_size}"):
        result = run_lora_bench(preset, rank, ",".join(groups), batch, block_size, steps, repeat=repeat, threads=threads, workdir=workdir, first_run=first_run)
    machine = f"{machine_line()}, device cpu"
    if json_output:
        print_json(
            {
                "machine": machine,
                "preset": preset,
                "rank": rank,
                "targets": result.targets,
                "batch": batch,
                "block_size": block_size,
                "full": result.full.__dict__,
                "lora": result.lora.__dict__,
                "rss_ratio": round(result.rss_ratio, 4),
                "step_time_ratio": round(result.time_ratio, 4),
                "cpu_time_ratio": round(result.cpu_time_ratio, 4),
            }
        )
        return
    from rich.table import Table

    table = Table(title=f"fine-tuning {preset}, batch {batch} x {block_size} tokens; {machine}")
    for column in ("kind", "s / step", "CPU s / step", "peak RSS", "trainable parameters"):
        table.add_column(column, justify="left" if column == "kind" else "right")
    for m, label in ((result.full, "full fine-tuning"), (result.lora, f"LoRA rank {rank} on {result.targets}")):
        share = f"{m.trainable:,} of {m.parameters:,} ({m.trainable / m.parameters:.2%})"
        table.add_row(label, f"{m.seconds_per_step:.3f}", f"{m.cpu_seconds_per_step:.3f}", f"{m.peak_rss_mb:,.0f} MB", share)
    console = stdout_console()
    print_table(console, table)
    console.print(f"peak RSS LoRA / full: {result.rss_ratio:.3f} (target <= 0.6: {'ok' if result.rss_ratio <= 0.6 else 'MISSED'})")
    console.print(
        f"step time LoRA / full: {result.time_ratio:.3f} (target <= 0.8: {'ok' if result.time_ratio <= 0.8 else 'MISSED'}); CPU time: {result.cpu_time_ratio:.3f}"
    )


def _checked_shape(preset: str, rank: int, targets: str, block_size: int | None) -> tuple[int, tuple[str, ...]]:
    """The block size (the default where not given) and the LoRA target groups, once the preset is a decoder they fit."""
    from tfcli.adapters.lora import check_rank
    from tfcli.errors import TfcliError
    from tfcli.model.config import preset as make_preset
    from tfcli.training_config import TrainConfig

    config = make_preset(preset)
    if config.arch != "decoder":
        raise TfcliError(f"preset {preset!r} is {config.arch}; bench lora fine-tunes a decoder", hint="use tiny, small or gpt2-small")
    block_size = block_size if block_size is not None else min(256, config.block_size)
    if not 2 <= block_size <= config.block_size:
        raise TfcliError(f"--block-size must be between 2 and the preset's context ({config.block_size}), not {block_size}")
    groups = TrainConfig(lora_rank=rank, lora_targets=targets).lora_groups  # an unknown group is an error here
    check_rank(config, rank, groups)
    return block_size, groups
