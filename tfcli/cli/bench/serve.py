"""`tfcli bench serve RUN`: aggregate tokens/s and latency for 1, 4, 16 clients at once against one `tfcli serve`
process (tfcli.bench.serve)."""

from __future__ import annotations

from typing import Annotated

import typer

from tfcli.cli.bench.common import installed, machine_line
from tfcli.cli.common import at_least, counted, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import DecoderRun, Device, JsonFlag, Threads


def serve(
    run: DecoderRun,
    clients: Annotated[str, typer.Option(help="Client counts to measure, comma-separated, each a round of its own.")] = "1,4,16",
    requests: Annotated[int, typer.Option(help="Requests each client sends in turn, per round.")] = 4,
    max_tokens: Annotated[int, typer.Option(help="Tokens per request (greedy, end-of-text ignored).")] = 64,
    threads: Threads = 0,
    max_batch: Annotated[int, typer.Option(help="The server's --max-batch (default: the largest client count).", show_default=False)] = 0,
    device: Device = "cpu",
    compiled: Annotated[
        bool, typer.Option("--compiled", help="First tune the batch step compiled by torch.compile for --max-batch rows; the server uses it if it won.")
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Serve a run in its own process and measure it with 1, 4 and 16 clients at once: aggregate tokens/s,
    time to first token and time per token (p50, p99), and the server's CPU time, side by side.

    Every client sends streaming completions of the same prompts, greedy, each exactly --max-tokens long;
    the rounds run one after another against the same server. Target: 16 clients >= 4x one client's tokens/s.

    \b
    Example: tfcli bench serve runs/quickstart/model --clients 1,4,16 --requests 4 --max-tokens 64
    """
    from tfcli.bench.serve import run_serve_bench
    from tfcli.errors import TfcliError

    try:
        counts = [int(c) for c in clients.split(",") if c.strip()]
    except ValueError as exc:
        raise TfcliError(f"--clients takes numbers separated by commas, not {clients!r}", hint="e.g. --clients 1,4,16") from exc
    if not counts or min(counts) < 1 or max(counts) > 256:
        raise TfcliError(f"--clients takes counts between 1 and 256, not {clients!r}")
    at_least(1, requests=requests, max_tokens=max_tokens)
    at_least(0, threads=threads, max_batch=max_batch)
    if not (run / "config.json").is_file():
        raise TfcliError(f"{run} is not a run directory (no config.json)", hint="pass a folder that tfcli train or tfcli import wrote")
    if not (installed("fastapi") and installed("uvicorn")):
        raise TfcliError("bench serve measures `tfcli serve`, which needs FastAPI and uvicorn, not installed", hint="pip install 'tfcli[serve]'")
    from tfcli.runtime import resolve_device

    device = resolve_device(device)  # a device this machine lacks is one line here, not a server that fails to start
    machine = machine_line()
    with stderr_console().status("benchmarking serve") as status:
        bench = run_serve_bench(
            run,
            clients=counts,
            requests=requests,
            max_tokens=max_tokens,
            threads=threads,
            max_batch=max_batch or max(counts),
            device=device,
            compiled=compiled,
            progress=lambda message: status.update(f"benchmarking serve: {message}"),
        )
    if json_output:
        print_json({"machine": machine, "bench": bench.to_json()})
        return
    _print_bench(bench, counts, machine)


def _print_bench(bench, counts: list[int], machine: str) -> None:
    """The rounds as a table, the compiled step's tuning, and the many-clients speed-up against its target."""
    from rich.table import Table

    out = stdout_console()
    table = Table(
        title=f"tfcli serve {bench.model} (context {bench.context}), {counted(bench.requests_per_client, 'request')} per client of {counted(bench.max_tokens, 'token')}, "
        f"greedy, streaming, max batch {bench.max_batch}, on {bench.device}; {machine}"
    )
    for column in ("clients", "tokens/s", "x 1 client", "TTFT p50", "TTFT p99", "ms/token p50", "ms/token p99", "server CPU s", "tokens/CPU s", "batch"):
        table.add_column(column, justify="right")
    for r in bench.rounds:
        data = r.to_json()
        speedup = bench.speedup(r.clients)
        table.add_row(
            str(r.clients),
            f"{r.tokens_per_second:,.1f}",
            "" if speedup is None else f"{speedup:.2f}",
            f"{data['ttft_ms']['p50']:.1f} ms",
            f"{data['ttft_ms']['p99']:.1f} ms",
            f"{data['per_token_ms']['p50']:.2f}",
            f"{data['per_token_ms']['p99']:.2f}",
            f"{r.server_cpu_seconds:.2f}",
            f"{r.tokens_per_cpu_second:,.1f}",
            str(r.busiest_batch),
        )
    print_table(out, table)
    if bench.tuning is not None:
        seconds = ", ".join(f"{name} {value * 1e3:.3g} ms" for name, value in bench.tuning["seconds"].items())
        out.print(
            f"compiled batch step for {counted(bench.max_batch, 'row')}: {bench.tuning['choice']} chosen ({seconds}; compiled in "
            f"{bench.tuning['compile_seconds']:.1f} s); the server's: {bench.compiled_step}"
        )
    top = max(counts)
    speedup = bench.speedup(top)
    if speedup is not None and top > 1:
        out.print(f"{top} clients / 1 client, aggregate tokens/s: {speedup:.2f}x (target >= 4: {'ok' if speedup >= 4 else 'MISSED'})")
