"""The C decoder step (native.c's decoder_step, bound by decode_step.py): it computes what
`Transformer.decode` and the output head compute, for every decoder the config can describe; the
generator uses it for one row on the CPU and gives the same text; anything it cannot run keeps PyTorch."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import forget_accel
from tfcli.accel import accelerate, decode_step, native
from tfcli.generate.decoding import Generator
from tfcli.generate.events import Done
from tfcli.generate.settings import GenerationSettings
from tfcli.generate.window import DecoderWindow, Vocabulary
from tfcli.model.attention import KVCache
from tfcli.model.config import ModelConfig
from tfcli.model.layers import RMSNorm
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer


@pytest.fixture
def library(buildable, monkeypatch):
    """The C library, with the C step taken wherever it applies (what a measurement that finds it faster
    decides; `test_the_measured_choice_*` measures for real)."""
    monkeypatch.setattr(decode_step, "choose", lambda library, model: decode_step.NATIVE)
    built = native.library()
    assert built is not None, native.problem()
    return built


def model_of(seed: int = 0, **overrides) -> Transformer:
    settings = dict(vocab_size=97, block_size=24, n_layers=2, n_heads=4, d_model=32, d_ff=48)
    torch.manual_seed(seed)
    model = accelerate(Transformer(ModelConfig(**{**settings, **overrides})).eval())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)  # larger than the initial 0.02, so every part of the step matters
    return model


VARIANTS = [
    dict(),  # the defaults: learned positions, pre-norm LayerNorm, GELU, biases, tied embeddings
    dict(positions="rotary", norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=False),  # llama's choices
    dict(positions="rotary", n_kv_heads=2, rope_base=500.0, activation="swiglu", d_ff=40),
    dict(positions="sinusoidal", norm="layernorm", norm_placement="post", activation="gelu_tanh", bias=True),
    dict(positions="learned", norm="rmsnorm", norm_placement="post", activation="relu"),
    dict(n_kv_heads=2),  # grouped-query
    dict(n_kv_heads=1, positions="learned", bias=True),  # multi-query
    dict(d_model=24, n_heads=4, d_ff=40, norm="layernorm", bias=False),  # head size 6, widths no vector divides
    dict(d_model=130, n_heads=2, d_ff=70, positions="sinusoidal", activation="gelu"),  # rows longer than 4 vectors, with a tail
    dict(n_layers=1, norm_eps=1e-2),
    dict(zero_init_proj=True, tie_embeddings=False),  # the speedrun's initialisation and untied head: the C step's as any other
]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_the_c_step_computes_what_the_model_computes(library, overrides):
    model = model_of(**overrides)
    config = model.config
    ids = torch.randint(0, config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch_cache = KVCache(config, 1, config.block_size, torch.float32)
        c_cache = KVCache(config, 1, config.block_size, torch.float32)
        model.decode(ids[:, :5], cache=torch_cache)
        model.decode(ids[:, :5], cache=c_cache)
        step = decode_step.NativeDecoderStep.bind(model, c_cache)
        assert step is not None, decode_step.unsupported(model, c_cache)
        for t in range(5, 20):
            expected = model.lm_head(model.decode(ids[:, t : t + 1], cache=torch_cache))[:, -1]
            got = step(int(ids[0, t]))
            assert got.shape == (1, config.vocab_size)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        assert c_cache.length == torch_cache.length == 20
        torch.testing.assert_close(c_cache.keys[:, :, :, :20], torch_cache.keys[:, :, :, :20], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c_cache.values[:, :, :, :20], torch_cache.values[:, :, :, :20], rtol=1e-5, atol=1e-5)


def test_the_c_step_runs_on_several_threads_and_one(library):
    model = model_of(d_model=256, n_heads=4, d_ff=512, vocab_size=300)  # products past PARALLEL_FROM
    ids = torch.randint(0, 300, (1, 8), generator=torch.Generator().manual_seed(2))
    threads = torch.get_num_threads()
    outputs = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with torch.inference_mode():
                cache = KVCache(model.config, 1, 24, torch.float32)
                model.decode(ids[:, :1], cache=cache)
                step = decode_step.NativeDecoderStep.bind(model, cache)
                outputs.append(torch.cat([step(int(t)) for t in ids[0, 1:]]))
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


def test_a_token_outside_the_vocabulary_or_a_full_cache_is_refused(library):
    model = model_of(block_size=8)
    with torch.inference_mode():
        cache = KVCache(model.config, 1, 8, torch.float32)
        step = decode_step.NativeDecoderStep.bind(model, cache)
        with pytest.raises(ValueError, match="outside"):
            step(97)
        with pytest.raises(ValueError, match="outside"):
            step(-1)
        for token in range(8):
            step(token)
        with pytest.raises(ValueError, match="outside"):
            step(0)
    assert cache.length == 8


def test_what_the_c_step_leaves_to_pytorch(library):
    decoder = model_of()
    with torch.inference_mode():
        one_row = KVCache(decoder.config, 1, 24, torch.float32)
        assert decode_step.unsupported(decoder, one_row) is None
        assert "one row" in decode_step.unsupported(decoder, KVCache(decoder.config, 2, 24, torch.float32))
        assert "one row" in decode_step.unsupported(decoder, None)
        assert "longer than the model's context" in decode_step.unsupported(decoder, KVCache(decoder.config, 1, 25, torch.float32))
        other = model_of(n_kv_heads=2)
        assert "not the ones its config describes" in decode_step.unsupported(decoder, KVCache(other.config, 1, 24, torch.float32))
        seq2seq = model_of(arch="encoder-decoder")
        assert "not encoder-decoder" in decode_step.unsupported(seq2seq, KVCache(seq2seq.config, 1, 24, torch.float32))
        assert "training mode" in decode_step.unsupported(model_of().train(), one_row)
        half = model_of().to(torch.bfloat16)
        assert "fp32" in decode_step.unsupported(half, KVCache(half.config, 1, 24, torch.bfloat16))
        strided = model_of()
        weight = strided.decoder.blocks[0].mlp.fc.weight
        strided.decoder.blocks[0].mlp.fc.weight = torch.nn.Parameter(weight.detach().t().contiguous().t())
        assert "contiguous" in decode_step.unsupported(strided, one_row)
        one_block_training = model_of(dropout=0.5)
        one_block_training.decoder.blocks[1].train()
        assert "training mode" in decode_step.unsupported(one_block_training, one_row)
        hooked = model_of()
        hooked.decoder.blocks[0].attn.register_forward_hook(lambda *args: None)
        assert "of its own" in decode_step.unsupported(hooked, one_row)
        assert decode_step.NativeDecoderStep.bind(hooked, one_row) is None
    with torch.enable_grad():
        assert "gradients" in decode_step.unsupported(decoder, one_row)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert "autocast" in decode_step.unsupported(decoder, one_row)


def _swap_norm(model, kind):
    block = model.decoder.blocks[0]
    block.mlp_norm = RMSNorm(model.config.d_model, model.config.norm_eps) if kind == "rms" else torch.nn.LayerNorm(model.config.d_model)


def _patch_forward(model):
    model.decoder.blocks[0].mlp.forward = lambda x: x


RESHAPED = {
    "a Linear swapped for Identity": lambda m: setattr(m.decoder.blocks[0].attn, "out", torch.nn.Identity()),
    "an MLP swapped for Sequential": lambda m: setattr(m.decoder.blocks[1], "mlp", torch.nn.Sequential()),
    "a LayerNorm swapped for RMSNorm": lambda m: _swap_norm(m, "rms"),
    "a LayerNorm with its own eps": lambda m: setattr(m.decoder.blocks[0].attn_norm, "eps", 1e-2),
    "an MLP with another activation": lambda m: setattr(m.decoder.blocks[0].mlp, "activation", "relu"),
    "a block switched to post-norm": lambda m: setattr(m.decoder.blocks[0], "pre_norm", False),
    "a final norm removed": lambda m: setattr(m.decoder, "norm", torch.nn.Identity()),
    "attention with fewer heads": lambda m: setattr(m.decoder.blocks[0].attn, "n_heads", 2),
    "a forward patched on an instance": _patch_forward,
    "an embedding with max_norm": lambda m: setattr(m.tok_emb, "max_norm", 1.0),
}


@pytest.mark.parametrize("change", RESHAPED.values(), ids=RESHAPED.keys())
def test_a_model_changed_from_what_its_config_builds_keeps_pytorch(library, change):
    model = model_of()
    change(model)
    model.eval()  # a module made by the change starts in training mode
    with torch.inference_mode():
        cache = KVCache(model.config, 1, 24, torch.float32)
        assert "of its own" in decode_step.unsupported(model, cache)
        assert decode_step.NativeDecoderStep.bind(model, cache) is None


def test_a_method_patched_on_the_class_keeps_pytorch(library, monkeypatch):
    from tfcli.model.attention import Attention

    model = model_of()
    monkeypatch.setattr(Attention, "forward", lambda self, *args, **kwargs: None)
    with torch.inference_mode():
        assert "of its own" in decode_step.unsupported(model, KVCache(model.config, 1, 24, torch.float32))


def test_a_post_norm_stack_given_a_final_norm_keeps_pytorch(library):
    model = model_of(norm_placement="post")
    model.decoder.norm = torch.nn.LayerNorm(model.config.d_model).eval()
    with torch.inference_mode():
        assert "of its own" in decode_step.unsupported(model, KVCache(model.config, 1, 24, torch.float32))


def test_a_model_converted_after_binding_is_never_read_from_freed_memory(library):
    model = model_of()
    with torch.inference_mode():
        cache = KVCache(model.config, 1, 24, torch.float32)
        model.decode(torch.tensor([[1, 2]]), cache=cache)
        step = decode_step.NativeDecoderStep.bind(model, cache)
        before = step(3)
        cache.length = 2
        model.to(torch.bfloat16)  # frees the fp32 parameters' memory, but the binding still holds it
        torch.randn(1 << 20).fill_(float("nan"))  # whatever might reuse freed memory
        torch.testing.assert_close(step(3), before)  # the model as bound: stale, never garbage


def test_a_negative_position_is_refused(library):
    model = model_of()
    with torch.inference_mode():
        cache = KVCache(model.config, 1, 24, torch.float32)
        step = decode_step.NativeDecoderStep.bind(model, cache)
        cache.length = -1
        with pytest.raises(ValueError, match="outside"):
            step(3)


def test_the_window_keeps_pytorch_for_a_step_under_autocast(library, tokenizer, monkeypatch):
    model = model_of(vocab_size=tokenizer.vocab_size)
    calls = []
    with torch.inference_mode():
        window = DecoderWindow(model, 1, Vocabulary.of(tokenizer, model.config.vocab_size))
        assert window.fast_step is not None
        monkeypatch.setattr(decode_step.NativeDecoderStep, "__call__", lambda self, token: calls.append(token))
        window.start(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.bool))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            window.push(torch.tensor([8]))
    assert calls == []  # PyTorch's step, in autocast as asked


def test_the_first_check_in_autocast_or_a_float64_default_still_passes(library):
    library.step_verified = None
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert decode_step._verified(library)
    finally:
        torch.set_default_dtype(default)
    forget_accel()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert native.vector_linear() is not None, native.problem()


def test_a_residual_stream_far_from_zero_keeps_its_precision(library):
    model = model_of(n_layers=1)
    with torch.no_grad():
        model.tok_emb.weight.add_(300.0)  # every hidden state sits near 300: a naive float mean loses digits
    ids = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        exact = model.double()(ids).logits[0, 4:].float()
        model.float()
        cache = KVCache(model.config, 1, 24, torch.float32)
        model.decode(ids[:, :4], cache=cache)
        step = decode_step.NativeDecoderStep.bind(model, cache)
        got = torch.cat([step(int(t)) for t in ids[0, 4:]])
        ours = model(ids).logits[0, 4:]
    assert (got - exact).abs().max() <= 2 * (ours - exact).abs().max() + 1e-5


@pytest.fixture(scope="module")
def tokenizer(trained_tokenizer) -> TextTokenizer:
    return TextTokenizer.load(trained_tokenizer)


def generate(model, tokenizer, prompt="Once upon a time", **settings):
    generator = Generator(model, tokenizer, GenerationSettings(**{"max_new_tokens": 40, "logprobs": True, **settings}), batch_size=1)
    (done,) = [event for event in generator.run([prompt]) if isinstance(event, Done)]
    return done.completions[0]


@pytest.mark.parametrize("settings", [dict(), dict(strategy="sample", temperature=0.8, top_k=20, seed=3), dict(repetition_penalty=1.3)])
def test_the_generator_uses_the_c_step_and_writes_the_same_text(library, tokenizer, monkeypatch, settings):
    model = model_of(vocab_size=tokenizer.vocab_size, block_size=32)
    calls = []
    original = decode_step.NativeDecoderStep.__call__
    monkeypatch.setattr(decode_step.NativeDecoderStep, "__call__", lambda self, token: calls.append(token) or original(self, token))
    with_c = generate(model, tokenizer, stop_at_eos=False, **settings)  # 40 tokens: past the 32-token window, which slides
    assert len(calls) > 20
    monkeypatch.setenv("TFCLI_NATIVE_KERNELS", "0")
    forget_accel()
    without = generate(model, tokenizer, stop_at_eos=False, **settings)
    assert with_c.tokens == without.tokens and with_c.text == without.text
    assert with_c.logprobs == pytest.approx(without.logprobs, abs=1e-4)


def test_a_conversation_mixes_pytorch_turns_and_c_steps(library, tokenizer):
    model = model_of(vocab_size=tokenizer.vocab_size, block_size=32)
    vocab = Vocabulary.of(tokenizer, model.config.vocab_size)
    with torch.inference_mode():
        window = DecoderWindow(model, 1, vocab)
        assert window.fast_step is not None
        window.start(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.bool))
        window.push(torch.tensor([8]))
        window.extend([9, 10, 11])  # the next turn: PyTorch runs several tokens at once
        window.truncate(5)  # forget the last two, as a cut-off turn does
        got = window.push(torch.tensor([12]))
        expected = window._scores(model(torch.tensor([[5, 6, 7, 8, 9, 12]])).logits[:, -1])  # specials at -inf on both
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_c_step_that_disagrees_with_pytorch_is_never_used(library, tokenizer, monkeypatch):
    monkeypatch.setattr(decode_step, "_agrees", lambda *args: False)
    model = model_of(vocab_size=tokenizer.vocab_size)
    with torch.inference_mode():
        assert decode_step.NativeDecoderStep.bind(model, KVCache(model.config, 1, 24, torch.float32)) is None
    assert "disagreed with PyTorch" in decode_step.describe()
    assert len(generate(model, tokenizer, stop_at_eos=False, max_new_tokens=5).tokens) == 5


def test_the_check_models_pass_and_describe_names_the_c_step(library):
    assert all(decode_step._agrees(library, settings) for settings in decode_step.CHECK_MODELS)
    assert decode_step.describe() == "tfcli's C decoder step (native.c), where a model's shape measures faster with it"
    state = torch.random.get_rng_state()
    library.step_verified = None
    decode_step._verified(library)
    assert torch.equal(torch.random.get_rng_state(), state)  # the check leaves the caller's random numbers alone


def test_turned_off_the_generator_keeps_pytorch(monkeypatch, tokenizer):
    monkeypatch.setenv("TFCLI_NATIVE_KERNELS", "0")
    forget_accel()
    try:
        model = model_of(vocab_size=tokenizer.vocab_size)
        with torch.inference_mode():
            assert DecoderWindow(model, 1, Vocabulary.of(tokenizer, model.config.vocab_size)).fast_step is None
        assert decode_step.describe() == "PyTorch's step (turned off by TFCLI_NATIVE_KERNELS)"
    finally:
        forget_accel()


def test_the_measured_choice_times_both_steps_on_the_model_and_is_remembered(buildable):
    model = model_of()
    library = native.library()
    choice = decode_step.choose(library, model)
    decision = decode_step.choices.choices().decisions[decode_step._shape_key(model)]
    assert choice == decision.choice and set(decision.seconds) == {"torch", "native"} and decision.note == ""
    record = decode_step.choices.ChoicesFile.load(decode_step.choices.choices().path)
    assert record.decisions[decode_step._shape_key(model)].choice == choice  # in the machine's file
    described = decode_step.describe(model)
    assert ("tfcli's C decoder step" in described) == (choice == "native") and "speed" in described


def test_a_c_step_slower_than_pytorch_is_not_bound(buildable, monkeypatch):
    model = model_of()
    monkeypatch.setattr(decode_step, "choose", lambda library, model: decode_step.TORCH)
    with torch.inference_mode():
        assert decode_step.NativeDecoderStep.bind(model, KVCache(model.config, 1, 24, torch.float32)) is None


def test_a_setting_the_c_step_does_not_know_keeps_pytorch(library, tokenizer):
    import dataclasses

    @dataclasses.dataclass
    class AttnSoftcapConfig(ModelConfig):
        attn_softcap: float = 50.0  # a new model option (Gemma 2's cap on attention scores): the C code knows nothing of it

    config = AttnSoftcapConfig(**ModelConfig(vocab_size=tokenizer.vocab_size, block_size=24, n_layers=2, n_heads=4, d_model=32, d_ff=48).to_json())
    model = accelerate(Transformer(config).eval())
    with torch.inference_mode():
        assert "does not know the setting 'attn_softcap'" in decode_step.unsupported(model, KVCache(config, 1, 24, torch.float32))
        assert DecoderWindow(model, 1, Vocabulary.of(tokenizer, config.vocab_size)).fast_step is None
        known = model_of(vocab_size=tokenizer.vocab_size)
        assert DecoderWindow(known, 1, Vocabulary.of(tokenizer, config.vocab_size)).fast_step is not None
    assert "implement positions" not in (decode_step.unknown_setting(known.config) or "")
    assert decode_step.unknown_setting(ModelConfig(arch="encoder")) == "the C step does not implement arch = 'encoder'"


def test_a_plain_model_has_no_fast_step(library, tokenizer):
    plain = Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=24, n_layers=1, n_heads=2, d_model=16)).eval()
    with torch.inference_mode():
        assert DecoderWindow(plain, 1, Vocabulary.of(tokenizer, plain.config.vocab_size)).fast_step is None


@pytest.mark.parametrize(
    "overrides",
    [
        dict(qkv_bias=True, bias=False),
        dict(mlp_bias=False),
        dict(embedding_norm=True),
        dict(type_vocab_size=2),
        dict(rope_scaling={"kind": "llama3", "factor": 4.0, "original_context": 16}, positions="rotary"),
        dict(rope_scaling={"kind": "longrope", "factor": 2.0, "original_context": 24, "short_factor": [1.0, 1.5, 2.0, 3.0]}, positions="rotary"),
        dict(qk_norm=True, positions="rotary", norm="rmsnorm"),
        dict(d_head=16),
        dict(attn_scale=0.5),
        dict(sliding_window=4, local_layers=[0], rope_local_base=500.0, positions="rotary"),
        dict(post_norms=True),
        dict(activation="geglu"),
        dict(scale_embeddings=True),
        dict(logit_softcap=30.0),
        dict(activation="relu2"),
    ],
    ids=["qkv_bias", "mlp_bias", "embedding_norm", "type_vocab_size", "rope_scaling", "longrope", "qk_norm", "d_head"]
    + ["attn_scale", "local_layers", "post_norms", "geglu", "scale_embeddings", "logit_softcap", "relu2"],
)
def test_the_options_pretrained_models_bring_keep_pytorch(library, overrides):
    config = ModelConfig.from_json({**model_of().config.to_json(), **overrides})
    with torch.inference_mode():
        reason = decode_step.unsupported(Transformer(config).eval(), KVCache(config, 1, 24, torch.float32))
    assert reason is not None and "does not implement" in reason and next(iter(overrides)) in reason


def test_a_hook_on_a_hook_point_keeps_pytorch_when_binding(library):
    model = model_of()
    with torch.inference_mode(), model.decoder.blocks[1].attn.hook_z.register_forward_hook(lambda module, args, z: z * 0):
        assert "of its own" in decode_step.unsupported(model, KVCache(model.config, 1, 24, torch.float32))


def test_a_hook_added_after_the_window_bound_the_c_step_sees_every_step(library, tokenizer, monkeypatch):
    model = model_of(vocab_size=tokenizer.vocab_size)
    calls, seen = [], []
    with torch.inference_mode():
        window = DecoderWindow(model, 1, Vocabulary.of(tokenizer, model.config.vocab_size))
        assert window.fast_step is not None
        window.start(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.bool))
        step = decode_step.NativeDecoderStep.__call__
        monkeypatch.setattr(decode_step.NativeDecoderStep, "__call__", lambda self, token: calls.append(token) or step(self, token))
        with model.decoder.blocks[0].hook_resid_post.register_forward_hook(lambda module, args, x: seen.append(x.shape)):
            window.push(torch.tensor([8]))
        assert calls == [] and seen == [(1, 1, model.config.d_model)]  # PyTorch's step, which the hook saw
        window.push(torch.tensor([9]))
    assert calls == [9] and len(seen) == 1  # the hook gone, the C step again
