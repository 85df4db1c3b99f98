"""`tfcli bench generate`: batch-1 greedy decoding speed of tfcli's generator (with and without the KV cache)
beside transformers' `GPT2LMHeadModel.generate` on the same random weights, and the floor set by reading
every weight once per token at the memory bandwidth this machine measures. With `against="llama.cpp"`, also
beside llama.cpp (llama-cpp-python) on the same weights exported to GGUF f32 by `tfcli export --to gguf`'s
code, with the thread count tfcli decodes on.

The weights are made once (seeded), saved as a run directory and exported with `tfcli export`'s code, so
both sides decode the same model; a synthetic byte-level tokenizer of exactly the model's vocabulary size
stands in for a trained one. tfcli's side is loaded exactly as `tfcli generate` loads a run (the same
loader, thread count and accelerated paths). Every measurement runs in a fresh subprocess; rounds are
interleaved and each job keeps its best time. The bandwidth is probed right before and right after each
timed call of the cached job, in the same process (one probe between two calls), so each call's time per
token is set against the floor of its own seconds: the machine's bandwidth moves from one second to the next.


Before the timed rounds an untimed tfcli run lets tfcli.accel measure its choices for these shapes on this
machine (kept in its decisions file), as the first run of any command here does: the rounds then time what
every later run does, and the first run's extra time and memory stay out of the table. The compiled step
(torch.compile over the decoding step, `tfcli.accel.compiled_step`) is tuned there too, its compile time
reported, and timed as a job of its own ("tfcli-compiled") beside the step tfcli chose; the "tfcli" job
decodes with whichever step won the tuning.

With `batch` N > 1, N prompts of the same length (seeded; the first is batch 1's prompt) are decoded together,
greedy, on every side: tfcli's generator with N rows, transformers' `generate` with the same N rows and an
attention mask (no row needs padding: the prompts are the same length). Times are per decoding step (every
row gains a token) and tokens/s counts every row's tokens; the floor is still the weights read once per step.
The jobs that decode one row only (the compiled step, llama.cpp through llama-cpp-python) are left out then,
each with its reason in `GenerateBench.left_out`; the "tfcli" job decodes with PyTorch's batch step (the C
step decodes one row)."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tfcli.accel import compiled_step
from tfcli.bench.common import keep_fastest, peak_rss_mb, run_worker
from tfcli.checkpoint import save_checkpoint
from tfcli.errors import TfcliError
from tfcli.generate.decoding import Generator
from tfcli.generate.events import Done
from tfcli.generate.settings import GenerationSettings
from tfcli.hf import export_gpt2, gpt2_incompatibility
from tfcli.loader import load_run
from tfcli.model.config import preset
from tfcli.model.transformer import Transformer
from tfcli.quant.linear import QuantEmbedding, QuantLinear
from tfcli.tokenizer.core import TextTokenizer

JOBS = ("tfcli", "tfcli-compiled", "transformers", "tfcli-no-cache", "llama.cpp")
GGUF_FILE = "model.gguf"
PROBE_BYTES = 256 * 1024 * 1024  # the bandwidth probe reads a tensor this large (far beyond any cache) ...
PROBE_SECONDS = 0.5  # ... again and again for this long, before and after each timed call
LARGE = 20_000_000  # parameters past which the uncached job runs once, not every round (minutes a call on a few cores)
ONE_ROW_JOBS = {  # the jobs that decode one row only, and why: left out (with this reason) at batch > 1
    "tfcli-compiled": "the compiled step decodes one row; serve's compiled batch step is timed by `tfcli bench serve --compiled`",
    "llama.cpp": "llama-cpp-python decodes one sequence",
}


@dataclasses.dataclass
class DecodeMeasurement:
    job: str
    seconds: float  # wall time of one generate call: the prompt, then every new token
    new_tokens: int
    peak_rss_mb: float
    first_tokens: list[int]  # the first generated ids (of the first row), to check both sides decode the same model
    kernel: str = ""  # tfcli on the CPU: what decoded the one row (`decode_step.describe`)
    bandwidth_gb_s: float = 0.0  # the cached tfcli job: read bandwidth probed beside its median call
    floor_ratio: float = 0.0  # ... and the median over its calls of time per token / that call's own floor
    threads: int = 0  # the threads it decoded on
    compile_seconds: float = 0.0  # a job that decoded with the compiled step: compiling it (or loading it from disk), before its clock
    rows: int = 1  # rows decoded together (new_tokens is per row: the decoding steps)
    row_tokens: list[list[int]] = dataclasses.field(default_factory=list)  # every row's first generated ids
    weight_bytes: int = 0  # tfcli's jobs: the bytes a step reads, in the dtype decoded in (`weights_read_per_step`)
    dtype: str = ""  # tfcli's jobs: the dtype its weights were decoded in ("float32", "bfloat16")

    @property
    def tokens_per_second(self) -> float:
        """Every row's tokens per second (at batch N, N tokens a step)."""
        return self.rows * self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def ms_per_step(self) -> float:
        """Milliseconds per decoding step, the prompt's pass included (at batch 1, per token)."""
        return self.seconds / self.new_tokens * 1e3 if self.new_tokens else 0.0


@dataclasses.dataclass
class GenerateBench:
    preset: str
    device: str
    threads: int
    prompt_tokens: int
    new_tokens: int
    block_size: int
    parameters: int
    weight_bytes: int  # bytes read per token: every weight once (the tied embedding once, position table not), as tfcli decoded them
    repeat: int
    results: dict[str, DecodeMeasurement]
    tuning: dict | None = None  # the compiled step's tuning in the first run: choice, seconds per candidate, compile_seconds
    batch: int = 1  # prompts decoded together (every side the same N prompts)
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)  # jobs asked for but not run at this batch, and why

    @property
    def bandwidth_gb_s(self) -> float:
        return self.results["tfcli"].bandwidth_gb_s if "tfcli" in self.results else 0.0

    @property
    def dtype(self) -> str:
        """What tfcli decoded in: the loader's choice (bfloat16 on a GPU that has it, else float32)."""
        return (self.results["tfcli"].dtype if "tfcli" in self.results else "") or "float32"

    @property
    def floor_seconds_per_token(self) -> float:
        return self.weight_bytes / (self.bandwidth_gb_s * 1e9) if self.bandwidth_gb_s else 0.0

    def ratio(self, a: str, b: str) -> float | None:
        if a in self.results and b in self.results:
            return self.results[a].tokens_per_second / self.results[b].tokens_per_second
        return None

    @property
    def floor_ratio(self) -> float:
        """tfcli's time per token / the floor measured beside it (the median over its calls)."""
        return self.results["tfcli"].floor_ratio if "tfcli" in self.results else 0.0

    @property
    def same_tokens(self) -> bool | None:
        """Whether tfcli and transformers decoded the same greedy ids, row by row."""
        if "transformers" not in self.results:
            return None
        ours, theirs = self.results["tfcli"], self.results["transformers"]
        return ours.first_tokens == theirs.first_tokens and ours.row_tokens == theirs.row_tokens

    @property
    def same_tokens_as_llama_cpp(self) -> bool | None:
        if "llama.cpp" not in self.results:
            return None
        return self.results["tfcli"].first_tokens == self.results["llama.cpp"].first_tokens

    @property
    def same_tokens_compiled(self) -> bool | None:
        if "tfcli-compiled" not in self.results:
            return None
        return self.results["tfcli"].first_tokens == self.results["tfcli-compiled"].first_tokens

    def time_per_token_vs(self, job: str) -> float | None:
        """tfcli's time per token / `job`'s (below 1: tfcli is faster)."""
        return self.ratio(job, "tfcli")

    def to_json(self) -> dict:
        return {
            "preset": self.preset,
            "device": self.device,
            "threads": self.threads,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "block_size": self.block_size,
            "parameters": self.parameters,
            "weight_bytes": self.weight_bytes,
            "dtype": self.dtype,
            "bandwidth_gb_s": round(self.bandwidth_gb_s, 3),
            "repeat": self.repeat,
            "floor_ms_per_token": round(self.floor_seconds_per_token * 1e3, 4),
            "results": [{**dataclasses.asdict(m), "tokens_per_second": round(m.tokens_per_second, 3)} for m in self.results.values()],
            "speedup_vs_transformers": _round(self.ratio("tfcli", "transformers")),
            "speedup_vs_no_cache": _round(self.ratio("tfcli", "tfcli-no-cache")),
            "time_per_token_vs_floor": round(self.floor_ratio, 4),
            "same_tokens": self.same_tokens,
            "time_per_token_vs_llama_cpp": _round(self.time_per_token_vs("llama.cpp")),
            "same_tokens_as_llama_cpp": self.same_tokens_as_llama_cpp,
            "same_tokens_compiled": self.same_tokens_compiled,
            "tuning": self.tuning,
            "batch": self.batch,
            "ms_per_step": {name: round(m.ms_per_step, 4) for name, m in self.results.items()},
            "left_out": self.left_out,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def bench_config(preset_name: str, prompt_tokens: int, new_tokens: int, against: str | None = None):
    """The preset's shape, its context widened to hold the prompt and every new token (GPT-2 cannot
    slide a window, so both sides must fit the whole text); against llama.cpp, with GPT-2's own GELU
    (the tanh approximation), the one llama.cpp's gpt2 has."""
    config = preset(preset_name)
    config = config.with_overrides(block_size=max(config.block_size, prompt_tokens + new_tokens))
    return config.with_overrides(activation="gelu_tanh") if against == "llama.cpp" else config


def synthetic_tokenizer(vocab_size: int, folder: Path) -> Path:
    """A byte-level BPE tokenizer with exactly `vocab_size` tokens (256 bytes, pairs of them, <|endoftext|>)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = []
    for a in alphabet:
        for b in alphabet:
            if len(vocab) >= vocab_size - 1:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def prepare(work: Path, preset_name: str, prompt_tokens: int, new_tokens: int, against: str | None = None) -> tuple[Path, Path, int, int]:
    """Seeded random weights saved as a run directory and exported to a GPT-2 folder (and against
    llama.cpp, to WORK/model.gguf, f32). Returns both paths, the parameter count and the weight bytes read per token
    in float32 (the dtype saved; the tfcli jobs count what they decode in)."""
    config = bench_config(preset_name, prompt_tokens, new_tokens, against)
    problem = gpt2_incompatibility(config)
    if problem:
        raise TfcliError(f"preset {preset_name!r} cannot be built as GPT-2: {problem}", hint="use a decoder preset such as tiny or gpt2-small")
    tokenizer = TextTokenizer.load(synthetic_tokenizer(config.vocab_size, work / "tokenizer"))
    torch.manual_seed(0)
    model = Transformer(config).eval()
    run_dir, hf_dir = work / "run", work / "hf"
    save_checkpoint(run_dir, model, tokenizer)
    export_gpt2(run_dir, hf_dir)
    if against == "llama.cpp":
        from tfcli.gguf import export_gguf  # noqa: PLC0415  the gguf extra

        export_gguf(run_dir, work / GGUF_FILE, "f32")
    return run_dir, hf_dir, model.parameter_count(), weights_read_per_step(model)


def weights_read_per_step(model: torch.nn.Module) -> int:
    """The bytes of weights one decoding step reads, in the dtype each is held in: every parameter once (a tied
    head shares the embedding's) and a quantized layer's blocks, but not a learned position table (one row a
    step). Example: gpt2-small, 124.4M parameters less 0.8M of positions: 494.6 MB in float32, 247.3 MB in bfloat16."""
    read: dict[int, int] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        owner = model.get_submodule(name.rpartition(".")[0])
        quantized = isinstance(owner, (QuantLinear, QuantEmbedding)) and name.endswith(".blocks")
        if (isinstance(tensor, torch.nn.Parameter) or quantized) and name != "pos_emb.weight":
            read[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    return sum(read.values())


def _prompt(vocab_size: int, length: int) -> list[int]:
    return _prompts(vocab_size, length, 1)[0]


def _prompts(vocab_size: int, length: int, rows: int) -> list[list[int]]:
    """`rows` seeded prompts of `length` ids (never the eos id, the last); the first is the same at every batch."""
    generator = torch.Generator().manual_seed(1234)
    return torch.randint(0, vocab_size - 1, (rows, length), generator=generator).tolist()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _probe_bandwidth(device: str, buffer) -> float:
    """GB/s of reading `buffer` over and over for PROBE_SECONDS. Decoding reads the weights and writes
    almost nothing, so the probe only reads: a sum over the buffer."""
    with torch.inference_mode():
        buffer.sum()
        _sync(device)
        passes, started = 0, time.perf_counter()
        while True:
            for _ in range(4):
                buffer.sum()
            passes += 4
            _sync(device)
            elapsed = time.perf_counter() - started
            if elapsed >= PROBE_SECONDS:
                return buffer.numel() * buffer.element_size() * passes / elapsed / 1e9


def _decode_job(
    job: str, run_dir: Path, hf_dir: Path, prompt_tokens: int, new_tokens: int, threads: int, device: str, weight_bytes: int, batch: int = 1
) -> DecodeMeasurement:
    """One measurement, inside the worker subprocess: a short warm-up call, then the best of three timed
    calls (two for models over 20M parameters); the cached tfcli job probes the bandwidth around each.
    `batch` rows are decoded together (the one-row jobs take batch 1 only)."""
    if batch > 1 and job in ONE_ROW_JOBS:
        raise TfcliError(f"{job} decodes one row: {ONE_ROW_JOBS[job]}")
    machine_threads = torch.get_num_threads()
    compiled_in = 0.0
    read, dtype = 0, ""  # tfcli's jobs: the bytes a step reads and their dtype, as the loader made them (bf16 on a GPU)
    if job in ("tfcli", "tfcli-no-cache", "tfcli-compiled"):
        checkpoint = load_run(run_dir, "decode", device, threads)  # as `tfcli generate` loads it
        model = checkpoint.model
        read, dtype = weights_read_per_step(model), str(next(model.parameters()).dtype).removeprefix("torch.")
        prompts = _prompts(checkpoint.config.model.vocab_size, prompt_tokens, batch)
        if job == "tfcli-compiled":
            model.fast_decode_step = functools.partial(compiled_step.bind, force=True)
        if job == "tfcli-compiled" or (job == "tfcli" and batch == 1 and model.fast_decode_step is not None and compiled_step.chosen(model)):
            compiled_in = compiled_step.warm(model, prompt_tokens + new_tokens)  # before the clock, as `tune` measured it

        def decode(n: int) -> list[list[int]]:
            settings = GenerationSettings(max_new_tokens=n, stop_at_eos=False, use_cache=job != "tfcli-no-cache")
            generator = Generator(checkpoint.model, checkpoint.tokenizer, settings, batch_size=batch)  # every row in one batch
            for event in generator.run_ids(prompts):
                if isinstance(event, Done):
                    return [list(c.tokens) for c in event.completions]
            raise AssertionError("the generator ended without Done")
    elif job == "llama.cpp":
        import llama_cpp

        n_threads = threads or machine_threads
        model = llama_cpp.Llama(
            model_path=str(run_dir.parent / GGUF_FILE), n_ctx=prompt_tokens + new_tokens, n_threads=n_threads, n_threads_batch=n_threads, verbose=False
        )
        prompt = _prompt(model.n_vocab(), prompt_tokens)

        def decode(n: int) -> list[list[int]]:
            model.reset()  # no prompt kept from the call before: each call decodes the whole text, as the others do
            tokens = []
            for token in model.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
                tokens.append(token)
                if len(tokens) == n:
                    break
            return [tokens]
    else:
        import transformers

        if threads:
            torch.set_num_threads(threads)
        transformers.logging.set_verbosity_error()
        model = transformers.GPT2LMHeadModel.from_pretrained(str(hf_dir)).to(device).eval()
        if device.startswith("cuda") and torch.cuda.is_bf16_supported():
            model.to(torch.bfloat16)  # the dtype tfcli decodes in on a GPU (tfcli.loader.prepare): like against like
        model.generation_config.eos_token_id = None  # decode every token, as tfcli does here
        model.generation_config.pad_token_id = 0
        # N rows of the same length: nothing to pad (left padding is what a batch of unequal prompts would need)
        input_ids = torch.tensor(_prompts(model.config.vocab_size, prompt_tokens, batch), device=device)
        attention_mask = torch.ones_like(input_ids)

        def decode(n: int) -> list[list[int]]:
            with torch.inference_mode():
                out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=n, do_sample=False, use_cache=True)
            return out[:, prompt_tokens:].tolist()

    decode(min(new_tokens, 32))  # warm-up: allocators, kernels, caches
    small = weight_bytes < 80_000_000
    probing = job == "tfcli"
    buffer = torch.rand(PROBE_BYTES // 4, device=device) if probing else None
    calls: list[tuple[float, float]] = []  # (seconds, GB/s around the call)
    rows: list[list[int]] = [[]]
    before = _probe_with_threads(device, buffer, machine_threads) if probing else 0.0
    for _ in range(3 if small else 2):  # the best of three calls (two for large models) in this process too
        _sync(device)
        started = time.perf_counter()
        rows = decode(new_tokens)
        _sync(device)
        seconds = time.perf_counter() - started
        after = _probe_with_threads(device, buffer, machine_threads) if probing else 0.0
        calls.append((seconds, (before + after) / 2))
        before = after  # the probe after one call is the probe before the next
    seconds = min(call[0] for call in calls)
    tokens = rows[0]
    bandwidth = ratio = 0.0
    if probing:  # the median call: its time per step over the floor of its own seconds (weights read once a step), and that bandwidth
        ratios = sorted(((s / len(tokens)) / (read / (gb_s * 1e9)), gb_s) for s, gb_s in calls)
        ratio, bandwidth = ratios[(len(ratios) - 1) // 2]
    kernel = compiled_step.describe(model) if job in ("tfcli", "tfcli-no-cache") and device == "cpu" else ""
    if batch > 1 and job in ("tfcli", "tfcli-no-cache"):
        kernel = f"PyTorch's batch step, {batch} rows (the C step and the compiled step decode one row)"
    if job == "tfcli-compiled":
        kernel = f"the step compiled by torch.compile ({compiled_step.mode_for(torch.device(device))} mode)"
    used = n_threads if job == "llama.cpp" else torch.get_num_threads()
    return DecodeMeasurement(
        job, seconds, len(tokens), peak_rss_mb(), tokens[:32], kernel, bandwidth, ratio, used, compiled_in, len(rows), [row[:32] for row in rows], read, dtype
    )


def _tune_job(run_dir: Path, prompt_tokens: int, new_tokens: int, threads: int, device: str) -> dict:
    """The compiled step's tuning, inside a worker: compile it for this shape, time it beside PyTorch's step and
    the C step, record the winner in tfcli.accel's decisions (a decision already there is kept)."""
    model = load_run(run_dir, "decode", device, threads).model
    return compiled_step.tune(model, prompt_tokens + new_tokens).to_json()


def _probe_with_threads(device: str, buffer, threads: int) -> float:
    """The probe on every thread the machine gives PyTorch (a small model decodes on one), then back."""
    decoding_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _probe_bandwidth(device, buffer)
    finally:
        torch.set_num_threads(decoding_threads)


def run_generate_bench(
    work: Path,
    preset_name: str = "tiny",
    *,
    prompt_tokens: int = 16,
    new_tokens: int = 256,
    repeat: int = 3,
    threads: int = 0,
    device: str = "cpu",
    no_cache: bool | None = None,
    quick: bool = False,
    peer: bool = True,
    first_run: bool = True,
    against: str | None = None,
    compiled: bool = True,
    batch: int = 1,
    progress=None,
) -> GenerateBench:
    """Measure every job `repeat` rounds, interleaved, best time kept (after the untimed first run unless
    `first_run` is False). The uncached job re-runs the whole text for every token; it runs every round for
    small models and once for large ones (no_cache=None; not at all for large ones where `quick`), always
    (True) or never (False). `compiled`: tune the compiled step in the first run and time it as a job of its own.
    `batch`: prompts decoded together; past 1 the one-row jobs (ONE_ROW_JOBS) are left out, with their reasons."""
    if repeat < 1:
        raise TfcliError(f"--repeat must be at least 1, not {repeat}")
    if prompt_tokens < 1 or new_tokens < 1:
        raise TfcliError("--prompt-tokens and --new-tokens must be at least 1")
    if batch < 1:
        raise TfcliError(f"--batch must be at least 1, not {batch}")
    asked = {"tfcli-compiled": compiled, "llama.cpp": against == "llama.cpp"}
    left_out = {job: reason for job, reason in ONE_ROW_JOBS.items() if batch > 1 and asked[job]}
    compiled = compiled and "tfcli-compiled" not in left_out

    config = bench_config(preset_name, prompt_tokens, new_tokens, against)
    problem = gpt2_incompatibility(config)
    if problem:
        raise TfcliError(f"preset {preset_name!r} cannot be built as GPT-2: {problem}", hint="use a decoder preset such as tiny or gpt2-small")
    if progress:
        progress("making the weights")
    # in a worker too: a process inherits its parent's peak RSS, so the parent must stay small
    made = run_worker("tfcli.bench.generate", ["prepare", str(work), preset_name, str(prompt_tokens), str(new_tokens), against or ""])
    run_dir, hf_dir, parameters, weight_bytes = Path(made["run"]), Path(made["hf"]), made["parameters"], made["weight_bytes"]
    block = config.block_size
    results: dict[str, DecodeMeasurement] = {}
    args = [str(run_dir), str(hf_dir), str(prompt_tokens), str(new_tokens), str(threads), device, str(weight_bytes), str(batch)]
    if first_run:  # untimed: tfcli measures its choices for this shape here once, as any first run on a machine does
        if progress:
            progress("tfcli measuring its choices here (once)")
        run_worker("tfcli.bench.generate", ["tfcli", *args[:3], "2", *args[4:]])
    tuning = None
    if first_run and compiled:
        if progress:
            progress("tuning the compiled step (compiling it once)")
        tuning = run_worker("tfcli.bench.generate", ["tune", *args[:-1]])
    for round_number in range(1, repeat + 1):
        for job in JOBS:
            if (job == "transformers" and not peer) or (job == "llama.cpp" and against != "llama.cpp") or (job == "tfcli-compiled" and not compiled):
                continue
            if job in left_out:
                continue
            if job == "tfcli-no-cache" and not _uncached_in_round(round_number, parameters, no_cache, quick):
                continue
            if progress:
                progress(f"{job} (round {round_number} of {repeat})")
            job_args = list(args)
            if job == "llama.cpp" and threads == 0 and "tfcli" in results:  # the threads tfcli chose to decode on
                job_args[4] = str(results["tfcli"].threads)
            keep_fastest(results, job, DecodeMeasurement(**run_worker("tfcli.bench.generate", [job, *job_args])))
    return GenerateBench(
        preset=preset_name,
        device=device,
        threads=threads,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        block_size=block,
        parameters=parameters,
        weight_bytes=results["tfcli"].weight_bytes if "tfcli" in results else weight_bytes,  # as decoded: bf16 on a GPU
        repeat=repeat,
        results=results,
        tuning=tuning,
        batch=batch,
        left_out=left_out,
    )


def _uncached_in_round(round_number: int, parameters: int, no_cache: bool | None, quick: bool) -> bool:
    """Whether the uncached job runs in this round: as no_cache says, else every round for a small model and
    the first for a large one (none in a quick run)."""
    if no_cache is not None:
        return no_cache
    return parameters <= LARGE or (round_number == 1 and not quick)


def worker(argv: list[str]) -> dict:
    """One worker's job from its arguments (`run_worker` passes them): `prepare WORK PRESET PROMPT NEW [AGAINST]`,
    `tune RUN HF PROMPT NEW THREADS DEVICE BYTES`, or a job's name with those and the batch; returns its JSON object."""
    if argv[0] == "prepare":
        work_arg, preset_arg, prompt_arg, new_arg, *against_arg = argv[1:]
        run_path, hf_path, n_parameters, n_bytes = prepare(Path(work_arg), preset_arg, int(prompt_arg), int(new_arg), (against_arg or [""])[0] or None)
        return {"run": str(run_path), "hf": str(hf_path), "parameters": n_parameters, "weight_bytes": n_bytes}
    job_name, run_arg, hf_arg, prompt_arg, new_arg, threads_arg, device_arg, bytes_arg, *batch_arg = argv
    if job_name == "tune":
        return _tune_job(Path(run_arg), int(prompt_arg), int(new_arg), int(threads_arg), device_arg)
    measured = _decode_job(
        job_name, Path(run_arg), Path(hf_arg), int(prompt_arg), int(new_arg), int(threads_arg), device_arg, int(bytes_arg), int((batch_arg or ["1"])[0])
    )
    return dataclasses.asdict(measured)


if __name__ == "__main__":
    print(json.dumps(worker(sys.argv[1:])))
