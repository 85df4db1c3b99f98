"""Time per generated token of tfcli and llama.cpp (llama-cpp-python) on the same random weights at each weight type,
one thread each, batch 1, greedy: CPU seconds per token, the prompt and each call's setup left out (the time of 65
new tokens less the time of 1, over 64). tfcli's quantized runs are made by `tfcli quantize` from the f32 run,
llama.cpp's files by llama.cpp's own quantizer (`llama_model_quantize`) from `tfcli export --to gguf`'s f32 file.

    python3 scripts/bench_quant.py --preset gpt2-small --work /tmp/bench-quant [--types f32,bf16,q8_0,q4_0,q4_k_m]

Prints one JSON line a type, then a Markdown table. CPU time, not wall time: on a shared machine a process's wall
time includes the time others ran.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path

import torch

LLAMA_TYPES = {"f32": None, "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k_m": "Q4_K_M"}
PROMPT = 16


def _tfcli_seconds(run: Path, new_tokens: int) -> tuple[float, list[int]]:
    from tfcli.bench.generate import _prompt
    from tfcli.generate.decoding import Generator
    from tfcli.generate.events import Done
    from tfcli.generate.settings import GenerationSettings
    from tfcli.loader import load_run

    checkpoint = load_run(run, "decode", "cpu", 1)
    prompt = _prompt(checkpoint.config.model.vocab_size, PROMPT)

    def decode(n: int) -> tuple[float, list[int]]:
        settings = GenerationSettings(max_new_tokens=n, stop_at_eos=False)
        started = time.process_time()
        generator = Generator(checkpoint.model, checkpoint.tokenizer, settings, batch_size=1)
        for event in generator.run_ids([prompt]):
            if isinstance(event, Done):
                return time.process_time() - started, event.completions[0].tokens
        raise AssertionError("no Done")

    decode(8)  # warm-up, and accel's measured choices for these shapes
    one = min(decode(1)[0] for _ in range(2))
    runs = [decode(new_tokens + 1) for _ in range(2)]
    best = min(seconds for seconds, _ in runs)
    return (best - one) / new_tokens, runs[0][1]


def _llama_seconds(path: Path, vocab: int, new_tokens: int) -> tuple[float, list[int]]:
    import llama_cpp

    from tfcli.bench.generate import _prompt

    model = llama_cpp.Llama(model_path=str(path), n_ctx=PROMPT + new_tokens + 8, n_threads=1, n_threads_batch=1, verbose=False)
    prompt = _prompt(vocab, PROMPT)

    def decode(n: int) -> tuple[float, list[int]]:
        model.reset()
        started, tokens = time.process_time(), []
        for token in model.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            tokens.append(token)
            if len(tokens) == n:
                break
        return time.process_time() - started, tokens

    decode(8)
    one = min(decode(1)[0] for _ in range(2))
    runs = [decode(new_tokens + 1) for _ in range(2)]
    best = min(seconds for seconds, _ in runs)
    return (best - one) / new_tokens, runs[0][1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--types", default="f32,bf16,q8_0,q4_0,q4_k_m")
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    import llama_cpp

    from tfcli.bench.generate import GGUF_FILE, prepare
    from tfcli.checkpoint import quantize_run

    torch.set_num_threads(1)
    work = args.work
    if not (work / "run").exists():
        prepare(work, args.preset, PROMPT, args.new_tokens + 1, against="llama.cpp")
    rows = []
    for kind in args.types.split(","):
        run = work / "run" if kind == "f32" else work / f"run-{kind}"
        if not run.exists():
            started = time.process_time()
            quantize_run(work / "run", run, kind)
            print(f"tfcli quantize {kind}: {time.process_time() - started:.1f} s of CPU", flush=True)
        gguf = work / GGUF_FILE if kind == "f32" else work / f"llama-{kind}.gguf"
        if not gguf.exists():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{LLAMA_TYPES[kind]}")
            params.nthread = 1
            assert llama_cpp.llama_model_quantize(str(work / GGUF_FILE).encode(), str(gguf).encode(), ctypes.byref(params)) == 0
        ours, our_tokens = _tfcli_seconds(run, args.new_tokens)
        vocab = json.loads((run / "config.json").read_text())["model"]["vocab_size"]
        theirs, their_tokens = _llama_seconds(gguf, vocab, args.new_tokens)
        same = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), None)
        row = {
            "type": kind,
            "tfcli_ms_per_token": round(ours * 1e3, 2),
            "llama_cpp_ms_per_token": round(theirs * 1e3, 2),
            "tfcli_weights_bytes": (run / "model.safetensors").stat().st_size,
            "llama_cpp_file_bytes": gguf.stat().st_size,
            "greedy_tokens_equal_until": len(our_tokens) if same is None else same,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| type | tfcli ms/token | llama.cpp ms/token | tfcli weights | llama.cpp file | greedy ids equal for |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['type']} | {r['tfcli_ms_per_token']} | {r['llama_cpp_ms_per_token']} | {r['tfcli_weights_bytes'] / 1e6:.1f} MB | "
            f"{r['llama_cpp_file_bytes'] / 1e6:.1f} MB | {r['greedy_tokens_equal_until']} |"
        )


if __name__ == "__main__":
    main()
