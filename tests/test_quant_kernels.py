"""The C products over block-quantized weights (tfcli/accel/blocks.c), for every SIMD path this processor runs
(TFCLI_QUANT_PATH forces each) and every block format, held to `gguf.quants.dequantize` then a matmul on random
blocks: one input row (decoding), a few (a served batch) and more than the kernels take together (4 and 8). The paths
that round the activations to int8 (avx512_vnni and avx2_int8, as llama.cpp does) are held to the same product over the
activations rounded as it rounds them, as tightly as the others; so is the path that rounds them to bf16 for bf16
weights (avx512_bf16)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import force_quant_path
from tests.test_quant_formats import _random_blocks
from tfcli.accel import choices, quant
from tfcli.errors import TfcliError
from tfcli.quant.formats import FORMATS, quantize
from tfcli.quant.linear import QuantLinear
from tfcli.quant.tensors import Blocks

gguf = pytest.importorskip("gguf")


@pytest.fixture(params=list(quant.PATHS))
def path(request, monkeypatch):
    return force_quant_path(request.param, monkeypatch)


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_path_multiplies_as_gguf_dequantize_then_matmul(path, name):
    fmt = FORMATS[name]
    n, k = 13, max(fmt.block_size, 32) * (5 if fmt.block_size == 32 else 2)  # 5: an odd number of blocks
    data = _random_blocks(name, n * k // fmt.block_size, seed=7).reshape(n, fmt.row_bytes(k))
    weight = torch.from_numpy(gguf.quants.dequantize(data.reshape(-1), getattr(gguf.GGMLQuantizationType, name.upper())).reshape(n, k).copy())
    layer = QuantLinear(Blocks(torch.from_numpy(data), name, (n, k)), torch.randn(n))
    layer.kernel = quant.product
    generator = torch.Generator().manual_seed(1)
    for m in (1, 3, 11):
        x = torch.randn(2, m, k, generator=generator)
        assert quant.choose(layer, 2 * m) == path
        with torch.no_grad():
            got = layer(x)
        if quant.rounds(path, name):  # the activations rounded (int8 blocks, or bf16) as the path rounds them
            x = quant.rounded_activations(x.reshape(-1, k), name).reshape(x.shape)
        expected = x.double() @ weight.double().T + layer.bias.double()
        assert got.shape == (2, m, n)
        assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-4 * float(expected.abs().max())), (path, name, m)


def test_a_forced_path_that_cannot_run_is_one_line(monkeypatch):
    monkeypatch.setenv(quant.FORCE_VARIABLE, "avx9000")
    with pytest.raises(TfcliError, match="TFCLI_QUANT_PATH='avx9000' is not a path"):
        quant.forced()


def test_the_product_is_chosen_by_measurement(monkeypatch):
    """Unforced, the path for a shape is measured once (the decision names the format and shape) and is one that
    runs here, or PyTorch's product over the dequantized weight."""
    monkeypatch.delenv(quant.FORCE_VARIABLE, raising=False)
    data = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    layer = QuantLinear(Blocks(torch.from_numpy(quantize(data, "q4_K")), "q4_K", (64, 256)))
    chosen = quant.choose(layer, 1)
    assert chosen == quant.TORCH or quant.kernel(chosen) is not None
    decisions = choices.choices().decisions
    decision = decisions[f"quant q4_K t1 1x64x256 {quant.KERNELS}"]  # among the fp32 products, PyTorch's one of them
    assert quant.TORCH in decision.seconds
    if quant.kernel("avx512_vnni") is None:
        assert decision.choice == chosen
    else:  # then that winner against the int8 path
        rounded = decisions[f"quant-int8 q4_K t1 1x64x256 {quant.KERNELS}"]
        assert set(rounded.seconds) == {decision.choice, "avx512_vnni"} and rounded.choice == chosen


@pytest.mark.parametrize("name", list(FORMATS))
def test_the_c_dequantizer_gives_gguf_values_exactly(name):
    """What QuantLinear.weight and the embedding's lookups use once tfcli.accel is attached."""
    if quant.dequantizer() is None:
        pytest.skip(f"the kernels cannot be built here: {quant.problem('portable')}")
    fmt = FORMATS[name]
    k = 2 * max(fmt.block_size, 32)
    data = _random_blocks(name, 9 * k // fmt.block_size, seed=11).reshape(9, fmt.row_bytes(k))
    expected = gguf.quants.dequantize(data.reshape(-1), getattr(gguf.GGMLQuantizationType, name.upper())).reshape(9, k)
    assert np.array_equal(quant._expand(Blocks(torch.from_numpy(data), name, (9, k))).numpy(), expected)


def test_rounding_the_activations_stays_within_its_tolerance_of_the_fp32_product():
    """What lets the measurement pick the int8 path: its product is within ROUNDING_TOLERANCE of the fp32 one."""
    if quant.kernel("avx512_vnni") is None and quant.kernel("avx2_int8") is None:
        pytest.skip(f"no int8 path here: {quant.problem('avx2_int8')}")
    generator = torch.Generator().manual_seed(3)
    cases = [(path, name) for path in ("avx512_vnni", "avx2_int8") if quant.kernel(path) is not None for name in ("q8_0", "q4_0", "q4_K", "q6_K")]
    if quant.kernel("avx512_bf16") is not None:
        cases.append(("avx512_bf16", "bf16"))
    for path, name in cases:
        weight = torch.randn(64, 512, generator=generator)
        layer = QuantLinear(Blocks(torch.from_numpy(quantize(weight.numpy(), name)), name, (64, 512)))
        x = torch.randn(3, 512, generator=generator)
        exact, rounded = torch.nn.functional.linear(x, layer.dequantized()), quant.run(quant.kernel(path), layer, x)
        assert quant.close_rounded(exact, rounded) and not quant.close(exact, rounded), name  # rounded, and not by more


def test_the_kernel_benchmark_script_runs(monkeypatch, capsys):
    """scripts/bench_quant_kernels.py (the figures on the benchmarks page), on a tiny model: a line a type and path."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_quant_kernels.py"
    argv = ["bench_quant_kernels.py", "--preset", "tiny", "--types", "q8_0,bf16", "--paths", "portable,torch9", "--repeat", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(quant, "PATHS", {**quant.PATHS, "torch9": ((), ("no-such-extension",))})
    runpy.run_path(str(script), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["q8_0", "portable"], ["q8_0", "torch9"], ["bf16", "portable"], ["bf16", "torch9"]]
    assert "ms a token" in lines[0] and "unavailable: this processor lacks no-such-extension" in lines[1]
