"""`tfcli bench generate --against llama.cpp --type ...` at a tiny shape: the runs and files it makes hold the types
asked for (llama.cpp reads the quantized run's own export), each side's job decodes and times, and bad options are
one line. The published figures are on docs/benchmarks.md."""

from __future__ import annotations

import pytest
import torch

from tfcli.bench.quant import SHAPES, TypeMeasurement, decode_job, prepare, shape_config
from tfcli.meta_device import on_meta_device
from tfcli.model.transformer import Transformer

gguf = pytest.importorskip("gguf")


def test_smollm2_135m_shape_has_its_parameter_count():
    with on_meta_device():
        model = Transformer(shape_config("smollm2-135m", 16, 64))
    assert model.parameter_count() == 134_515_008  # SmolLM2-135M's, as transformers counts it
    assert SHAPES["smollm2-135m"]["n_layers"] == 30


def test_each_side_decodes_the_same_bytes_at_a_tiny_shape(tmp_path, monkeypatch):
    from tests.test_gguf import _llama_cpp

    _llama_cpp()  # llama-cpp-python: fails under CI when it is missing
    tiny = dict(SHAPES["smollm2-135m"], vocab_size=512, n_layers=1, n_heads=2, n_kv_heads=1, d_model=64, d_ff=128)
    monkeypatch.setitem(SHAPES, "tiny-llama", tiny)  # SmolLM2's Llama layout at a size that takes a moment
    made = prepare(tmp_path, "tiny-llama", ["q8_0"], 4, 4)
    run, file = made["q8_0"]
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(file).tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["token_embd.weight"] == "Q8_0"
    threads = torch.get_num_threads()
    try:
        timed = {side: decode_job(side, tmp_path / "q8_0", tmp_path / "q8_0.gguf", 1, 4, 4, 1) for side in ("tfcli", "llama.cpp")}
    finally:
        torch.set_num_threads(threads)
    for side, measured in timed.items():
        assert measured["seconds"] >= 0 and len(measured["tokens"]) == 5, (side, measured)  # 1 + N tokens decoded
    row = TypeMeasurement("q8_0", 1, 1.0, 2.0, weight_bytes=10_000_000, bandwidth_gb_s=10.0, same_tokens=True)
    assert row.floor_ms == pytest.approx(1.0)  # 10 MB at 10 GB/s


def test_type_without_against_or_unknown_is_one_line(cli, tmp_path):
    result = cli("bench", "generate", "--preset", "tiny", "--type", "q8_0")
    assert result.code == 2 and "--type times tfcli beside llama.cpp" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
