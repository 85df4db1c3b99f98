"""`tfcli bench train`'s parts that need no real run: MFU against the card's datasheet peak (the card's name
mocked), the search for the largest batch that fits (out-of-memory faked on the CPU) and how both render."""

from __future__ import annotations

import json

import pytest
import torch

from tfcli.bench import train as bench
from tfcli.errors import TfcliError
from tfcli.train.flops import datasheet_peak


@pytest.mark.parametrize(
    "name, card, tflops",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756),
        ("NVIDIA H100 NVL", "H100 NVL", 835),
        ("NVIDIA H200", "H200 SXM", 989.4),
        ("NVIDIA GH200 480GB", "GH200", 989.4),
        ("NVIDIA A100-SXM4-80GB", "A100", 312),
        ("NVIDIA A100 80GB PCIe", "A100", 312),
        ("NVIDIA L40S", "L40S", 362.05),
        ("NVIDIA L4", "L4", 121),
    ],
)
def test_known_cards_have_their_datasheet_dense_bf16_peak(name, card, tflops):
    peak = datasheet_peak(name)
    assert peak is not None and peak.card == card and peak.bf16_flops == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("name", ["NVIDIA L40", "NVIDIA A10", "NVIDIA GeForce RTX 4090", "Tesla T4"])
def test_a_card_not_in_the_table_has_no_peak_rather_than_a_neighbours(name):
    assert datasheet_peak(name) is None  # "L40" is not the L40S, "A10" not the A100


def test_the_yardstick_says_why_there_is_no_datasheet_mfu():
    known = bench.card_yardstick("NVIDIA H100 80GB HBM3", "cuda", bf16=True)
    assert (known.card, known.bf16_peak_flops, known.note) == ("H100 SXM", 989.4e12, "")
    assert "not in tfcli's datasheet table" in bench.card_yardstick("NVIDIA L40", "cuda", bf16=True).note
    assert "trained in fp32" in bench.card_yardstick("NVIDIA H100 80GB HBM3", "cuda", bf16=False).note
    cpu = bench.card_yardstick("cpu", "cpu", bf16=False)
    assert cpu.bf16_peak_flops == 0.0 and "no datasheet peak on cpu" in cpu.note


def test_the_batch_search_doubles_until_out_of_memory_and_keeps_the_largest_that_ran():
    tried = []
    search = bench.find_largest_batch(lambda b: tried.append(b) or b <= 8, cap=1024)
    assert (search.largest, search.stopped_by) == (8, "out of memory")
    assert tried == [1, 2, 4, 8, 16] and search.tried[-1] == (16, False)
    assert bench.find_largest_batch(lambda b: True, cap=6).largest == 4
    estimated = bench.find_largest_batch(lambda b: True, cap=1024, too_big=lambda b: b > 32)
    assert (estimated.largest, estimated.stopped_by) == (32, "the memory, by an estimate")
    with pytest.raises(TfcliError, match="not even one sequence"):
        bench.find_largest_batch(lambda b: False, cap=8)


def test_out_of_memory_is_told_from_other_failures():
    assert bench.out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert bench.out_of_memory(RuntimeError("no candidate ran: fused failed (OutOfMemoryError: CUDA out of memory)"))
    assert not bench.out_of_memory(RuntimeError("the training loop ended early"))
    assert not bench.out_of_memory(ValueError("shape mismatch"))


def test_the_worker_reports_out_of_memory_for_the_search_and_for_a_row(monkeypatch):
    """The worker's side, with the device's out-of-memory faked past batch 4: the search stops there, and a
    measurement at a batch too large comes back as a row that says so (the table shows it) instead of failing."""

    def measure(implementation, preset_name, model_config, batch, steps, device_name, precision, **options):
        if batch > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return bench.TrainMeasurement(implementation, preset_name, 1.0, 0.1, 1.0, 1.0, 1.0, 1, batch)

    monkeypatch.setattr(bench, "_measure", measure)
    search = bench._probe("tiny", 64, 0, "cpu", "auto")
    assert (search.largest, search.stopped_by) == (4, "out of memory") and search.tried[-1] == (8, False)
    row = bench._job("transformers", "tiny", 8, 1, 0, "cpu", "auto")
    assert row.out_of_memory.startswith("CUDA out of memory") and row.tokens_per_sec == 0.0 and row.batch == 8
    monkeypatch.setattr(bench, "_measure", lambda *a, **k: (_ for _ in ()).throw(ValueError("a bug")))
    with pytest.raises(ValueError):
        bench._probe("tiny", 64, 0, "cpu", "auto")  # not out of memory: the search fails loudly, never shrinks


def _worker_row(implementation: str, rate: float, **fields) -> dict:
    row = bench.TrainMeasurement(implementation, "gpt2-small", rate, 0.3, 7e14, 0.5, 2000.0, 124_439_808, 64, "NVIDIA H100 80GB HBM3", 60_000.0)
    row.card_mfu, row.bf16, row.device_type = rate * 1e-6, True, "cuda"
    return {**row.__dict__, **fields}


def test_on_a_known_card_bench_train_shows_mfu_against_its_datasheet(cli, monkeypatch):
    """The workers' answers as an H100 gives them (mocked): the table and the JSON name the card and its
    datasheet peak and give each row's MFU against it beside the measured-matmul MFU; the search is shown."""
    answers = {
        "probe": {
            "largest": 64,
            "tried": [[1, True], [2, True], [4, True], [8, True], [16, True], [32, True], [64, True], [128, False]],
            "stopped_by": "out of memory",
        },
        "tfcli": _worker_row("tfcli", 400_000.0),
        "transformers": _worker_row("transformers", 0.0, out_of_memory="CUDA out of memory. Tried to allocate 24.00 GiB"),
    }
    monkeypatch.setattr(bench, "run_worker", lambda module, args: answers[args[0]])
    monkeypatch.setattr("tfcli.runtime.resolve_device", lambda name: name)
    args = ("bench", "train", "--presets", "gpt2-small", "--device", "cuda", "--precision", "bf16", "--batch", "max")
    data = json.loads(cli(*args, "--json").stdout)
    assert data["batch"] == 64 and data["batch_search"]["largest"] == 64 and data["batch_search"]["stopped_by"] == "out of memory"
    assert data["card"] == {"device_name": "NVIDIA H100 80GB HBM3", "card": "H100 SXM", "bf16_peak_flops": 989.4e12, "note": ""}
    ours, theirs = data["results"]
    assert ours["card_mfu"] == pytest.approx(0.4) and theirs["out_of_memory"] and data["throughput_ratio"]["gpt2-small"] is None
    monkeypatch.setenv("COLUMNS", "240")  # the table whole, whatever width another test left
    shown = cli(*args)
    assert shown.code == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "MFU (datasheet)" in text and "40.0%" in text and "H100 SXM, dense bf16 peak 989.4 TFLOP/s" in text
    assert "largest batch that fits: 64" in text and "128 (out of memory)" in text and "out of memory" in text


def test_on_the_cpu_the_table_says_why_there_is_no_datasheet_mfu(cli, monkeypatch):
    row = {**_worker_row("tfcli", 1000.0), "preset": "tiny", "device_name": "cpu", "device_type": "cpu", "bf16": False, "card_mfu": None}
    monkeypatch.setattr(bench, "run_worker", lambda module, args: {**row, "implementation": args[0]})
    shown = cli("bench", "train", "--presets", "tiny", "--batch", "2", "--no-first-run")
    assert shown.code == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "MFU (datasheet)" not in text and "no datasheet MFU: no datasheet peak on cpu" in text


def test_bench_train_refuses_a_batch_that_is_neither_a_number_nor_max(cli):
    refused = cli("bench", "train", "--presets", "tiny", "--batch", "lots")
    assert refused.code == 2 and "--batch must be a number or max" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert cli("bench", "train", "--presets", "tiny", "--batch", "max", "--max-batch", "0").code == 2


def test_the_search_never_tries_a_batch_tfclis_loop_would_refuse_nor_one_a_cpu_cannot_hold(monkeypatch):
    def refuse(config, batch, device):
        if batch > 4096:
            raise TfcliError(f"--batch-size {batch} needs more memory")

    monkeypatch.setattr(bench, "refuse_a_batch_memory_cannot_hold", refuse)
    monkeypatch.setattr(bench, "physical_memory", lambda: 2 * 1024**3)  # 2 GiB
    config = bench.preset("tiny")
    on_gpu, on_cpu = bench._too_big(config, torch.device("cuda")), bench._too_big(config, torch.device("cpu"))
    assert [b for b in (2048, 4096, 8192) if on_gpu(b)] == [8192]  # out of memory is the GPU's to say, below the loop's own refusal
    per_row = bench.ACTIVATION_BYTES * config.block_size * config.d_model * config.n_layers
    assert on_cpu(1024**3 // per_row + 1) and not on_cpu(1024**3 // per_row)


def test_compiled_rows_show_their_compile_time_apart_and_a_loop_that_could_not_compile_says_so(cli, monkeypatch):
    """--compile with --batch max (the workers' answers mocked): the search is asked uncompiled, each row's worker
    compiled; a row shows its compile time in a column of its own, a loop that fell back says why."""
    asked = []
    answers = {
        "probe": {"largest": 8, "tried": [[1, True], [2, True], [4, True], [8, True], [16, False]], "stopped_by": "out of memory"},
        "tfcli": _worker_row("tfcli", 400_000.0, compiled=True, compile_seconds=41.25),
        "transformers": _worker_row("transformers", 300_000.0, note="torch.compile does not work here (BackendCompilerFailed); trained without it"),
    }
    monkeypatch.setattr(bench, "run_worker", lambda module, args: asked.append(args) or answers[args[0]])
    monkeypatch.setattr("tfcli.runtime.resolve_device", lambda name: name)
    monkeypatch.setenv("COLUMNS", "240")
    args = ("bench", "train", "--presets", "gpt2-small", "--device", "cuda", "--precision", "bf16", "--batch", "max", "--compile")
    shown = cli(*args)
    assert shown.code == 0, shown.stderr
    assert "compile" not in asked[0] and [a[-1] for a in asked[1:]] == ["compile", "compile"]  # the search is never compiled
    text = " ".join(shown.stdout.split())
    assert "training step under torch.compile, batch 8" in text and "compiled in" in text and "41.2 s" in text and "not compiled" in text
    assert "gpt2-small, transformers: torch.compile does not work here (BackendCompilerFailed); trained without it" in text
    data = json.loads(cli(*args, "--json").stdout)
    ours, theirs = data["results"]
    assert data["compile"] is True and (ours["compiled"], ours["compile_seconds"]) == (True, 41.25) and not theirs["compiled"]
