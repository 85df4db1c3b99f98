"""`tfcli bench generate` measures tfcli with and without its cache beside transformers on the same weights
(speed is reported, never asserted)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # the real commands end to end; `-m "not slow"` skips them


def test_bench_generate_compares_with_transformers_on_the_same_weights(cli, tmp_path):
    pytest.importorskip("transformers")
    result = cli(
        "bench",
        "generate",
        "--preset",
        "tiny",
        "--repeat",
        "1",
        "--prompt-tokens",
        "4",
        "--new-tokens",
        "12",
        "--threads",
        "1",
        "--workdir",
        tmp_path,
        "--no-first-run",  # the plumbing, not the timing, is tested here (the model bench runs the untimed first run)
        "--skip-compiled",  # compiling takes tens of seconds: tests/test_compiled_step.py holds the compiled step
        "--json",
    )
    assert result.code == 0, result.stderr
    (bench,) = json.loads(result.stdout)["benches"]
    jobs = {r["job"]: r for r in bench["results"]}
    assert set(jobs) == {"tfcli", "transformers", "tfcli-no-cache"}
    assert all(r["new_tokens"] == 12 and r["seconds"] > 0 for r in jobs.values())
    assert bench["same_tokens"] is True  # greedy on the same weights: the same ids on both sides
    assert jobs["tfcli"]["first_tokens"] == jobs["tfcli-no-cache"]["first_tokens"]
    assert bench["bandwidth_gb_s"] > 0 and bench["floor_ms_per_token"] > 0
    assert jobs["tfcli"]["floor_ratio"] == pytest.approx(bench["time_per_token_vs_floor"], rel=1e-3) and bench["time_per_token_vs_floor"] > 0
    assert jobs["tfcli"]["bandwidth_gb_s"] == pytest.approx(bench["bandwidth_gb_s"], rel=1e-3) and jobs["transformers"]["bandwidth_gb_s"] == 0
    assert bench["speedup_vs_transformers"] > 0 and bench["speedup_vs_no_cache"] > 0
    # what decoded tfcli's row: the step `tfcli generate` would choose for this model on this machine
    assert jobs["tfcli"]["kernel"].startswith(("tfcli's C decoder step", "PyTorch's step")) and jobs["transformers"]["kernel"] == ""


def test_bench_generate_bad_options(cli):
    assert "cannot be built as GPT-2" in cli("bench", "generate", "--preset", "seq2seq-tiny", "--repeat", "1").stderr
    assert cli("bench", "generate", "--repeat", "0").code == 2
    assert "decodes at most 8,192" in cli("bench", "generate", "--prompt-tokens", "100000").stderr


def test_a_workers_user_error_comes_back_as_one(tmp_path):
    from tfcli.bench.common import run_worker
    from tfcli.errors import TfcliError

    with pytest.raises(TfcliError, match="unknown preset 'nope'"):
        run_worker("tfcli.bench.generate", ["prepare", str(tmp_path), "nope", "16", "256"])


def test_bench_generate_batch_decodes_the_same_rows_as_transformers(cli, tmp_path, monkeypatch):
    """--batch 3: three prompts decoded together on both sides, every row's greedy ids equal to transformers';
    the one-row jobs (the compiled step, llama.cpp) left out with their reasons, in the JSON and in the table.
    The workers run in this process (their own argument parsing, a JSON round trip; the test above runs them
    as subprocesses): a worker's start-up is seconds of imports."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("llama_cpp")  # --against llama.cpp is checked, then left out at batch 3
    import torch
    from rich.console import Console

    from tfcli.bench import generate as bench
    from tfcli.cli.bench.generate import _print_generate_bench

    monkeypatch.setattr(bench, "run_worker", lambda module, args: json.loads(json.dumps(bench.worker([str(a) for a in args]))))
    monkeypatch.setattr(bench, "PROBE_SECONDS", 0.01)  # the probe's figure is not what this test checks
    monkeypatch.setattr(bench, "PROBE_BYTES", 4 * 1024 * 1024)
    threads, verbosity = torch.get_num_threads(), transformers.logging.get_verbosity()  # the jobs set both in this process

    assert "--batch must be between 1 and 256, not 0" in (bad := cli("bench", "generate", "--batch", "0")).stderr and bad.code == 2
    assert (bad := cli("bench", "generate", "--batch", "257")).code == 2 and len(bad.stderr.strip().splitlines()) <= 2  # the error and its hint
    assert "at most 65,536 tokens of KV cache" in cli("bench", "generate", "--batch", "256", "--new-tokens", "512").stderr
    assert "--type times one row" in cli("bench", "generate", "--against", "llama.cpp", "--type", "f32", "--batch", "2").stderr
    args = ["--preset", "tiny", "--repeat", "1", "--prompt-tokens", "4", "--new-tokens", "6", "--threads", "1", "--workdir", tmp_path]
    try:
        result = cli("bench", "generate", *args, "--batch", "3", "--against", "llama.cpp", "--no-first-run", "--json")
    finally:
        torch.set_num_threads(threads)
        transformers.logging.set_verbosity(verbosity)
    assert result.code == 0, result.stderr
    (report,) = json.loads(result.stdout)["benches"]
    jobs = {r["job"]: r for r in report["results"]}
    assert report["batch"] == 3 and set(jobs) == {"tfcli", "transformers", "tfcli-no-cache"}
    assert set(report["left_out"]) == {"tfcli-compiled", "llama.cpp"} and "one sequence" in report["left_out"]["llama.cpp"]
    assert report["tuning"] is None  # nothing compiled for a job that is left out
    for r in jobs.values():
        assert r["rows"] == 3 and r["new_tokens"] == 6 and len(r["row_tokens"]) == 3 and all(len(row) == 6 for row in r["row_tokens"])
        assert r["tokens_per_second"] == pytest.approx(3 * 6 / r["seconds"], rel=1e-3)
        assert report["ms_per_step"][r["job"]] == pytest.approx(r["seconds"] / 6 * 1e3, rel=1e-3)
    assert jobs["tfcli"]["row_tokens"] == jobs["transformers"]["row_tokens"] == jobs["tfcli-no-cache"]["row_tokens"]
    assert report["same_tokens"] is True and len({tuple(row) for row in jobs["tfcli"]["row_tokens"]}) > 1  # three different prompts
    assert jobs["tfcli"]["kernel"].startswith("PyTorch's batch step, 3 rows")
    # the table says the same: per step, every row's tokens, and what was left out and why
    measured = {name: bench.DecodeMeasurement(**{k: v for k, v in r.items() if k != "tokens_per_second"}) for name, r in jobs.items()}
    fields = ("preset", "device", "threads", "prompt_tokens", "new_tokens", "block_size", "parameters", "weight_bytes", "repeat", "tuning", "batch", "left_out")
    console = Console(record=True, width=400)
    _print_generate_bench(console, bench.GenerateBench(**{f: report[f] for f in fields}, results=measured), "a machine")
    text = console.export_text()
    assert "batch 3, 3 4-token prompts decoded together" in text and "ms / step" in text and "tokens/s, all rows" in text
    assert "left out at batch 3: llama.cpp (llama-cpp-python decodes one sequence)" in text and "left out at batch 3: tfcli-compiled" in text
    assert "same greedy tokens in every row: yes" in text


def test_the_floor_counts_the_bytes_of_the_dtype_decoded_in():
    """A GPU decodes in bf16 (tfcli.loader.prepare): half the bytes of fp32 a step, and the floor says so; a
    quantized layer counts its blocks' bytes; the learned position table (one row a step) is left out."""
    import torch

    from tfcli.bench.generate import weights_read_per_step
    from tfcli.checkpoint import model_from_tensors
    from tfcli.model.config import preset
    from tfcli.model.transformer import Transformer
    from tfcli.quant.formats import quantize
    from tfcli.quant.tensors import Blocks

    torch.manual_seed(0)
    model = Transformer(preset("tiny")).eval()
    read = (model.parameter_count() - model.pos_emb.weight.numel()) * 4  # the tied head once
    assert weights_read_per_step(model) == read
    assert weights_read_per_step(model.to(torch.bfloat16)) == read // 2
    weights = {k: v.float() for k, v in model.state_dict().items()}
    name = "decoder.blocks.0.mlp.fc.weight"
    matrix = weights[name]
    weights[name] = Blocks(torch.from_numpy(quantize(matrix.numpy(), "q8_0")), "q8_0", tuple(matrix.shape))
    quantized = model_from_tensors(model.config, weights)
    blocks = weights[name].data
    assert weights_read_per_step(quantized) == read - matrix.numel() * 4 + blocks.numel() * blocks.element_size()


def test_the_tfcli_job_sets_its_floor_against_the_weights_as_it_decodes_them(tmp_path, monkeypatch):
    """The worker's own job, with the GPU's cast to bf16 done on the CPU: its bytes a step and its dtype come
    from the model it decoded, not from the fp32 file, and the bench's floor follows them."""
    import torch

    from tfcli.bench import generate as bench

    monkeypatch.setattr(bench, "PROBE_SECONDS", 0.01)
    monkeypatch.setattr(bench, "PROBE_BYTES", 4 * 1024 * 1024)
    real_load = bench.load_run

    def load_as_a_gpu_would(*args, **kwargs):
        checkpoint = real_load(*args, **kwargs)
        checkpoint.model.to(torch.bfloat16)
        checkpoint.model.fast_decode_step = None  # PyTorch's step, as on a GPU (the C step is the CPU's, in fp32)
        return checkpoint

    monkeypatch.setattr(bench, "load_run", load_as_a_gpu_would)
    run, hf, _, fp32_bytes = bench.prepare(tmp_path, "tiny", 4, 6)
    threads = torch.get_num_threads()
    try:
        measured = bench._decode_job("tfcli", run, hf, 4, 6, 1, "cpu", fp32_bytes)
    finally:
        torch.set_num_threads(threads)
    assert (measured.dtype, measured.weight_bytes) == ("bfloat16", fp32_bytes // 2)
    report = bench.GenerateBench("tiny", "cpu", 1, 4, 6, 128, 1, measured.weight_bytes, 1, {"tfcli": measured})
    assert report.dtype == "bfloat16" and report.floor_seconds_per_token == pytest.approx(fp32_bytes / 2 / (measured.bandwidth_gb_s * 1e9))
    per_token = measured.floor_ratio * report.floor_seconds_per_token  # the median call's time per token, against its own floor
    assert 0 < per_token < measured.seconds
