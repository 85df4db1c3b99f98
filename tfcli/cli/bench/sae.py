"""`tfcli bench sae`: tfcli's SAE trainer beside SAELens's on the same activations of the same run (tfcli.bench.sae)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.bench.common import machine_line, print_comparison, require_peer, scratch, verdict
from tfcli.cli.common import counted, print_json, stderr_console
from tfcli.cli.options import DecoderRun, JsonFlag, Workdir
from tfcli.cli.sae import Hook, SaeData


def sae(
    run: DecoderRun,
    hook: Hook,
    data: SaeData,
    width: Annotated[int, typer.Option("--width", help="Features (d_sae); 0: 8 times the hook's width.")] = 0,
    k: Annotated[int, typer.Option("--k", help="Features kept per vector (topk).")] = 32,
    lr: Annotated[float, typer.Option("--lr", help="Adam's learning rate (constant), for both.")] = 4e-4,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Activation vectors per step.")] = 1024,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Activation vectors each trainer trains on (held in memory: tokens x width x 4 bytes).")
    ] = 300_000,
    threads: Annotated[int, typer.Option("--threads", help="CPU threads for both.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seed for both SAEs' first weights and the activations drawn.")] = 0,
    workdir: Workdir = None,
    json_output: JsonFlag = False,
) -> None:
    """Train a topk SAE with tfcli and with SAELens (its SAETrainer) on the same activations of the same run,
    with the same width, k, learning rate, batch size and tokens, and compare: training tokens per CPU
    second, L0, explained variance, dead features and CE loss recovered on the same held-out windows.
    Target: tfcli's tokens per CPU second >= SAELens's, the quality within 5%.

    \b
    Example: tfcli bench sae runs/quickstart/model --hook blocks.1.hook_resid_post --data runs/quickstart/shards
    """
    from tfcli.bench.sae import run_sae_bench
    from tfcli.errors import TfcliError

    for name, value in (("--batch-size", batch_size), ("--max-tokens", max_tokens), ("--threads", threads)):
        if value < 1:
            raise TfcliError(f"{name} must be at least 1, not {value}")
    require_peer("bench sae", "sae-lens")
    with scratch(workdir) as folder, stderr_console().status("benchmarking") as status:
        result = run_sae_bench(
            Path(run), hook, Path(data), folder, width=width, k=k, lr=lr, batch_size=batch_size, max_tokens=max_tokens, threads=threads, seed=seed,
            progress=lambda job: status.update(f"benchmarking: {job}"),
        )  # fmt: skip
    machine = machine_line()
    if json_output:
        print_json({"machine": machine, **result.to_json()})
        return
    _print_result(result, machine)


def _print_result(result, machine: str) -> None:
    s = result.settings
    title = (
        f"SAE bench: topk, {counted(s['d_sae'], 'feature')} on {s['hook']} (width {s['d_in']}), k {s['k']}, lr {s['lr']:g}, batch {s['batch_size']}, "
        f"{counted(s['tokens'], 'token')}, {counted(s['threads'], 'thread')}; {machine}"
    )
    columns = ("trainer", "CPU s", "wall s", "tokens / CPU s", "L0", "explained var.", "CE loss recovered", "dead", "peak RSS")
    rows = [
        (
            r.trainer, f"{r.cpu_seconds:.2f}", f"{r.wall_seconds:.2f}", f"{r.tokens_per_cpu_second:,.0f}", f"{r.l0:.1f}", f"{r.explained_variance:.3f}",
            f"{r.ce_loss_recovered:.3f}", f"{r.dead_fraction:.1%}", f"{r.peak_rss_mb:.0f} MB",
        )
        for r in result.rows
    ]  # fmt: skip
    speed = result.ratio("tokens_per_cpu_second")
    quality = [result.ratio(name) for name in ("l0", "explained_variance", "ce_loss_recovered")]
    met = speed >= 1 and all(abs(q - 1) <= 0.05 for q in quality)
    summary = (
        f"tfcli / SAELens: tokens per CPU second {speed:.2f}, L0 {quality[0]:.3f}, explained variance {quality[1]:.3f}, "
        f"CE loss recovered {quality[2]:.3f} (target: speed >= 1, quality within 5%: {verdict(met)})"
    )
    print_comparison(title, columns, rows, summary)
