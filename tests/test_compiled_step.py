"""Compiled decoding (tfcli.accel.compiled_step): torch.compile over the one-row step on the static KV cache
gives the plain model's logits and greedy ids; `tune` times it beside PyTorch's step and the C step and
records the choice with its compile time; `bind` hands out the compiled step only where that stored decision
chose it; and a window never waits for the compiler (PyTorch's step decodes until the compiled one is ready).
Compiling is slow (about 14 s of CPU, 20-30 s of wall time on 2 busy cores, cold for this one-layer model;
a few seconds from inductor's on-disk cache), so one small model compiles once, for the whole module."""

from __future__ import annotations

import functools
import threading

import pytest
import torch

from tfcli.accel import choices, compiled_step, decode_step
from tfcli.generate.decoding import Generator
from tfcli.generate.events import Done
from tfcli.generate.settings import GenerationSettings
from tfcli.model.attention import KVCache
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer

CONFIG = ModelConfig(
    vocab_size=320, block_size=48, n_layers=1, n_heads=4, n_kv_heads=2, d_model=32, d_ff=64, positions="rotary", norm="rmsnorm", activation="swiglu", bias=False
)


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    built = Transformer(CONFIG).eval()
    with torch.no_grad():
        for parameter in built.parameters():
            parameter.normal_(0.0, 0.2)
    return built


@pytest.fixture
def private_choices(monkeypatch, tmp_path) -> choices.Choices:
    """Decisions in a file of this test's own, never the suite's shared one (where a compiled choice would
    reach other tests' models of the same shape)."""
    store = choices.Choices(tmp_path / "choices.json", torch.__version__)
    monkeypatch.setattr(choices, "_choices", store)
    return store


def greedy_ids(model, tokenizer, fast_step) -> list[int]:
    model.fast_decode_step = fast_step
    try:
        events = list(Generator(model, tokenizer, GenerationSettings(max_new_tokens=16, stop_at_eos=False), batch_size=1).run(["Once upon a time"]))
    finally:
        model.fast_decode_step = None
    assert isinstance(events[-1], Done)
    return events[-1].completions[0].tokens


@torch.inference_mode()
def test_the_compiled_step_gives_the_plain_steps_logits_and_greedy_ids(model, trained_tokenizer, private_choices, monkeypatch):
    plain, cache = KVCache(CONFIG, 1, 24, torch.float32), KVCache(CONFIG, 1, 24, torch.float32)
    prompt = torch.tensor([[5, 17, 42]])
    model.decode(prompt, cache=plain)
    model.decode(prompt, cache=cache)
    step = compiled_step.CompiledDecoderStep(model, cache)
    assert step.ready.wait(timeout=600) and step.problem is None and step.usable()
    token = 9
    for _ in range(12):
        expected = model.unembed(model.decode(torch.tensor([[token]]), cache=plain)[:, -1])
        got = step(token)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        token = int(expected.argmax())
        assert int(got.argmax()) == token
    assert cache.length == plain.length == 15
    # through the generator: the window binds the compiled step (forced, as `bench generate` times it), uses it, same ids
    calls = []
    original = compiled_step.CompiledDecoderStep.__call__
    monkeypatch.setattr(compiled_step.CompiledDecoderStep, "__call__", lambda self, t: (calls.append(t), original(self, t))[1])
    tokenizer = TextTokenizer.load(trained_tokenizer)
    compiled = greedy_ids(model, tokenizer, functools.partial(compiled_step.bind, force=True))
    assert compiled == greedy_ids(model, tokenizer, None)
    assert len(calls) == 15  # every token after the first (the prompt's pass gives that one)
    assert compiled_step.compile_seconds[compiled_step.shape_key(model)] > 0


def test_tune_measures_the_three_steps_and_bind_follows_the_stored_decision(model, private_choices):
    with torch.inference_mode():
        decision = compiled_step.tune(model, 16)
    assert {decode_step.TORCH, compiled_step.COMPILED} <= set(decision.seconds) and decision.compile_seconds > 0
    assert decision.choice in decision.seconds
    key = compiled_step.shape_key(model)
    on_disk = choices.ChoicesFile.load(private_choices.path).decisions[key]
    assert on_disk == decision  # recorded, compile time included
    with torch.inference_mode():
        cache = KVCache(CONFIG, 1, 24, torch.float32)
        private_choices.decisions[key] = choices.Decision(compiled_step.COMPILED, decision.seconds)
        assert isinstance(compiled_step.bind(model, cache), compiled_step.CompiledDecoderStep)
        private_choices.decisions[key] = choices.Decision(decode_step.TORCH, decision.seconds)
        assert not isinstance(compiled_step.bind(model, cache), compiled_step.CompiledDecoderStep)
        assert compiled_step.bind(model, KVCache(CONFIG, 2, 24, torch.float32)) is None  # two rows: PyTorch's step
        model.train()
        try:
            assert "training" in compiled_step.unsupported(model, cache)
        finally:
            model.eval()


def test_a_window_decodes_with_pytorchs_step_while_the_compiler_works(model, trained_tokenizer, private_choices, monkeypatch):
    """The compiled function is held back (a compile that has not finished): the generator still decodes
    every token, with the plain step over the same cache, and the same ids; nothing compiles here."""
    release = threading.Event()
    ran = []

    def slow_compile(*args):
        release.wait(timeout=60)
        ran.append(True)
        raise RuntimeError("never used")

    monkeypatch.setattr(compiled_step, "compiled_function", lambda device: slow_compile)
    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    tokenizer = TextTokenizer.load(trained_tokenizer)
    steps = []
    bind = functools.partial(compiled_step.bind, force=True)
    made = greedy_ids(model, tokenizer, lambda m, c: steps.append(bind(m, c)) or steps[-1])
    assert made == greedy_ids(model, tokenizer, None)
    assert len(steps) == 1 and not steps[0].usable() and not ran  # the compiled step was bound, never ready, never called
    release.set()


def test_bench_generates_compiled_job_decodes_with_the_compiled_step_over_the_cache(tmp_path, monkeypatch):
    """`tfcli bench generate`'s tfcli-compiled job, in-process, with the step run eagerly instead of compiled
    (the plumbing, not the compiler): it decodes with the step over the KV cache, the tokens tfcli's uncached
    job decodes."""
    from tfcli.bench import generate as bench

    steps = []

    def eager(*args):
        steps.append(1)
        return compiled_step._step(*args)

    monkeypatch.setattr(compiled_step, "compiled_function", lambda device: eager)
    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    run, hf, _, weight_bytes = bench.prepare(tmp_path, "tiny", 4, 12)
    compiled = bench._decode_job("tfcli-compiled", run, hf, 4, 12, 1, "cpu", weight_bytes)
    assert compiled.new_tokens == 12 and compiled.compile_seconds > 0 and "torch.compile" in compiled.kernel
    assert len(steps) >= 3 * 11  # every token after the first of each timed call went through the step
    uncached = bench._decode_job("tfcli-no-cache", run, hf, 4, 12, 1, "cpu", weight_bytes)
    assert compiled.first_tokens == uncached.first_tokens
