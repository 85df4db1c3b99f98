"""Quantized runs end to end: `tfcli quantize` picks each tensor's format as llama.cpp's own quantizer does for the
same model (checked on the file `llama_cpp.llama_model_quantize` writes from tfcli's f32 export), errs no more than
it on each tensor, writes the block bytes and their types, and the run decodes (QuantLinear) exactly as its
dequantized weights do; bad files are refused in one line."""

from __future__ import annotations

import ctypes
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.test_gguf import _llama_cpp, _random_run
from tfcli.checkpoint import load_checkpoint
from tfcli.errors import TfcliError
from tfcli.loader import load_run
from tfcli.model.config import ModelConfig
from tfcli.quant.formats import dequantize, quantize
from tfcli.quant.linear import QuantEmbedding, QuantLinear
from tfcli.tokenizer.core import TextTokenizer

LAYERS = 4  # llama.cpp's Q4_K_M gives layers 2 and 3 of 4 more bits (use_more_bits)
LLAMA = {"tok_emb": "token_embd", "lm_head": "output", "attn.out": "attn_output", "mlp.proj": "ffn_down"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, trained_tokenizer) -> Path:
    """A random Llama-shaped run, 256 wide (K-quants pack 256 values a block), untied head."""
    tokenizer = TextTokenizer.load(trained_tokenizer)
    config = ModelConfig(
        vocab_size=512,
        block_size=64,
        n_layers=LAYERS,
        n_heads=4,
        n_kv_heads=2,
        d_model=256,
        d_ff=256,
        positions="rotary",
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
        tie_embeddings=False,
    )
    return _random_run(tmp_path_factory.mktemp("quant") / "run", config, tokenizer)


@pytest.fixture(scope="module")
def quantized(run, tmp_path_factory) -> dict[str, Path]:
    """The run quantized to each type by `tfcli quantize`."""
    from tfcli.checkpoint import quantize_run

    root = tmp_path_factory.mktemp("quantized")
    return {kind: (quantize_run(run, root / kind, kind), root / kind)[1] for kind in ("q4_k_m", "q4_0", "q8_0", "bf16")}


def _llama_file_types(name: str) -> list[str]:
    """The GGUF tensors a tfcli tensor of a Llama run becomes (q, k, v and gate, up are fused in tfcli)."""
    if name.startswith("decoder.blocks."):
        layer, rest = name.removeprefix("decoder.blocks.").split(".", 1)
        rest = rest.removesuffix(".weight")
        parts = {"attn.qkv": ["attn_v"], "mlp.fc": ["ffn_gate", "ffn_up"]}.get(rest) or [LLAMA[rest]]
        return [f"blk.{layer}.{part}.weight" for part in parts]
    return [LLAMA[name.removesuffix(".weight")] + ".weight"]


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q4_0", "Q8_0"])
def test_types_and_error_per_tensor_as_llama_cpp_quantizer(run, quantized, tmp_path, file_type):
    """llama.cpp quantizes tfcli's own f32 export: each tensor gets the format tfcli's plan gives it (q/k/v fused
    in tfcli take attn_v's), and tfcli's quantization of that very f32 tensor errs no more than llama.cpp's."""
    gguf = pytest.importorskip("gguf")
    from tfcli.gguf import export_gguf

    llama_cpp = _llama_cpp()
    export_gguf(run, tmp_path / "f32.gguf")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(str(tmp_path / "f32.gguf").encode(), str(tmp_path / "q.gguf").encode(), ctypes.byref(params)) == 0
    f32 = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(tmp_path / "f32.gguf").tensors}
    theirs = {t.name: t for t in gguf.GGUFReader(tmp_path / "q.gguf").tensors}
    types = json.loads((quantized[file_type.lower()] / "config.json").read_text())["quantized"]
    assert len(types) == 2 + 4 * LAYERS
    checked = 0
    for name, kind in types.items():
        for gguf_name in _llama_file_types(name):
            tensor = theirs[gguf_name]
            assert tensor.tensor_type.name.lower() == kind.lower(), (name, gguf_name, tensor.tensor_type.name, kind)
            x = f32[gguf_name].reshape(-1, f32[gguf_name].shape[-1]).astype(np.float32)
            mine = dequantize(quantize(x, kind), kind, x.shape[1])
            llama = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(x.shape)
            mine_rms, llama_rms = float(np.sqrt(((mine - x) ** 2).mean())), float(np.sqrt(((llama - x) ** 2).mean()))
            assert mine_rms <= llama_rms, (gguf_name, kind, mine_rms, llama_rms)
            checked += 1
    assert checked >= 2 + 5 * LAYERS


def test_the_run_holds_the_block_bytes_and_loads_dequantized(run, quantized):
    from safetensors.numpy import load_file

    original = load_checkpoint(run).model.state_dict()
    config = json.loads((quantized["q4_k_m"] / "config.json").read_text())
    assert set(config["quantized"].values()) == {"q4_K", "q6_K"} and config["source"] == str(run)
    stored = load_file(quantized["q4_k_m"] / "model.safetensors")
    name = "decoder.blocks.3.mlp.proj.weight"  # a layer use_more_bits picks: q6_K
    assert config["quantized"][name] == "q6_K" and stored[name].dtype == np.uint8 and stored[name].shape == (256, 210)
    assert np.array_equal(stored[name], quantize(original[name].numpy(), "q6_K"))
    assert stored["decoder.norm.weight"].dtype == np.float32  # norms stay f32
    state = load_checkpoint(quantized["q4_k_m"]).model.state_dict()
    assert all(t.dtype == torch.float32 for t in state.values())
    assert np.array_equal(state[name].numpy(), dequantize(stored[name], "q6_K", 256))
    for kind, path in quantized.items():  # every type holds the weights to its precision
        relative = max(float((load_checkpoint(path).model.state_dict()[n] - t).norm() / t.norm()) for n, t in original.items())
        assert relative < {"bf16": 0.005, "q8_0": 0.01, "q4_0": 0.15, "q4_k_m": 0.12}[kind], (kind, relative)


def _fp32_path() -> str:
    """The widest C path here that multiplies fp32 activations (the int8 one rounds them: tests/test_quant_kernels.py)."""
    from tfcli.accel import quant

    return next((path for path in ("avx512", "avx2", "portable") if quant.kernel(path) is not None), "torch")


def test_decoding_keeps_the_blocks_and_computes_what_dequantized_weights_do(quantized, monkeypatch):
    monkeypatch.setenv("TFCLI_QUANT_PATH", _fp32_path())
    path = quantized["q4_k_m"]
    kept = load_run(path, "decode", "cpu")
    layers = [m for m in kept.model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 1 + 4 * LAYERS and not kept.notes  # the head and each block's four
    assert {layer.format for layer in layers} == {"q4_K", "q6_K"}
    assert isinstance(kept.model.tok_emb, QuantEmbedding) and kept.model.tok_emb.format == "q4_K"  # rows dequantized as looked up
    plain = load_run(path, "inspect", "cpu")
    assert not any(isinstance(m, QuantLinear) for m in plain.model.modules())
    assert plain.notes == [f"{path}'s q4_K, q6_K weights were dequantized to f32 (for inspect)"]
    ids = torch.tensor([[5, 17, 3, 99, 250, 7]])
    with torch.no_grad():  # the C product sums in another order than PyTorch's
        expected = plain.model(ids).logits
        torch.testing.assert_close(kept.model(ids).logits, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
    monkeypatch.setenv("TFCLI_ACCEL", "0")
    off = load_run(path, "decode", "cpu")
    assert not any(isinstance(m, QuantLinear) for m in off.model.modules()) and "TFCLI_ACCEL=0" in off.notes[0]


def test_generate_gives_the_dequantized_runs_greedy_tokens(cli, quantized, tmp_path, monkeypatch):
    monkeypatch.setenv("TFCLI_QUANT_PATH", _fp32_path())
    for kind in ("q4_0", "bf16"):
        back = cli("quantize", quantized[kind], "-o", tmp_path / f"{kind}-f32", "--type", "f32")
        assert back.code == 0, back.stderr
        texts = []
        for path in (quantized[kind], tmp_path / f"{kind}-f32"):
            result = cli("generate", path, "--prompt", "the cat", "--max-new-tokens", "24", "--temperature", "0", "--ignore-eos")
            assert result.code == 0, result.stderr
            texts.append(result.stdout)
        assert texts[0].splitlines()[0] == texts[1].splitlines()[0]


def test_the_command_says_what_it_wrote_and_refuses_in_one_line(cli, run, quantized, tmp_path):
    result = cli("quantize", run, "-o", tmp_path / "q8", "--type", "q8_0")
    assert result.code == 0 and "(q8_0: 18 q8_0;" in result.stdout, result.stdout + result.stderr
    for args, message in [
        ((run, "-o", tmp_path / "x", "--type", "q3_k"), "--type 'q3_k' is not a type tfcli quantizes to"),
        ((quantized["q4_0"], "-o", tmp_path / "x", "--type", "q8_0"), "is already quantized (q4_0, q6_K)"),
        ((run, "-o", tmp_path / "x", "--type", "f32"), "holds f32 weights already"),
        ((run, "-o", tmp_path / "q8", "--type", "q4_0"), "already holds a run"),
    ]:
        refused = cli("quantize", *args)
        assert refused.code == 2 and message in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert not (tmp_path / "x").exists()


def test_fine_tuning_a_quantized_run_says_to_dequantize_first(quantized):
    with pytest.raises(TfcliError, match=r"holds quantized weights \(q4_K, q6_K\); training starts from f32 weights") as error:
        load_run(quantized["q4_k_m"], "parent")
    assert "--type f32" in str(error.value)


def _copy_run(source: Path, target: Path) -> Path:
    target.mkdir()
    for item in source.iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    return target


def _edit_config(path: Path, edit) -> None:
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))


def _tensor_offset(weights: Path, name: str) -> int:
    """Where tensor `name`'s bytes start in a safetensors file."""
    data = weights.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    return 8 + size + header[name]["data_offsets"][0]


def test_bad_quantized_runs_are_refused_in_one_line(cli, quantized, tmp_path, trained_tokenizer):
    source = quantized["q4_k_m"]
    unknown = _copy_run(source, tmp_path / "unknown")
    _edit_config(unknown, lambda c: c["quantized"].update({"lm_head.weight": "q3_K"}))
    vector = _copy_run(source, tmp_path / "vector")
    _edit_config(vector, lambda c: c["quantized"].update({"decoder.norm.weight": "q8_0"}))
    nan = _copy_run(source, tmp_path / "nan")
    weights = nan / "model.safetensors"
    offset = _tensor_offset(weights, "decoder.blocks.0.mlp.fc.weight")  # q4_K: the first block's d
    data = bytearray(weights.read_bytes())
    data[offset : offset + 2] = np.array([np.nan], dtype=np.float16).tobytes()
    weights.write_bytes(bytes(data))

    # 96 wide: q4_k_m falls back to q8_0 everywhere (96 is 3 blocks of 32, not a K block); then a config that claims q4_K
    tokenizer = TextTokenizer.load(trained_tokenizer)
    narrow = _random_run(tmp_path / "narrow", ModelConfig(vocab_size=320, block_size=32, n_layers=1, n_heads=2, d_model=96, d_ff=96), tokenizer)
    assert cli("quantize", narrow, "-o", tmp_path / "narrow-q", "--type", "q4_k_m").code == 0
    types = json.loads((tmp_path / "narrow-q" / "config.json").read_text())["quantized"]
    assert set(types.values()) == {"q8_0"}
    _edit_config(tmp_path / "narrow-q", lambda c: c["quantized"].update({"decoder.blocks.0.attn.out.weight": "q4_K"}))

    for path, message in [
        (unknown, "the type of lm_head.weight 'q3_K' is not a block format tfcli knows"),
        (vector, "quantizes decoder.norm.weight, which is not a matrix"),
        (nan, "tensor decoder.blocks.0.mlp.fc.weight has non-finite scales (NaN or infinity) in its q4_K blocks"),
        (tmp_path / "narrow-q", "decoder.blocks.0.attn.out.weight's rows of 96 values are not a whole number of q4_K blocks of 256"),
    ]:
        result = cli("generate", path, "--prompt", "a", "--max-new-tokens", "2")
        assert result.code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1, (path.name, result.stderr)


def test_a_tied_head_shares_the_embeddings_bytes(tmp_path, trained_tokenizer, monkeypatch):
    """GPT-2's head is its token embedding: quantized once (q6_K, as llama.cpp quantizes a tied token_embd), looked
    up by rows and multiplied as a whole from the same bytes."""
    from tfcli.checkpoint import quantize_run

    monkeypatch.setenv("TFCLI_QUANT_PATH", _fp32_path())
    tokenizer = TextTokenizer.load(trained_tokenizer)
    run = _random_run(tmp_path / "gpt", ModelConfig(vocab_size=320, block_size=32, n_layers=1, n_heads=2, d_model=256, d_ff=256), tokenizer)
    config = quantize_run(run, tmp_path / "q", "q4_0")
    assert config.quantized["tok_emb.weight"] == "q6_K" and "lm_head.weight" not in config.quantized
    kept = load_run(tmp_path / "q", "decode", "cpu").model
    assert isinstance(kept.lm_head, QuantLinear) and kept.lm_head.blocks is kept.tok_emb.blocks
    plain = load_run(tmp_path / "q", "inspect", "cpu").model
    ids = torch.tensor([[1, 2, 3, 200, 5]])
    with torch.no_grad():
        expected = plain(ids).logits
        torch.testing.assert_close(kept(ids).logits, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
