"""`tfcli bench generate --against llama.cpp --type f32,bf16,q8_0,q4_0,q4_k_m`: batch-1 greedy decoding at each
weight type, tfcli beside llama.cpp (llama-cpp-python) on the same bytes, and the floor of reading those bytes once
per token at the bandwidth this machine measures; at one thread and at every core.

The weights are seeded random, at a GPT-2 shape (a preset) or SmolLM2-135M's Llama shape (`SHAPES`); tfcli's run
at each type is made by `tfcli quantize` (f32: the run itself), and llama.cpp decodes that run's own export,
`tfcli export --to gguf --type` (the block bytes unchanged), so both sides read the same weights. Each measurement
runs in a fresh subprocess; the time per token is the time of 1 + N new tokens less that of 1, over N (the
prompt and each call's setup left out), the best of `repeat` calls: CPU time at one thread (the process's own,
which other jobs on a loaded machine do not inflate), wall time on several (no other clock says what a user
waits), so on a loaded machine the several-thread figures are noisy for both sides alike.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from tfcli.bench.common import run_worker
from tfcli.bench.generate import _probe_bandwidth, _prompt, synthetic_tokenizer
from tfcli.checkpoint import quantize_run, save_checkpoint
from tfcli.errors import TfcliError
from tfcli.generate.decoding import Generator
from tfcli.generate.events import Done
from tfcli.generate.settings import GenerationSettings
from tfcli.loader import load_run
from tfcli.model.config import ModelConfig, preset
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer

TYPES = ("f32", "bf16", "q8_0", "q4_0", "q4_k_m")
CPU_CLOCK = False  # set in a worker timing one thread: CPU time per token rather than wall time
# SmolLM2-135M's shape (its config.json): a Llama of 30 layers, 576 wide, 9 heads and 3 KV heads of 64, MLP 1536, tied
SHAPES = {
    "smollm2-135m": dict(
        arch="decoder",
        vocab_size=49152,
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        d_model=576,
        d_ff=1536,
        positions="rotary",
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
        tie_embeddings=True,
        rope_base=100000.0,
    ),
}


@dataclasses.dataclass
class TypeMeasurement:
    type: str
    threads: int
    tfcli_ms: float  # per token
    llama_cpp_ms: float
    weight_bytes: int  # the run's model.safetensors: what one token reads (less a learned position table's unread rows)
    bandwidth_gb_s: float  # the read bandwidth measured on these threads right before the pair
    same_tokens: bool  # the same greedy ids on both sides

    @property
    def floor_ms(self) -> float:
        return self.weight_bytes / (self.bandwidth_gb_s * 1e9) * 1e3


def shape_config(name: str, prompt_tokens: int, new_tokens: int) -> ModelConfig:
    """A GPT-2 preset (with GPT-2's own tanh GELU, the one llama.cpp runs) or a shape of SHAPES, its context
    holding the prompt and every new token."""
    config = ModelConfig().with_overrides(**SHAPES[name]) if name in SHAPES else preset(name).with_overrides(activation="gelu_tanh")
    return config.with_overrides(block_size=prompt_tokens + new_tokens + 8)


def prepare(work: Path, shape: str, types: list[str], prompt_tokens: int, new_tokens: int) -> dict[str, list[str]]:
    """The f32 run at WORK/f32 and its GGUF export, and for each type its run (tfcli quantize) and that run's
    export; returns {type: [run folder, gguf file]}."""
    from tfcli.gguf import export_gguf  # noqa: PLC0415  the gguf extra

    config = shape_config(shape, prompt_tokens, new_tokens)
    tokenizer = TextTokenizer.load(synthetic_tokenizer(config.vocab_size, work / "tokenizer"))
    torch.manual_seed(0)
    save_checkpoint(work / "f32", Transformer(config).eval(), tokenizer)
    made = {}
    for kind in types:
        run = work / "f32" if kind == "f32" else work / kind
        if kind != "f32":
            quantize_run(work / "f32", run, kind)
        export_gguf(run, work / f"{kind}.gguf", kind)
        made[kind] = [str(run), str(work / f"{kind}.gguf")]
    return made


def _timed(decode, new_tokens: int, repeat: int) -> tuple[float, list[int]]:
    """Seconds per token: (time of 1 + N tokens - time of 1) / N, each the best of `repeat` calls."""
    decode(min(8, new_tokens))  # warm-up
    one = min(_clock(decode, 1)[0] for _ in range(repeat))
    calls = [_clock(decode, new_tokens + 1) for _ in range(repeat)]
    return max(0.0, min(c[0] for c in calls) - one) / new_tokens, calls[0][1]


def _clock(decode, n: int) -> tuple[float, list[int]]:
    """A call's seconds: wall time, or with CPU_CLOCK (one thread) this process's CPU time, which a loaded machine's
    other jobs do not inflate."""
    clock = time.process_time if CPU_CLOCK else time.perf_counter
    started = clock()
    tokens = decode(n)
    return clock() - started, tokens


def decode_job(side: str, run: Path, gguf: Path, threads: int, prompt_tokens: int, new_tokens: int, repeat: int) -> dict:
    """One side's time per token, inside a worker subprocess (one thread: CPU time; more: wall time)."""
    global CPU_CLOCK
    CPU_CLOCK = threads == 1
    if side == "tfcli":
        checkpoint = load_run(run, "decode", "cpu", threads)  # as `tfcli generate --threads` loads it
        prompt = _prompt(checkpoint.config.model.vocab_size, prompt_tokens)

        def decode(n: int) -> list[int]:
            settings = GenerationSettings(max_new_tokens=n, stop_at_eos=False)
            for event in Generator(checkpoint.model, checkpoint.tokenizer, settings, batch_size=1).run_ids([prompt]):
                if isinstance(event, Done):
                    return event.completions[0].tokens
            raise AssertionError("the generator ended without Done")
    else:
        import llama_cpp

        model = llama_cpp.Llama(model_path=str(gguf), n_ctx=prompt_tokens + new_tokens + 8, n_threads=threads, n_threads_batch=threads, verbose=False)
        prompt = _prompt(model.n_vocab(), prompt_tokens)

        def decode(n: int) -> list[int]:
            model.reset()
            tokens = []
            for token in model.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
                tokens.append(token)
                if len(tokens) == n:
                    break
            return tokens

    seconds, tokens = _timed(decode, new_tokens, repeat)
    return {"seconds": seconds, "tokens": tokens[:32]}


def run_quant_bench(
    work: Path, shape: str, types: list[str], thread_counts: list[int], *, prompt_tokens: int = 16, new_tokens: int = 64, repeat: int = 2, progress=None
) -> list[TypeMeasurement]:
    """Every type at every thread count: tfcli, then llama.cpp, then the bandwidth on those threads."""
    unknown = [kind for kind in types if kind not in TYPES]
    if unknown:
        raise TfcliError(f"--type {unknown[0]!r} is not a type bench generate measures", hint=f"use some of {','.join(TYPES)}")
    if shape not in SHAPES:
        preset(shape)  # an unknown preset: one line
    if progress:
        progress(f"{shape}: making the weights at {', '.join(types)}")
    made = run_worker("tfcli.bench.quant", ["prepare", str(work), shape, ",".join(types), str(prompt_tokens), str(new_tokens)])
    buffer = torch.rand(64 * 1024 * 1024)  # 256 MB: far beyond any cache
    rows = []
    for threads in thread_counts:
        for kind in types:
            run, gguf = made[kind]
            measured = {}
            for side in ("tfcli", "llama.cpp"):
                if progress:
                    progress(f"{shape} {kind}, {threads} thread{'s' if threads > 1 else ''}: {side}")
                args = [side, run, gguf, str(threads), str(prompt_tokens), str(new_tokens), str(repeat)]
                measured[side] = run_worker("tfcli.bench.quant", args)
            previous = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                bandwidth = _probe_bandwidth("cpu", buffer)
            finally:
                torch.set_num_threads(previous)
            rows.append(
                TypeMeasurement(
                    kind,
                    threads,
                    measured["tfcli"]["seconds"] * 1e3,
                    measured["llama.cpp"]["seconds"] * 1e3,
                    (Path(run) / "model.safetensors").stat().st_size,
                    bandwidth,
                    measured["tfcli"]["tokens"] == measured["llama.cpp"]["tokens"],
                )
            )
    return rows


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        work_arg, shape_arg, types_arg, prompt_arg, new_arg = sys.argv[2:]
        print(json.dumps(prepare(Path(work_arg), shape_arg, types_arg.split(","), int(prompt_arg), int(new_arg))))
        sys.exit(0)
    side_arg, run_arg, gguf_arg, threads_arg, prompt_arg, new_arg, repeat_arg = sys.argv[1:]
    print(json.dumps(decode_job(side_arg, Path(run_arg), Path(gguf_arg), int(threads_arg), int(prompt_arg), int(new_arg), int(repeat_arg))))
