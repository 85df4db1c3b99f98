"""`tfcli bench generate`: greedy decoding (batch 1, or N rows with --batch) beside transformers' generate and the
memory-bandwidth floor (tfcli.bench.generate)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.bench.common import accel_summary, machine_line, require_peer, scratch, scratch_folder
from tfcli.cli.common import at_least, counted, human_bytes, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import REPEAT_HELP, FirstRun, JobThreads, JsonFlag, Workdir

MAX_BENCH_TOKENS = 8192  # prompt + new tokens in `bench generate` (the uncached job re-runs all of them per token)
MAX_BENCH_BATCH = 256  # rows in `bench generate --batch` (vLLM's default max_num_seqs) ...
MAX_BATCH_TOKENS = 65_536  # ... and rows x (prompt + new tokens): the KV caches of every row, held at once
FULL_ROUNDS, QUICK_ROUNDS = 3, 1  # --repeat's default with --full, and without
TIMED_STEPS_NOTE = "best time of 8 decoding steps each"  # as tfcli.accel.compiled_step.tune times them


Presets = Annotated[list[str], typer.Option("--preset", help="Model shapes to measure (repeatable; decoder presets GPT-2 can express).")]
PromptTokens = Annotated[int, typer.Option(help="Prompt length in tokens (random ids, the same on both sides).")]
NewTokens = Annotated[int, typer.Option(help="Tokens generated per call, greedy, end-of-text ignored.")]
Rounds = Annotated[Optional[int], typer.Option("--repeat", help=f"{REPEAT_HELP} [default: {QUICK_ROUNDS}; {FULL_ROUNDS} with --full].", show_default=False)]
Device = Annotated[str, typer.Option(help="cpu (fp32), cuda or cuda:N (bf16 where the GPU has it, on both sides).")]
Batch = Annotated[
    int,
    typer.Option(
        "--batch",
        help=f"Prompts of the same length decoded together, greedy, the same ones on every side (1 to {MAX_BENCH_BATCH}); past 1, times "
        "are per decoding step, tokens/s counts every row, and the one-row jobs (tfcli-compiled, llama.cpp) are left out with a note.",
    ),
]
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
Compiled = Annotated[
    bool,
    typer.Option(
        "--compiled/--skip-compiled",
        help="Tune the step compiled by torch.compile in the first run (compiling it once: tens of seconds on a CPU) and time it "
        "as a job of its own, tfcli-compiled, beside the step tfcli chose.",
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

WeightTypes = Annotated[
    Optional[str],
    typer.Option(
        "--type",
        help="With --against llama.cpp: weight types to time, comma-separated (f32,bf16,q8_0,q4_0,q4_k_m), each on the same bytes on both "
        "sides, at one thread and at every core (or --threads); --preset also takes smollm2-135m (SmolLM2-135M's Llama shape).",
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
    compiled: Compiled = True,
    workdir: Workdir = None,
    first_run: FirstRun = True,
    json_output: JsonFlag = False,
    weight_types: WeightTypes = None,
    batch: Batch = 1,
) -> None:
    """Time greedy decoding: tfcli's generator (with and without its KV cache) beside
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

    --type (with --against llama.cpp) times each weight type instead: tfcli's quantized run (`tfcli quantize`)
    beside llama.cpp on that run's own GGUF export, with the floor of reading its bytes once per token.

    --batch N decodes N prompts together on both sides (transformers with an attention mask) and checks every
    row's greedy ids; it reports ms per decoding step and tokens/s over all rows; the floor is still the
    weights read once per step. The targets above are batch 1's.

    \b
    Example: tfcli bench generate --full
    Or: tfcli bench generate --preset gpt2-small --batch 16
    Or: tfcli bench generate --preset gpt2-small --against llama.cpp --threads 2
    Or: tfcli bench generate --preset gpt2-small --preset smollm2-135m --against llama.cpp --type f32,bf16,q8_0,q4_0,q4_k_m
    """
    if weight_types is not None:
        _by_type(preset, weight_types, against, threads, prompt_tokens, new_tokens, repeat or 2, workdir, json_output, batch)
        return
    if repeat is None:
        repeat = FULL_ROUNDS if full else QUICK_ROUNDS
    sizes = {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "repeat": repeat, "threads": threads, "batch": batch}
    device = _checked_device(device, **sizes, against=against, workdir=workdir)
    machine = machine_line()
    settings = {"device": device, "no_cache": no_cache, "quick": not full, "first_run": first_run, "against": against, "compiled": compiled}
    benches = [_bench(name, workdir, **sizes, **settings) for name in preset]
    if json_output:
        print_json({"machine": machine, "benches": [b.to_json() for b in benches]})
        return
    out = stdout_console()
    for b in benches:
        _print_generate_bench(out, b, machine)
    out.print(f"tfcli's choices on this machine: {accel_summary()}")


def _by_type(
    presets: list[str],
    weight_types: str,
    against: str | None,
    threads: int,
    prompt_tokens: int,
    new_tokens: int,
    repeat: int,
    workdir,
    json_output: bool,
    batch: int = 1,
) -> None:
    """`--type`: each weight type, tfcli beside llama.cpp and the floor, per preset and thread count (tfcli.bench.quant)."""
    import os

    from tfcli.errors import TfcliError

    if against != "llama.cpp":
        raise TfcliError("--type times tfcli beside llama.cpp", hint="add --against llama.cpp")
    if batch != 1:
        raise TfcliError("--type times one row (llama-cpp-python decodes one sequence)", hint="drop --batch, or --type")
    _checked_device("cpu", prompt_tokens=prompt_tokens, new_tokens=new_tokens, repeat=repeat, threads=threads, against=against, workdir=workdir)
    from tfcli.bench.quant import run_quant_bench

    counts = [threads] if threads else sorted({1, os.cpu_count() or 1})
    machine, out = machine_line(), stdout_console()
    results = {}
    for name in presets:
        with scratch(workdir, name) as folder, stderr_console().status(f"benchmarking {name}") as status:
            results[name] = run_quant_bench(
                folder, name, weight_types.split(","), counts, prompt_tokens=prompt_tokens, new_tokens=new_tokens, repeat=repeat, progress=status.update
            )
    if json_output:
        print_json({"machine": machine, "benches": {name: [dict(vars(r), floor_ms=r.floor_ms) for r in rows] for name, rows in results.items()}})
        return
    from rich.table import Table

    for name, rows in results.items():
        table = Table(
            title=f"{name}, batch 1, {prompt_tokens}-token prompt, {counted(new_tokens, 'new token')}, greedy, best of {repeat}; "
            f"ms / token: CPU time on 1 thread, wall time on more; {machine}"
        )
        for column in ("type", "threads", "tfcli ms / token", "llama.cpp ms / token", "tfcli / llama.cpp", "floor ms / token", "weights", "same tokens"):
            table.add_column(column, justify="left" if column == "type" else "right")
        for r in rows:
            table.add_row(
                r.type,
                str(r.threads),
                f"{r.tfcli_ms:.2f}",
                f"{r.llama_cpp_ms:.2f}",
                f"{r.tfcli_ms / r.llama_cpp_ms:.2f}" if r.llama_cpp_ms else "",
                f"{r.floor_ms:.2f}",
                human_bytes(r.weight_bytes),
                "yes" if r.same_tokens else "no",
            )
        print_table(out, table)


def _checked_device(
    device: str, *, prompt_tokens: int, new_tokens: int, repeat: int, threads: int, against: str | None, workdir: Path | None, batch: int = 1
) -> str:
    """The device to measure on, once every option is known to be usable (and the peers to be installed)."""
    from tfcli.errors import TfcliError
    from tfcli.runtime import check_threads, resolve_device

    if device != "cpu" and not device.startswith("cuda"):
        raise TfcliError(f"--device must be cpu, cuda or cuda:N, not {device!r}")
    device = resolve_device(device)
    at_least(1, repeat=repeat, prompt_tokens=prompt_tokens, new_tokens=new_tokens)
    at_least(0, threads=threads)
    check_threads(threads)
    if prompt_tokens + new_tokens > MAX_BENCH_TOKENS:
        raise TfcliError(
            f"--prompt-tokens + --new-tokens is {prompt_tokens + new_tokens:,}; the bench decodes at most {MAX_BENCH_TOKENS:,}",
            hint="the issue's setting is 16 + 256",
        )
    if not 1 <= batch <= MAX_BENCH_BATCH:
        raise TfcliError(f"--batch must be between 1 and {MAX_BENCH_BATCH}, not {batch}", hint="the issue's settings are 1 and 16")
    if batch * (prompt_tokens + new_tokens) > MAX_BATCH_TOKENS:
        raise TfcliError(
            f"--batch {batch} rows of {prompt_tokens + new_tokens:,} tokens is {batch * (prompt_tokens + new_tokens):,}; the bench holds at most "
            f"{MAX_BATCH_TOKENS:,} tokens of KV cache at once",
            hint="fewer rows or fewer --new-tokens",
        )
    if against is not None and against != "llama.cpp":
        raise TfcliError(f"--against knows llama.cpp, not {against!r}")
    if against is not None and device != "cpu":
        raise TfcliError("--against llama.cpp compares CPU decoding", hint="drop --device, or --against")
    if against is not None:
        require_peer("bench generate --against llama.cpp", "llama.cpp")
    if workdir is not None:
        scratch_folder(workdir)
    require_peer("bench generate", "transformers")
    return device


def _bench(name: str, workdir: Path | None, **settings):
    """One preset measured in its scratch folder (removed afterwards unless --workdir keeps it), with a status line."""
    from tfcli.bench.generate import run_generate_bench

    with scratch(workdir, name) as folder, stderr_console().status(f"benchmarking {name}") as status:
        return run_generate_bench(folder, name, **settings, progress=lambda job: status.update(f"benchmarking {name}: {job}"))


def _print_generate_bench(out, b, machine: str) -> None:
    from rich.table import Table

    prompts = f"{counted(b.batch, f'{b.prompt_tokens}-token prompt')} decoded together" if b.batch > 1 else f"{b.prompt_tokens}-token prompt"
    table = Table(
        title=f"{b.preset} ({b.parameters:,} parameters, context {b.block_size}), batch {b.batch}, {prompts}, "
        f"{counted(b.new_tokens, 'new token')}, greedy, {b.dtype}, {b.device}, best of {b.repeat}; {machine}"
    )
    per = ("tokens/s, all rows", "ms / step") if b.batch > 1 else ("tokens/s", "ms / token")
    for column in ("implementation", "seconds", *per, "peak RSS"):
        table.add_column(column, justify="left" if column == "implementation" else "right")
    for m in b.results.values():
        table.add_row(m.job, f"{m.seconds:.3f}", f"{m.tokens_per_second:,.1f}", f"{m.ms_per_step:.2f}", f"{m.peak_rss_mb:,.0f} MB")
    table.add_row(f"floor (weights / bandwidth{', once a step' if b.batch > 1 else ''})", "", "", f"{b.floor_seconds_per_token * 1e3:.2f}", "")
    print_table(out, table)
    for job, reason in b.left_out.items():
        out.print(f"left out at batch {b.batch}: {job} ({reason})")
    if b.results.get("tfcli") and b.results["tfcli"].kernel:
        out.print(f"tfcli's batch-{b.batch} decoding{' on the CPU' if b.batch == 1 else ''}: {b.results['tfcli'].kernel}")
    if b.tuning is not None:
        seconds = b.tuning["seconds"]
        timed = ", ".join(f"{name} {value * 1e3:.2f} ms" for name, value in seconds.items())
        out.print(
            f"compiled step: tuned in the first run ({TIMED_STEPS_NOTE}: {timed}); compiled in {b.tuning['compile_seconds']:.1f} s "
            f"(0.0: compiled by an earlier run); chosen: {b.tuning['choice']}"
        )
    if b.same_tokens_compiled is not None:
        compiled = b.results["tfcli-compiled"]
        out.print(
            f"tfcli-compiled: {compiled.compile_seconds:.1f} s to compile or load before its clock; "
            f"same greedy tokens as tfcli: {'yes' if b.same_tokens_compiled else 'no'}"
        )
    versus_peer = b.ratio("tfcli", "transformers")
    target = 2.0 if b.parameters < 20_000_000 else 1.5
    if versus_peer is not None:
        verdict = f" (target >= {target}: {'ok' if versus_peer >= target else 'MISSED'})" if b.batch == 1 else f" at {b.batch} rows each"
        out.print(
            f"tokens/s tfcli / transformers: {versus_peer:.3f}{verdict}; "
            f"same greedy tokens{' in every row' if b.batch > 1 else ''}: {'yes' if b.same_tokens else 'no'}"
        )
    versus_uncached = b.ratio("tfcli", "tfcli-no-cache")
    if versus_uncached is not None and b.batch > 1:
        out.print(f"cached / uncached: {versus_uncached:.2f}x at {b.batch} rows each")
    elif versus_uncached is not None:
        out.print(
            f"cached / uncached: {versus_uncached:.2f}x (target >= 5: {'ok' if versus_uncached >= 5 else 'MISSED'}"
            f"{'; at this size per-step overhead, not compute, sets both' if b.parameters < 20_000_000 else ''})"
        )
    versus_llama = b.time_per_token_vs("llama.cpp")
    if versus_llama is not None:
        threads = b.results["llama.cpp"].threads
        out.print(
            f"time per token tfcli / llama.cpp: {versus_llama:.3f} on {counted(threads, 'thread')} each (goal <= 1.2: {'ok' if versus_llama <= 1.2 else 'MISSED'}); "
            f"same greedy tokens: {'yes' if b.same_tokens_as_llama_cpp else 'no'}"
        )
    floor_target = "" if b.parameters < 20_000_000 or b.batch > 1 else f"; target <= 1.3: {'ok' if b.floor_ratio <= 1.3 else 'MISSED'}"
    unit = "step" if b.batch > 1 else "token"
    out.print(
        f"time per {unit} / floor: {b.floor_ratio:.3f} (median call; memory bandwidth beside it {b.bandwidth_gb_s:.1f} GB/s, "
        f"{human_bytes(b.weight_bytes)} of weights per {unit}{floor_target})"
    )
