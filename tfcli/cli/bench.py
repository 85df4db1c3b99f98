"""`tfcli bench`: speed on this machine, side by side with peers, as ratios measured in one run.

One module for the bench commands (over 400 lines): most of it is their typer option lists and tables; each
command only checks its options and renders what a `tfcli.bench` module measured."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import JsonFlag, Typer, at_least, human_bytes, print_json, print_table, stderr_console, stdout_console

app = Typer(
    help="Measure tfcli's speed beside its peers (ratios from one run, on this machine).\n\n\b\nExample: tfcli bench tokenize --size-mb 10 --repeat 1",
    no_args_is_help=True,
    rich_markup_mode=None,
)


FirstRun = Annotated[
    bool,
    typer.Option(
        "--first-run/--no-first-run",
        help="An untimed run first, in which tfcli measures its choices for these shapes on this machine (kept in its decisions file), "
        "so the rounds time what every later run does. --no-first-run leaves it out: where an earlier run measured them, or for a quick check.",
    ),
]
MAX_BENCH_TOKENS = 8192  # prompt + new tokens in `bench generate` (the uncached job re-runs all of them per token)


def _machine() -> str:
    """The processor as lscpu names it, its vector extensions, cores, Python and torch: beside every table."""
    import os

    from tfcli.accel.machine import processor_name, vector_extensions

    torch_version = ""
    try:
        from importlib.metadata import version

        torch_version = f", torch {version('torch')}"
    except Exception:  # no metadata: leave it out
        pass
    return (
        f"{processor_name()} ({' '.join(vector_extensions()) or 'no vector extensions listed'}), {os.cpu_count()} cores, "
        f"Python {platform.python_version()}{torch_version}"
    )


def accel_summary() -> str:
    """What tfcli.accel chose on this machine so far, kind by kind (`tfcli info --device` lists each)."""
    from collections import Counter

    from tfcli.accel import enabled, report

    if not enabled():
        return "none (TFCLI_ACCEL=0: plain PyTorch)"
    counts: Counter = Counter()
    for key, decision in report()["decisions"].items():
        counts[(key.split()[0], decision["choice"])] += 1
    kinds = {}
    for (kind, choice), count in sorted(counts.items()):
        kinds.setdefault(kind, []).append(f"{choice} {count}")
    return "; ".join(f"{kind}: {', '.join(parts)}" for kind, parts in kinds.items()) or "nothing measured yet"


def _scratch_folder(workdir: Path | None, name: str = "") -> Path:
    """Where a bench writes: a new temporary folder (removed afterwards), or --workdir (made if need be)."""
    import tempfile

    from tfcli.fsutil import prepare_output_dir

    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="tfcli-bench-"))
    return prepare_output_dir(workdir / name if name else workdir, "scratch", option="--workdir")


@app.command("tokenize")
def tokenize(
    corpus: Annotated[
        Optional[list[str]], typer.Option("--corpus", help="Text to measure on (repeatable); default: synthesized from sample_data/.", show_default=False)
    ] = None,
    size_mb: Annotated[float, typer.Option(help="Size of the synthesized corpus in MB.")] = 50.0,
    repeat: Annotated[int, typer.Option(help="Rounds of all four jobs, interleaved; each job keeps its best time.")] = 3,
    workdir: Annotated[Optional[Path], typer.Option(help="Scratch folder (default: a temporary one, removed afterwards).", show_default=False)] = None,
    data: Annotated[Optional[Path], typer.Option(help="Sample data to synthesize from (default: ./sample_data).", show_default=False)] = None,
    json_output: JsonFlag = False,
) -> None:
    """Time `tokenize train` and `tokenize encode` against raw `tokenizers` calls on the same text.

    Targets: train time <= 1.10x raw BpeTrainer; encode throughput >= 2.5x raw encode_batch where tfcli
    encodes with tiktoken (installed, and a byte-level BPE tokenizer), else >= 0.9x; encode peak RSS under 500 MB.

    \b
    Example: tfcli bench tokenize --size-mb 50
    """
    import shutil

    from tfcli.bench.tokenize import run_tokenize_bench
    from tfcli.errors import TfcliError
    from tfcli.quickstart import find_sample_data

    if size_mb <= 0:
        raise TfcliError(f"--size-mb must be positive, not {size_mb}")
    sample = None if corpus else find_sample_data(data) / "corpus"
    scratch = _scratch_folder(workdir)
    console = stderr_console()
    try:
        with console.status("benchmarking") as status:
            result = run_tokenize_bench(
                scratch, corpus=corpus, size_mb=size_mb, sample=sample, repeat=repeat, progress=lambda job: status.update(f"benchmarking: {job}")
            )
    finally:
        if workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    machine = _machine()
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
    console_out.print(f"encode peak RSS: {result.encode_tfcli.peak_rss_mb:.0f} MB (target < 500 MB: {rss_ok})")


@app.command("model")
def model(
    preset: Annotated[str, typer.Option(help="The model shape (a preset name).")] = "gpt2-small",
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 4,
    length: Annotated[
        Optional[int], typer.Option(help="Tokens per sequence [default: 256, or the preset's context where shorter].", show_default=False)
    ] = None,
    steps: Annotated[int, typer.Option(help="Timed steps per implementation (best kept), after one warm-up step.")] = 3,
    repeat: Annotated[int, typer.Option(help="Interleaved rounds, each implementation in a fresh process; the fastest kept.")] = 2,
    first_run: FirstRun = True,
    json_output: JsonFlag = False,
) -> None:
    """Time one training step (forward + backward, fp32 on CPU) of tfcli's model beside transformers' GPT-2.

    Both build the same shape from the preset (which must be GPT-2-expressible), each in its own
    process; the table gives seconds per step and peak memory. Targets: tfcli <= 1.0x the time on every
    machine (0.8x where a library faster than PyTorch's default was measured), <= 0.6x the memory.

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
    if min(batch, length, steps, repeat) < 1:
        raise TfcliError("--batch, --length, --steps and --repeat must be at least 1")
    if length > shape.block_size:
        raise TfcliError(f"--length {length} is longer than {preset}'s block size ({shape.block_size})", hint=f"pass --length {shape.block_size} or less")
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise TfcliError("bench model compares against transformers, which is not installed", hint="pip install transformers") from exc
    with stderr_console().status(f"benchmarking {preset} at {batch} x {length}"):
        results = run_model_bench(preset, batch, length, steps, repeat=repeat, first_run=first_run)
    ours, theirs = results
    ratio = ours.seconds_per_step / theirs.seconds_per_step
    machine = _machine()
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
    console.print(f"peak memory ratio tfcli/transformers: {ours.peak_rss_mb / theirs.peak_rss_mb:.3f} (target <= 0.6)")
    console.print(f"tfcli's choices on this machine: {accel_summary()}")


@app.command("generate")
def generate(
    preset: Annotated[list[str], typer.Option("--preset", help="Model shapes to measure (repeatable; decoder presets GPT-2 can express).")] = [  # noqa: B006
        "tiny",
        "gpt2-small",
    ],
    prompt_tokens: Annotated[int, typer.Option(help="Prompt length in tokens (random ids, the same on both sides).")] = 16,
    new_tokens: Annotated[int, typer.Option(help="Tokens generated per call, greedy, end-of-text ignored.")] = 256,
    repeat: Annotated[int, typer.Option(help="Rounds of every job, interleaved; each job keeps its best time.")] = 3,
    threads: Annotated[int, typer.Option(help="torch threads in every job (0: torch's default, all cores).")] = 0,
    device: Annotated[str, typer.Option(help="cpu or cuda (fp32 either way).")] = "cpu",
    no_cache: Annotated[
        Optional[bool],
        typer.Option(
            "--no-cache/--skip-no-cache",
            help="Measure decoding without the KV cache every round / never (default: every round for small models, once for large).",
            show_default=False,
        ),
    ] = None,
    workdir: Annotated[
        Optional[Path], typer.Option(help="Scratch folder for the weights (default: a temporary one, removed afterwards).", show_default=False)
    ] = None,
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

    \b
    Example: tfcli bench generate --preset tiny --preset gpt2-small --repeat 3
    """
    import shutil

    from tfcli.bench.generate import run_generate_bench
    from tfcli.errors import TfcliError
    from tfcli.runtime import resolve_device

    if device != "cpu" and not device.startswith("cuda"):
        raise TfcliError(f"--device must be cpu, cuda or cuda:N, not {device!r}")
    device = resolve_device(device)
    if min(repeat, prompt_tokens, new_tokens) < 1 or threads < 0:
        raise TfcliError("--repeat, --prompt-tokens and --new-tokens must be at least 1, --threads at least 0")
    if prompt_tokens + new_tokens > MAX_BENCH_TOKENS:
        raise TfcliError(
            f"--prompt-tokens + --new-tokens is {prompt_tokens + new_tokens:,}; the bench decodes at most {MAX_BENCH_TOKENS:,}",
            hint="the issue's setting is 16 + 256",
        )
    if workdir is not None:
        _scratch_folder(workdir)
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise TfcliError("bench generate compares against transformers, which is not installed", hint="pip install transformers") from exc
    machine = _machine()
    benches = []
    console = stderr_console()
    for name in preset:
        scratch = _scratch_folder(workdir, name)
        try:
            with console.status(f"benchmarking {name}") as status:
                benches.append(
                    run_generate_bench(
                        scratch,
                        name,
                        prompt_tokens=prompt_tokens,
                        new_tokens=new_tokens,
                        repeat=repeat,
                        threads=threads,
                        device=device,
                        no_cache=no_cache,
                        first_run=first_run,
                        progress=lambda job, name=name: status.update(f"benchmarking {name}: {job}"),
                    )
                )
        finally:
            if workdir is None:
                shutil.rmtree(scratch, ignore_errors=True)
    if json_output:
        print_json({"machine": machine, "benches": [b.to_json() for b in benches]})
        return
    out = stdout_console()
    for b in benches:
        _print_generate_bench(out, b, machine)
    out.print(f"tfcli's choices on this machine: {accel_summary()}")


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
    floor_target = "" if b.parameters < 20_000_000 else f"; target <= 1.3: {'ok' if b.floor_ratio <= 1.3 else 'MISSED'}"
    out.print(
        f"time per token / floor: {b.floor_ratio:.3f} (median call; memory bandwidth beside it {b.bandwidth_gb_s:.1f} GB/s, "
        f"{human_bytes(b.weight_bytes)} of weights per token{floor_target})"
    )


@app.command("train")
def train(
    presets: Annotated[str, typer.Option("--presets", help="Comma-separated decoder presets to measure.")] = "tiny,small",
    batch: Annotated[int, typer.Option(help="Sequences per step (each the preset's block size long).")] = 16,
    steps: Annotated[int, typer.Option(help="Timed steps per run, after 3 warm-up steps.")] = 10,
    repeat: Annotated[int, typer.Option(help="Interleaved rounds; the best of each is kept.")] = 1,
    device: Annotated[str, typer.Option(help="cpu, cuda, mps or auto.")] = "cpu",
    precision: Annotated[str, typer.Option(help="auto (bf16 on a GPU that has it, else fp32), fp32 or bf16.")] = "auto",
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

    if device not in ("cpu", "cuda", "mps", "auto"):
        raise TfcliError(f"--device must be cpu, cuda, mps or auto, not {device!r}")
    resolve_device(device)  # there, on this machine
    if precision not in ("auto", "fp32", "bf16"):
        raise TfcliError(f"--precision must be auto, fp32 or bf16, not {precision!r}")
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise TfcliError("bench train compares against transformers, which is not installed", hint="pip install transformers") from exc
    with stderr_console().status(f"benchmarking training of {', '.join(names)} at batch {batch}"):
        results = run_train_bench(names, batch, steps, repeat=repeat, device=device, precision=precision, first_run=first_run)
    machine = f"{_machine()}, device {device}"
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


@app.command("lora")
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
    repeat: Annotated[int, typer.Option(help="Interleaved rounds; the fastest of each kind is kept (and its highest peak RSS).")] = 1,
    threads: Annotated[int, typer.Option(help="Threads per run (0: PyTorch's default).")] = 0,
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
    from tfcli.bench.lora import run_lora_bench
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
    from tfcli.adapters.lora import check_rank

    check_rank(config, rank, groups)
    if workdir is not None:
        from tfcli.fsutil import prepare_output_dir

        prepare_output_dir(workdir, "scratch", option="--workdir")
    with stderr_console().status(f"benchmarking full fine-tuning and LoRA rank {rank} of {preset} at batch {batch} x {block_size}"):
        result = run_lora_bench(preset, rank, ",".join(groups), batch, block_size, steps, repeat=repeat, threads=threads, workdir=workdir)
    machine = f"{_machine()}, device cpu"
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
