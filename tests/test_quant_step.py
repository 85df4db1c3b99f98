"""The C decoder step over quantized weights (native.c's `matrix`, bound by decode_step.py): on a quantized run's
model (QuantLinear, QuantEmbedding) it computes what the PyTorch step over the same C products computes, for each
file type, at a Llama shape (GQA, rmsnorm, SwiGLU, rotary, tied head) and a GPT-2 shape, on every SIMD path this
processor runs (TFCLI_QUANT_PATH forces each); and on several threads what it computes on one."""

from __future__ import annotations

import pytest
import torch

from tfcli.accel import accelerate, decode_step, native, quant
from tfcli.checkpoint import _quantized_model, _tensors_to_save
from tfcli.model.attention import KVCache
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.quant.linear import QuantEmbedding, QuantLinear
from tfcli.quant.mix import plan
from tfcli.quant.tensors import Blocks, quantized_bytes

SHAPES = {
    # SmolLM2's choices at a tiny size: 2 query heads a KV head, a tied head (q6_K or q8_0 as llama.cpp mixes it)
    "llama": dict(n_heads=4, n_kv_heads=2, d_ff=256, positions="rotary", norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=True),
    # GPT-2's: learned positions, LayerNorm with biases, tanh GELU, tied
    "gpt2": dict(n_heads=4, d_ff=512, activation="gelu_tanh"),
}
FILE_TYPES = ("bf16", "q8_0", "q4_0", "q4_k_m")
PROMPT, TOKENS = 3, 6  # the prefix through PyTorch, then tokens through both steps


def quantized_model(shape: str, file_type: str) -> Transformer:
    """A seeded tiny decoder with its matrices quantized as `tfcli quantize --type file_type` mixes them, loaded as a
    quantized run is loaded for decoding (QuantLinear, QuantEmbedding, tfcli.accel attached)."""
    config = ModelConfig(vocab_size=64, block_size=PROMPT + TOKENS, n_layers=2, d_model=256, **SHAPES[shape])
    torch.manual_seed(0)
    model = Transformer(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # a trained model's scale: every part of the step matters
            parameter.normal_(0.0, 0.3 if parameter.dim() < 2 else parameter.shape[-1] ** -0.5)
    tensors = _tensors_to_save(model)
    types = plan({name: tuple(t.shape) for name, t in tensors.items()}, file_type, config.decoder_layers, config.tie_embeddings)
    for name, kind in types.items():
        tensors[name] = Blocks(quantized_bytes(tensors[name], kind), kind, tuple(tensors[name].shape))
    return accelerate(_quantized_model(config, tensors, keep=True).eval())


@pytest.fixture(scope="module")
def models() -> dict[tuple[str, str], Transformer]:
    return {(shape, kind): quantized_model(shape, kind) for shape in SHAPES for kind in FILE_TYPES}


@pytest.fixture
def library(buildable):
    built = native.library()
    assert built is not None, native.problem()
    return built


def both_steps(library, model: Transformer) -> tuple[torch.Tensor, torch.Tensor]:
    """(PyTorch's logits, the C step's) for TOKENS tokens after a PROMPT-token prefix: (TOKENS, vocab) each."""
    config = model.config
    ids = torch.randint(0, config.vocab_size, (1, PROMPT + TOKENS), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch_cache, c_cache = (KVCache(config, 1, config.block_size, torch.float32) for _ in range(2))
        model.decode(ids[:, :PROMPT], cache=torch_cache)
        model.decode(ids[:, :PROMPT], cache=c_cache)
        assert decode_step.unsupported(model, c_cache) is None, decode_step.unsupported(model, c_cache)
        step = decode_step.NativeDecoderStep(library, model, c_cache)
        expected = torch.cat([model.lm_head(model.decode(ids[:, t : t + 1], cache=torch_cache))[:, -1] for t in range(PROMPT, PROMPT + TOKENS)])
        got = torch.cat([step(int(token)) for token in ids[0, PROMPT:]])
    return expected, got


def runnable_paths() -> list[str]:
    return [path for path in quant.PATHS if quant.runnable(path)]


@pytest.mark.parametrize("path", runnable_paths())
def test_the_c_step_over_quantized_weights_computes_what_the_pytorch_step_computes(library, models, monkeypatch, path):
    if quant.kernel(path) is None:
        pytest.fail(f"this processor runs {path} but its kernels did not build: {quant.problem(path)}")
    monkeypatch.setenv(quant.FORCE_VARIABLE, path)
    for (shape, kind), model in models.items():
        expected, got = both_steps(library, model)
        # the same products; a path that rounds the activations to int8 may put a level on the other side of a half
        # where the two steps' norms differ in the last bit: held to the rounding paths' own tolerance
        rounding = any(quant.rounds(path, m.format) for m in model.modules() if isinstance(m, QuantLinear))
        tolerance = quant.ROUNDING_TOLERANCE if rounding else 1e-4
        error = float((got - expected).abs().max() / expected.abs().max())
        assert error <= tolerance, (shape, kind, path, error)
        assert torch.equal(got.argmax(-1), expected.argmax(-1)), (shape, kind, path)  # the same greedy ids


def test_each_file_type_reaches_the_c_step_with_its_formats(models):
    formats = {key: sorted({m.format for m in model.modules() if isinstance(m, (QuantLinear, QuantEmbedding))}) for key, model in models.items()}
    assert formats[("llama", "q4_k_m")] == ["q4_K", "q6_K"] and formats[("gpt2", "q4_0")] == ["q4_0", "q6_K"]
    assert formats[("llama", "q8_0")] == ["q8_0"] and formats[("gpt2", "bf16")] == ["bf16"]
    assert all(isinstance(model.tok_emb, QuantEmbedding) and isinstance(model.lm_head, QuantLinear) for model in models.values())


def test_the_c_step_over_quantized_weights_on_two_threads_computes_what_it_does_on_one(library, models, monkeypatch):
    monkeypatch.setattr(native, "PARALLEL_FROM", 0)  # split even these small matrices between the threads
    monkeypatch.setenv(quant.FORCE_VARIABLE, "portable")
    threads = torch.get_num_threads()
    outputs = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            outputs.append(both_steps(library, models[("llama", "q4_k_m")]))
    finally:
        torch.set_num_threads(threads)
    (expected_one, got_one), (expected_two, got_two) = outputs
    assert torch.equal(got_one, got_two)  # each output row summed by one thread in the same order
    torch.testing.assert_close(got_two, expected_two, rtol=1e-4, atol=1e-4)  # and PyTorch's step's products split as well


def test_quant_products_split_between_threads_give_the_same_rows(library, monkeypatch):
    monkeypatch.setattr(native, "PARALLEL_FROM", 0)
    monkeypatch.setenv(quant.FORCE_VARIABLE, "portable")
    weight = torch.randn(37, 256, generator=torch.Generator().manual_seed(3))
    layer = QuantLinear(Blocks(quantized_bytes(weight, "q4_K"), "q4_K", (37, 256)))
    layer.kernel = quant.product
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(4))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [quant.product(x[:1], layer), quant.product(x, layer)]
        torch.set_num_threads(2)
        two = [quant.product(x[:1], layer), quant.product(x, layer)]  # three rows: each thread's share copied into place
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    torch.testing.assert_close(two[1], x @ layer.dequantized().T, rtol=1e-4, atol=1e-4)


def test_a_quantized_model_binds_only_where_every_matrix_has_a_c_product(library, models, monkeypatch):
    model = models[("gpt2", "q8_0")]
    monkeypatch.setattr(decode_step, "choose", lambda library, model: decode_step.NATIVE)
    with torch.inference_mode():
        cache = KVCache(model.config, 1, model.config.block_size, torch.float32)
        monkeypatch.setenv(quant.FORCE_VARIABLE, "portable")
        assert decode_step.NativeDecoderStep.bind(model, cache) is not None
        monkeypatch.setenv(quant.FORCE_VARIABLE, "torch")  # PyTorch's product over the dequantized weight: its step only
        assert "PyTorch's product" in decode_step.unsupported(model, cache)
        assert decode_step.NativeDecoderStep.bind(model, cache) is None
    monkeypatch.setenv(quant.FORCE_VARIABLE, "portable")
    assert decode_step._shape_key(model).endswith(" emb-q8_0 q8_0/portable")  # the formats and paths in the measured choice's name


def test_a_layer_whose_pytorch_product_measured_faster_takes_an_fp32_c_path_in_the_step(library, monkeypatch):
    model = quantized_model("gpt2", "q8_0")  # its own layers: the chosen plans are remembered on them
    monkeypatch.delenv(quant.FORCE_VARIABLE, raising=False)
    monkeypatch.setattr(quant, "choose", lambda layer, m: quant.TORCH)  # as a noisy measurement may decide
    fp32_paths = [quant.kernel(path) for path in ("avx512", "avx2", "portable") if quant.kernel(path) is not None]
    assert quant.step_product(model.lm_head) == quant.address(fp32_paths[0])
    expected, got = both_steps(library, model)  # PyTorch's step: F.linear over the dequantized weights
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_the_quantized_check_model_passes_and_a_failed_check_keeps_pytorch(library, models, monkeypatch):
    library.quantized_step_verified = None
    assert decode_step._verified(library, quantized=True)  # the check (_agrees_quantized) passes
    model = models[("llama", "q8_0")]
    monkeypatch.setattr(decode_step, "choose", lambda library, model: decode_step.NATIVE)
    monkeypatch.setattr(decode_step, "_agrees_quantized", lambda library: False)
    library.quantized_step_verified = None
    with torch.inference_mode():
        assert decode_step.NativeDecoderStep.bind(model, KVCache(model.config, 1, model.config.block_size, torch.float32)) is None
    assert decode_step._verified(library)  # fp32 models keep the C step
    assert "disagreed with PyTorch" in decode_step.describe(model)
