"""The static KV cache (preallocated, written in place, read in whole blocks of columns or whole, through a
length mask) computes what the growing cache it replaced computed: the same logits (within 1e-5) and greedy ids for generate's left-padded
batch past the context, beam search, serve's continuous batch (rows of different lengths joining and
leaving), GQA and MQA, a sliding-window layer and an encoder-decoder; and a decoding step has the same
shapes at every step. The growing cache is kept here as the reference: it returned the keys written so far
(`keys[:, :, :end]`, a new shape each step) under the mask `AttentionMask.build` made for them."""

from __future__ import annotations

import random

import pytest
import torch

import tfcli.generate.window as window_module
import tfcli.serve.slots as slots_module
from tfcli.generate.decoding import Generator
from tfcli.generate.events import Done
from tfcli.generate.settings import GenerationSettings
from tfcli.generate.window import Vocabulary
from tfcli.model.attention import AttentionMask, KVCache, LayerKVCache
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.serve.slots import SlotBatch
from tfcli.tokenizer.core import TextTokenizer

PROMPTS = ["Once upon a time", "The fox", "Tom had three apples. He gave one to"]
TOLERANCE = 1e-5


class GrowingLayer(LayerKVCache):
    """The cache as it was: the new keys and values after the cached ones, the ones written so far returned."""

    def write(self, k, v, slots=None):
        start, end = self.parent.length, self.parent.length + k.shape[2]
        keys, values = self.parent.keys[self.index], self.parent.values[self.index]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]  # (B, n_kv, cached + T, hs): a new shape every step


class GrowingKVCache(KVCache):
    def layer(self, index: int) -> LayerKVCache:
        return GrowingLayer(self, index)

    def mask(self, T, padding=None, positions=None) -> AttentionMask:
        if positions is None:  # the cached length + 0..T-1, as `decode` counted them
            positions = torch.arange(self.length, self.length + T, device=self.keys.device).unsqueeze(0)
        return AttentionMask.build(T, self.length + T, causal=True, key_padding=padding, offset=self.length, positions=positions)


CONFIGS = {
    "gpt2": dict(positions="learned", norm="layernorm", activation="gelu_tanh"),
    "gqa-rotary": dict(positions="rotary", n_kv_heads=2, norm="rmsnorm", activation="swiglu", bias=False),
    "mqa-sinusoidal": dict(positions="sinusoidal", n_kv_heads=1),
    "local-window": dict(positions="rotary", n_kv_heads=2, sliding_window=5, local_layers=(0,)),
    "encoder-decoder": dict(arch="encoder-decoder", positions="sinusoidal", n_kv_heads=2),
}


def make_model(name: str, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=320, block_size=32, n_layers=2, n_heads=4, d_model=32, d_ff=64, **CONFIGS[name])
    model = Transformer(config).eval()
    with torch.no_grad():  # a trained model's scale, so that near-ties are rare and differences show
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    return model


@pytest.fixture(scope="module")
def tokenizer(trained_tokenizer) -> TextTokenizer:
    return TextTokenizer.load(trained_tokenizer)


def window_logits(model, tokenizer, cache_class, monkeypatch, steps: int = 36) -> list[torch.Tensor]:
    """Every step's logits (B, V) of a window over the three prompts (left-padded), fed each row's argmax;
    36 steps past prompts of up to 10 tokens slide the window (block 32) for a decoder."""
    monkeypatch.setattr(window_module, "KVCache", cache_class)
    generator = Generator(model, tokenizer, GenerationSettings(max_new_tokens=steps, stop_at_eos=False))
    rows = [tokenizer.encode(p) for p in PROMPTS]
    with torch.inference_mode():
        window, logits = generator.open_window(rows, 1)
        got = [logits]
        for _ in range(steps):
            got.append(window.push(got[-1].argmax(dim=-1)))
    return got


@pytest.mark.parametrize("read_block", [KVCache.READ_BLOCK, 8])  # the whole 32-column cache read; blocks of 8 columns
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_window_over_the_static_cache_gives_the_growing_caches_logits(tokenizer, monkeypatch, name, read_block):
    monkeypatch.setattr(KVCache, "READ_BLOCK", read_block)
    model = make_model(name)
    static = window_logits(model, tokenizer, KVCache, monkeypatch)
    growing = window_logits(model, tokenizer, GrowingKVCache, monkeypatch)
    for step, (s, g) in enumerate(zip(static, growing, strict=True)):
        torch.testing.assert_close(s, g, rtol=0, atol=TOLERANCE, msg=f"{name}, step {step}")  # specials at -inf on both sides
        assert torch.equal(s.argmax(dim=-1), g.argmax(dim=-1)), (name, step)


def run_ids(model, tokenizer, monkeypatch, cache_class, **settings) -> list[tuple[list[int], float | None]]:
    monkeypatch.setattr(window_module, "KVCache", cache_class)
    events = list(Generator(model, tokenizer, GenerationSettings(stop_at_eos=False, **settings)).run(PROMPTS))
    assert isinstance(events[-1], Done)
    return [(c.tokens, c.score) for c in events[-1].completions]


@pytest.mark.parametrize("name", ["gqa-rotary", "local-window", "encoder-decoder"])
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_generate_and_beam_search_choose_the_same_ids(tokenizer, monkeypatch, name, strategy):
    model = make_model(name, seed=1)
    options = dict(max_new_tokens=12, strategy=strategy, num_beams=3 if strategy == "beam" else 1, num_samples=2 if strategy == "beam" else 1)
    static = run_ids(model, tokenizer, monkeypatch, KVCache, **options)
    growing = run_ids(model, tokenizer, monkeypatch, GrowingKVCache, **options)
    assert [ids for ids, _ in static] == [ids for ids, _ in growing]
    for (_, a), (_, b) in zip(static, growing):
        assert (a is None and b is None) or abs(a - b) <= 1e-4  # beam scores: summed log-probabilities


VOCAB = Vocabulary(limit=50, eos_id=None, pad_id=0, suppressed=[])


def serve_logits(model, cache_class, monkeypatch) -> list[torch.Tensor]:
    """A continuous batch of 3 rows over a 24-position cache: sequences of different lengths join at random
    steps (a longer prompt shifts the others right), leave when done, and the columns every row leaves empty
    are dropped when the window is full. Every prefill's and step's logits, in order."""
    monkeypatch.setattr(slots_module, "KVCache", cache_class)
    batch = SlotBatch(model, 3, VOCAB)
    rng = random.Random(1)
    wanted = [([rng.randrange(50) for _ in range(p)], n) for p, n in [(3, 12), (9, 6), (2, 20), (15, 8), (1, 5), (20, 3), (4, 19)]]
    waiting, rows, got, pending, logged = list(range(len(wanted))), [], {i: 0 for i in range(len(wanted))}, {}, []
    with torch.inference_mode():
        while waiting or rows:
            joining = []
            while waiting and batch.free > len(joining) and (not rows or rng.random() < 0.5):
                joining.append(waiting.pop(0))
            if joining:
                prefilled, logits = batch.prefill([wanted[s][0] for s in joining])
                logged.append(logits)
                for k, s in enumerate(joining):
                    batch.join(wanted[s][0], prefilled, k)
                    rows.append(s)
                    got[s], pending[s] = 1, int(logits[k].argmax())
            for s in [s for s in rows if got[s] == wanted[s][1]]:
                at = rows.index(s)
                moved = batch.leave(at)
                if moved is not None:
                    rows[at] = rows[moved]
                rows.pop()
            if rows:
                logits = batch.step(torch.tensor([pending[s] for s in rows]))
                logged.append(logits)
                for r, s in enumerate(rows):
                    got[s], pending[s] = got[s] + 1, int(logits[r].argmax())
    return logged


@pytest.mark.parametrize(("name", "read_block"), [("gpt2", KVCache.READ_BLOCK), ("gqa-rotary", 8)])
def test_serves_continuous_batch_over_the_static_cache_gives_the_growing_caches_logits(monkeypatch, name, read_block):
    monkeypatch.setattr(KVCache, "READ_BLOCK", read_block)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, block_size=24, n_layers=2, n_heads=4, d_model=32, d_ff=64, **CONFIGS[name])
    model = Transformer(config).eval()
    static = serve_logits(model, KVCache, monkeypatch)
    growing = serve_logits(model, GrowingKVCache, monkeypatch)
    assert len(static) == len(growing) > 30
    for s, g in zip(static, growing):
        torch.testing.assert_close(s, g, rtol=0, atol=TOLERANCE)


@torch.inference_mode()
def test_a_decoding_step_has_the_same_shapes_at_every_step():
    """What compiling and capturing need: the keys and values attention reads, and its mask, keep their
    shapes from step to step within a block of columns, and always where the cache is read whole (the
    growing cache's grew by one column each step)."""
    model = make_model("local-window")
    shapes = []
    block = model.decoder.blocks[0].attn
    original = block._explicit

    def recording(q, k, v, mask, dropout):
        shapes.append((tuple(k.shape), tuple(v.shape), tuple(mask.allowed.shape)))
        return original(q, k, v, mask, dropout)

    block._explicit = recording
    cache = KVCache(model.config, 2, 24, torch.float32)
    cache.read_block = 8  # three blocks of columns
    with block.hook_pattern.register_forward_hook(lambda module, inputs, output: output):  # the explicit path, which the recording wraps
        model.decode(torch.tensor([[5, 6, 7], [8, 9, 10]]), cache=cache)
        for token in range(12):
            model.decode(torch.tensor([[token], [token + 1]]), cache=cache)
        cache.read_block = None  # read whole, as the compiled step reads it
        model.decode(torch.tensor([[1], [2]]), cache=cache)
    widths = [k[2] for k, _, _ in shapes]
    assert widths == [8] * 6 + [16] * 7 + [24], widths  # a new shape once a block: up to 8 keys written, up to 16, then whole
    assert all(k == v and k[:2] + k[3:] == (2, 2, 8) and mask == (1, 1, 1, k[2]) for k, v, mask in shapes[1:]), shapes


def test_the_length_mask_hides_unwritten_and_padding_columns():
    mask = AttentionMask.over_cache(torch.tensor([2]), 4)
    assert mask.allowed.tolist() == [[[[True, True, True, False]]]]
    assert mask.positions.tolist() == [[2]]
    padded = AttentionMask.over_cache(torch.tensor([2, 3]), 5, key_padding=torch.tensor([[False, True, True, True], [True, True, True, True]]))
    assert padded.allowed[0, 0].tolist() == [[False, True, True, False, False], [False, True, True, True, False]]
    assert padded.allowed[1, 0].tolist() == [[True, True, True, False, False], [True, True, True, True, False]]
    with pytest.raises(ValueError, match="holds 4 positions"):
        KVCache(make_model("gpt2").config, 1, 4, torch.float32).next_slots(5)
