"""`tfcli bench generate`: batch-1 greedy decoding beside transformers' generate and the memory-bandwidth floor
(tfcli.bench.generate)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.bench.common import accel_summary, machine_line, scratch, scratch_folder
from tfcli.cli.common import human_bytes, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import REPEAT_HELP, FirstRun, JobThreads, JsonFlag, Workdir

MAX_BENCH_TOKENS = 8192  # prompt + new tokens in `bench generate` (the uncached job re-runs all of them per token)
FULL_ROUNDS, QUICK_ROUNDS = 3, 1  # --repeat's default with --full, and without


Presets = Annotated[list[str], typer.Option("--preset", help="Model shapes to measure (repeatable; decoder presets GPT-2 can express).")]
PromptTokens = Annotated[int, typer.Option(help="Prompt length in tokens (random ids, the same on both sides).")]
NewTokens = Annotated[int, typer.Option(help="Tokens generated per call, greedy, end-of-text ignored.")]
Rounds = Annotated[Optional[int], typer.Option("--repeat", help=f"{REPEAT_HELP} [default: {QUICK_ROUNDS}; {FULL_ROUNDS} with --full].", show_default=False)]
Device = Annotated[str, typer.Option(help="cpu, cuda or cuda:N (fp32 either way).")]
NoCache = Annotated[
    Optional[bool],
    typer.Option(
        "--no-cache/--skip-no-cache",
        help="Measure decoding without the KV cache every round / never (default: every round for small models; for large ones once with --full, else never).",
        show_default=False,
    ),
]
Full = Annotated[
    bool,
    typer.Option(
        "--full",
        help=f"The whole run behind the published figures: {FULL_ROUNDS} rounds, and the uncached job for large models too "
        "(about 9 minutes on 2 cores at the default presets, where the default run takes a few).",
    ),
]
Against = Annotated[
    Optional[str],
    typer.Option(
        "--against",
        help="Also time llama.cpp (llama-cpp-python) on the same weights exported to GGUF f32, on the threads tfcli decodes on.",
        show_default=False,
    ),
]


def generate(
    preset: Presets = [  # noqa: B006
        "tiny",
        "gpt2-small",
    ],
    prompt_tokens: PromptTokens = 16,
    new_tokens: NewTokens = 256,
    repeat: Rounds = None,
    full: Full = False,
    threads: JobThreads = 0,
    device: Device = "cpu",
    no_cache: NoCache = None,
    against: Against = None,
    workdir: Workdir = None,
    first_run: FirstRun = True,
    json_output: JsonFlag = False,
) -> None:
    """Time batch-1 greedy decoding: tfcli's generator (with and without its KV cache) beside
    transformers' GPT2LMHeadModel.generate on the same random weights, and the memory-bandwidth floor.

    Targets: tiny >= 2x transformers' tokens/s; gpt2-small >= 1.5x and time per token within 1.3x the
    floor (every weight read once per token at the read bandwidth measured right before and after each
    call: a 256 MB tensor summed again and again for half a second); cached >= 5x uncached. tfcli's side
    is loaded as `tfcli generate` loads a run: the same threads and accelerated paths.
    The context is widened to hold prompt + new tokens, since GPT-2 cannot slide a window.

    The default run is short, a few minutes on 2 cores: one round, and the uncached job (which re-runs the
    whole text for every token) for small models only. --full is the whole run behind the published
    figures: three rounds, and the uncached job once for gpt2-small too (about 9 minutes on 2 cores).

    --against llama.cpp adds llama.cpp, the reference for CPU decoding, on the same model exported to GGUF
    f32 (`tfcli export --to gguf`) and the same prompt, with tfcli's thread count (--threads, or the one
    tfcli picks); the goal is tfcli's time per token within 1.2x llama.cpp's. The models then use GPT-2's
    own GELU (tanh), the one llama.cpp runs.

    \b
    Example: tfcli bench generate --full
    Or: tfcli bench generate --preset gpt2-small --against llama.cpp --threads 2
    """
    if repeat is None:
        repeat = FULL_ROUNDS if full else QUICK_ROUNDS
    device = _checked_device(device, prompt_tokens=prompt_tokens, new_tokens=new_tokens, repeat=repeat, threads=threads, against=against, workdir=workdir)
    machine = machine_line()
    benches = [
        _bench(
            name,
            workdir,
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            repeat=repeat,
            threads=threads,
            device=device,
            no_cache=no_cache,
            quick=not full,
            first_run=first_run,
            against=against,
        )
        for name in preset
    ]
    if json_output:
        print_json({"machine": machine, "benches": [b.to_json() for b in benches]})
        return
    out = stdout_console()
    for b in benches:
        _print_generate_bench(out, b, machine)
    out.print(f"tfcli's choices on this machine: {accel_summary()}")


def _checked_device(device: str, *, prompt_tokens: int, new_tokens: int, repeat: int, threads: int, against: str | None, workdir: Path | None) -> str:
    """The device to measure on, once every option is known to be usable (and the peers to be installed)."""
    from tfcli.errors import TfcliError
    from tfcli.runtime import check_threads, resolve_device

    if device != "cpu" and not device.startswith("cuda"):
        raise TfcliError(f"--device must be cpu, cuda or cuda:N, not {device!r}")
    device = resolve_device(device)
    if min(repeat, prompt_tokens, new_tokens) < 1 or threads < 0:
        raise TfcliError("--repeat, --prompt-tokens and --new-tokens must be at least 1, --threads at least 0")
    check_threads(threads)
    if prompt_tokens + new_tokens > MAX_BENCH_TOKENS:
        raise TfcliError(
            f"--prompt-tokens + --new-tokens is {prompt_tokens + new_tokens:,}; the bench decodes at most {MAX_BENCH_TOKENS:,}",
            hint="the issue's setting is 16 + 256",
        )
    if against is not None and against != "llama.cpp":
        raise TfcliError(f"--against knows llama.cpp, not {against!r}")
    if against is not None and device != "cpu":
        raise TfcliError("--against llama.cpp compares CPU decoding", hint="drop --device, or --against")
    if against is not None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as exc:
            raise TfcliError("--against llama.cpp needs llama-cpp-python, which is not installed", hint="pip install llama-cpp-python") from exc
    if workdir is not None:
        scratch_folder(workdir)
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise TfcliError("bench generate compares against transformers, which is not installed", hint="pip install transformers") from exc
    return device


def _bench(name: str, workdir: Path | None, **settings):
    """One preset measured in its scratch folder (removed afterwards unless --workdir keeps it), with a status line."""
    from tfcli.bench.generate import run_generate_bench

    with scratch(workdir, name) as folder, stderr_console().status(f"benchmarking {name}") as status:
        return run_generate_bench(folder, name, **settings, progress=lambda job: status.update(f"benchmarking {name}: {job}"))


def _print_generate_bench(out, b, machine: str) -> None:
    from rich.table import Table

    table = Table(
        title=f"{b.preset} ({b.parameters:,} parameters, context {b.block_size}), batch 1, {b.prompt_tokens}-token prompt, "
        f"{b.new_tokens} new tokens, greedy, fp32, {b.device}, best of {b.repeat}; {machine}"
    )
    for column in ("implementation", "seconds", "tokens/s", "ms / token", "peak RSS"):
        table.add_column(column, justify="left" if column == "implementation" else "right")
    for m in b.results.values():
        table.add_row(m.job, f"{m.seconds:.3f}", f"{m.tokens_per_second:,.1f}", f"{m.seconds / m.new_tokens * 1e3:.2f}", f"{m.peak_rss_mb:,.0f} MB")
    table.add_row("floor (weights / bandwidth)", "", "", f"{b.floor_seconds_per_token * 1e3:.2f}", "")
    print_table(out, table)
    if b.results.get("tfcli") and b.results["tfcli"].kernel:
        out.print(f"tfcli's batch-1 decoding on the CPU: {b.results['tfcli'].kernel}")
    versus_peer = b.ratio("tfcli", "transformers")
    target = 2.0 if b.parameters < 20_000_000 else 1.5
    if versus_peer is not None:
        out.print(
            f"tokens/s tfcli / transformers: {versus_peer:.3f} (target >= {target}: {'ok' if versus_peer >= target else 'MISSED'}); "
            f"same greedy tokens: {'yes' if b.same_tokens else 'no'}"
        )
    versus_uncached = b.ratio("tfcli", "tfcli-no-cache")
    if versus_uncached is not None:
        out.print(
            f"cached / uncached: {versus_uncached:.2f}x (target >= 5: {'ok' if versus_uncached >= 5 else 'MISSED'}"
            f"{'; at this size per-step overhead, not compute, sets both' if b.parameters < 20_000_000 else ''})"
        )
    versus_llama = b.time_per_token_vs("llama.cpp")
    if versus_llama is not None:
        threads = b.results["llama.cpp"].threads
        out.print(
            f"time per token tfcli / llama.cpp: {versus_llama:.3f} on {threads} thread{'s' if threads != 1 else ''} each (goal <= 1.2: {'ok' if versus_llama <= 1.2 else 'MISSED'}); "
            f"same greedy tokens: {'yes' if b.same_tokens_as_llama_cpp else 'no'}"
        )
    floor_target = "" if b.parameters < 20_000_000 else f"; target <= 1.3: {'ok' if b.floor_ratio <= 1.3 else 'MISSED'}"
    out.print(
        f"time per token / floor: {b.floor_ratio:.3f} (median call; memory bandwidth beside it {b.bandwidth_gb_s:.1f} GB/s, "
        f"{human_bytes(b.weight_bytes)} of weights per token{floor_target})"
    )
