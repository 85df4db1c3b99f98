"""`tfcli bench generate`: batch-1 greedy decoding speed of tfcli's generator (with and without the KV cache)
beside transformers' `GPT2LMHeadModel.generate` on the same random weights, and the floor set by reading
every weight once per token at the memory bandwidth this machine measures.

The weights are made once (seeded), saved as a run directory and exported with `tfcli export`'s code, so
both sides decode the same model; a synthetic byte-level tokenizer of exactly the model's vocabulary size
stands in for a trained one. Every measurement runs in a fresh subprocess; rounds are interleaved and each
job keeps its best time.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from tfcli.bench.common import keep_fastest, peak_rss_mb, run_worker
from tfcli.errors import TfcliError

JOBS = ("tfcli", "transformers", "tfcli-no-cache")
PROBE_BYTES = 256 * 1024 * 1024  # the bandwidth probe reads a tensor this large (far beyond any cache) ...
PROBE_SECONDS = 1.0  # ... again and again for this long: a sustained rate, as decoding needs, not a burst


@dataclasses.dataclass
class DecodeMeasurement:
    job: str
    seconds: float  # wall time of one generate call: the prompt, then every new token
    new_tokens: int
    peak_rss_mb: float
    first_tokens: list[int]  # the first generated ids, to check both sides decode the same model
    kernel: str = ""  # tfcli on the CPU: what decoded the one row (`decode_step.describe`)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


@dataclasses.dataclass
class GenerateBench:
    preset: str
    device: str
    threads: int
    prompt_tokens: int
    new_tokens: int
    block_size: int
    parameters: int
    weight_bytes: int  # bytes read per token: every weight once (the tied embedding once, position table not)
    bandwidth_gb_s: float
    repeat: int
    results: dict[str, DecodeMeasurement]

    @property
    def floor_seconds_per_token(self) -> float:
        return self.weight_bytes / (self.bandwidth_gb_s * 1e9) if self.bandwidth_gb_s else 0.0

    def ratio(self, a: str, b: str) -> float | None:
        if a in self.results and b in self.results:
            return self.results[a].tokens_per_second / self.results[b].tokens_per_second
        return None

    @property
    def floor_ratio(self) -> float:
        """tfcli's time per token / the floor (target <= 1.5)."""
        return (self.results["tfcli"].seconds / self.new_tokens) / self.floor_seconds_per_token

    @property
    def same_tokens(self) -> bool | None:
        if "transformers" not in self.results:
            return None
        return self.results["tfcli"].first_tokens == self.results["transformers"].first_tokens

    def to_json(self) -> dict:
        return {
            "preset": self.preset, "device": self.device, "threads": self.threads, "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens, "block_size": self.block_size, "parameters": self.parameters,
            "weight_bytes": self.weight_bytes, "bandwidth_gb_s": round(self.bandwidth_gb_s, 3), "repeat": self.repeat,
            "floor_ms_per_token": round(self.floor_seconds_per_token * 1e3, 4),
            "results": [{**dataclasses.asdict(m), "tokens_per_second": round(m.tokens_per_second, 3)} for m in self.results.values()],
            "speedup_vs_transformers": _round(self.ratio("tfcli", "transformers")),
            "speedup_vs_no_cache": _round(self.ratio("tfcli", "tfcli-no-cache")),
            "time_per_token_vs_floor": round(self.floor_ratio, 4),
            "same_tokens": self.same_tokens,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def bench_config(preset_name: str, prompt_tokens: int, new_tokens: int):
    """The preset's shape, its context widened to hold the prompt and every new token (GPT-2 cannot
    slide a window, so both sides must fit the whole text)."""
    from tfcli.model.config import preset

    config = preset(preset_name)
    return config.with_overrides(block_size=max(config.block_size, prompt_tokens + new_tokens))


def synthetic_tokenizer(vocab_size: int, folder: Path) -> Path:
    """A byte-level BPE tokenizer with exactly `vocab_size` tokens (256 bytes, pairs of them, <|endoftext|>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

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


def prepare(work: Path, preset_name: str, prompt_tokens: int, new_tokens: int) -> tuple[Path, Path, int, int]:
    """Seeded random weights saved as a run directory and exported to a GPT-2 folder. Returns both paths,
    the parameter count and the weight bytes read per token."""
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.hf import export_gpt2, gpt2_incompatibility
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    config = bench_config(preset_name, prompt_tokens, new_tokens)
    problem = gpt2_incompatibility(config)
    if problem:
        raise TfcliError(f"preset {preset_name!r} cannot be built as GPT-2: {problem}", hint="use a decoder preset such as tiny or gpt2-small")
    tokenizer = TextTokenizer.load(synthetic_tokenizer(config.vocab_size, work / "tokenizer"))
    torch.manual_seed(0)
    model = Transformer(config).eval()
    run_dir, hf_dir = work / "run", work / "hf"
    save_checkpoint(run_dir, model, tokenizer)
    export_gpt2(run_dir, hf_dir)
    parameters = model.parameter_count()
    read_per_token = parameters - (model.pos_emb.weight.numel() if config.positions == "learned" else 0)
    return run_dir, hf_dir, parameters, read_per_token * 4


def _prompt(vocab_size: int, length: int) -> list[int]:
    import torch

    generator = torch.Generator().manual_seed(1234)
    return torch.randint(0, vocab_size - 1, (length,), generator=generator).tolist()  # never the eos id (the last)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _decode_job(job: str, run_dir: Path, hf_dir: Path, prompt_tokens: int, new_tokens: int, threads: int, device: str) -> DecodeMeasurement:
    """One measurement, inside the worker subprocess: a short warm-up call, then the best of three timed
    calls (two for models over 20M parameters)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    if job == "bandwidth":
        # Decoding reads the weights and writes almost nothing, so the probe only reads: a sum over the
        # buffer, repeated for PROBE_SECONDS. `seconds` is the time of one read of PROBE_BYTES.
        buffer = torch.rand(PROBE_BYTES // 4, device=device)
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
                return DecodeMeasurement(job, elapsed / passes, 0, peak_rss_mb(), [])
    if job in ("tfcli", "tfcli-no-cache"):
        from tfcli.checkpoint import load_checkpoint
        from tfcli.generate.decoding import Done, Generator
        from tfcli.generate.settings import GenerationSettings

        checkpoint = load_checkpoint(run_dir, device)
        prompt = _prompt(checkpoint.config.model.vocab_size, prompt_tokens)

        def decode(n: int) -> list[int]:
            settings = GenerationSettings(max_new_tokens=n, stop_at_eos=False, use_cache=job == "tfcli")
            generator = Generator(checkpoint.model, checkpoint.tokenizer, settings, batch_size=1)
            for event in generator.run_ids([prompt]):
                if isinstance(event, Done):
                    return event.completions[0].tokens
            raise AssertionError("the generator ended without Done")
    else:
        import transformers

        transformers.logging.set_verbosity_error()
        model = transformers.GPT2LMHeadModel.from_pretrained(str(hf_dir)).to(device).eval()
        model.generation_config.eos_token_id = None  # decode every token, as tfcli does here
        model.generation_config.pad_token_id = 0
        prompt = _prompt(model.config.vocab_size, prompt_tokens)
        input_ids = torch.tensor([prompt], device=device)
        attention_mask = torch.ones_like(input_ids)

        def decode(n: int) -> list[int]:
            with torch.inference_mode():
                out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=n, do_sample=False, use_cache=True)
            return out[0, prompt_tokens:].tolist()
    decode(min(new_tokens, 32))  # warm-up: allocators, kernels, caches
    small = sum(p.numel() for p in (checkpoint.model if job != "transformers" else model).parameters()) < 20_000_000
    seconds, tokens = float("inf"), []
    for _ in range(3 if small else 2):  # the best of three calls (two for large models) in this process too
        _sync(device)
        started = time.perf_counter()
        tokens = decode(new_tokens)
        _sync(device)
        seconds = min(seconds, time.perf_counter() - started)
    kernel = ""
    if job != "transformers" and device == "cpu":
        from tfcli.model import decode_step

        kernel = decode_step.describe()
    return DecodeMeasurement(job, seconds, len(tokens), peak_rss_mb(), tokens[:32], kernel)


def run_generate_bench(work: Path, preset_name: str = "tiny", *, prompt_tokens: int = 16, new_tokens: int = 256, repeat: int = 3,
                       threads: int = 0, device: str = "cpu", no_cache: bool | None = None, peer: bool = True,
                       progress=None) -> GenerateBench:
    """Measure every job `repeat` rounds, interleaved, best time kept. The uncached job re-runs the whole
    text for every token; it runs every round for small models and once for large ones (no_cache=None),
    always (True) or never (False)."""
    if repeat < 1:
        raise TfcliError(f"--repeat must be at least 1, not {repeat}")
    if prompt_tokens < 1 or new_tokens < 1:
        raise TfcliError("--prompt-tokens and --new-tokens must be at least 1")
    from tfcli.hf import gpt2_incompatibility

    config = bench_config(preset_name, prompt_tokens, new_tokens)
    problem = gpt2_incompatibility(config)
    if problem:
        raise TfcliError(f"preset {preset_name!r} cannot be built as GPT-2: {problem}", hint="use a decoder preset such as tiny or gpt2-small")
    if progress:
        progress("making the weights")
    # in a worker too: a process inherits its parent's peak RSS, so the parent must stay small
    made = run_worker("tfcli.bench.generate", ["prepare", str(work), preset_name, str(prompt_tokens), str(new_tokens)])
    run_dir, hf_dir, parameters, weight_bytes = Path(made["run"]), Path(made["hf"]), made["parameters"], made["weight_bytes"]
    block = config.block_size
    results: dict[str, DecodeMeasurement] = {}
    bandwidth = 0.0
    args = [str(run_dir), str(hf_dir), str(prompt_tokens), str(new_tokens), str(threads), device]
    for round_number in range(1, repeat + 1):
        for job in ("bandwidth", *JOBS):
            if job == "transformers" and not peer:
                continue
            if job == "tfcli-no-cache" and (no_cache is False or (no_cache is None and round_number > 1 and parameters > 20_000_000)):
                continue
            if progress:
                progress(f"{job} (round {round_number} of {repeat})")
            measured = DecodeMeasurement(**run_worker("tfcli.bench.generate", [job, *args]))
            if job == "bandwidth":
                bandwidth = max(bandwidth, PROBE_BYTES / measured.seconds / 1e9)
                continue
            keep_fastest(results, job, measured)
    return GenerateBench(preset=preset_name, device=device, threads=threads, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                         block_size=block, parameters=parameters, weight_bytes=weight_bytes, bandwidth_gb_s=bandwidth,
                         repeat=repeat, results=results)


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        work_arg, preset_arg, prompt_arg, new_arg = sys.argv[2:]
        run_path, hf_path, n_parameters, n_bytes = prepare(Path(work_arg), preset_arg, int(prompt_arg), int(new_arg))
        print(json.dumps({"run": str(run_path), "hf": str(hf_path), "parameters": n_parameters, "weight_bytes": n_bytes}))
        sys.exit(0)
    job_name, run_arg, hf_arg, prompt_arg, new_arg, threads_arg, device_arg = sys.argv[1:]
    measured = _decode_job(job_name, Path(run_arg), Path(hf_arg), int(prompt_arg), int(new_arg), int(threads_arg), device_arg)
    print(json.dumps(dataclasses.asdict(measured)))
