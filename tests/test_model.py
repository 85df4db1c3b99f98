"""The model: one attention module whose fast and explicit paths agree, a KV cache that reproduces the
full forward pass, positions and norms as the papers define them, and configs validated up front."""

from __future__ import annotations

import math

import pytest
import torch

from tfcli.errors import TfcliError
from tfcli.inspect.hooks import Hooks
from tfcli.model.attention import Attention, AttentionMask, KVCache
from tfcli.model.config import PRESETS, ModelConfig, preset
from tfcli.model.layers import sinusoidal_table
from tfcli.model.transformer import HIDDEN, DecoderInput, Transformer

LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=97, block_size=32, n_layers=2, n_heads=4, d_model=32, d_ff=64)
    return ModelConfig(**{**base, **overrides})


def _padding(B: int, S: int) -> torch.Tensor:
    padding = torch.ones(B, S, dtype=torch.bool)
    padding[0, -3:] = False  # right padding in the first sequence
    return padding


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["none", "causal", "padding", "causal+padding", "causal+offset", "cross+padding"])
def test_fast_and_explicit_attention_agree(layout, kind):
    torch.manual_seed(0)
    config = tiny(n_kv_heads=LAYOUTS[layout])
    attention = Attention(config, causal="causal" in kind, cross=kind.startswith("cross")).eval()
    B, T, S = 2, 7, 9
    x = torch.randn(B, T, config.d_model)
    memory = torch.randn(B, S, config.d_model) if kind.startswith("cross") else None
    keys = S if memory is not None else T
    padding = _padding(B, keys) if "padding" in kind else None
    if kind == "causal+offset":  # queries 5..11 over 12 keys, as with a cache
        mask = AttentionMask.build(T, T + 5, causal=True, offset=5)
        cached = torch.randn(B, T + 5, config.d_model)
        attention = Attention(config, causal=True, cross=True).eval()  # keys from another sequence, causal mask
        memory, keys = cached, T + 5
    else:
        mask = AttentionMask.build(T, keys, causal="causal" in kind, key_padding=padding)
    fast = attention(x, mask, memory=memory)
    seen = []
    with attention.hook_pattern.register_forward_hook(lambda module, args, output: seen.append(output)):
        explicit = attention(x, mask, memory=memory)
    (weights,) = seen
    assert (fast - explicit).abs().max().item() < 1e-5
    assert weights.shape == (B, config.n_heads, T, keys)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, config.n_heads, T))
    allowed = mask.dense(T, keys, x.device)
    if allowed is not None:
        assert (weights.masked_select(~allowed.expand_as(weights)) == 0).all()  # masked keys get exactly 0


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
def test_whole_model_paths_agree(arch, positions):
    torch.manual_seed(0)
    model = Transformer(tiny(arch=arch, positions=positions, n_kv_heads=2)).eval()
    ids = torch.randint(0, 97, (2, 11))
    padding = _padding(2, 11)
    kwargs = {"decoder": DecoderInput(ids[:, :6], padding[:, :6])} if arch == "encoder-decoder" else {}
    fast = model(ids, padding, **kwargs)
    with Hooks() as hooks:
        patterns = hooks.attention_patterns(model)
        explicit = model(ids, padding, **kwargs)
    assert (fast.logits - explicit.logits).abs().max().item() < 1e-5
    n_layers = 2
    names = {"decoder": ["decoder"], "encoder": ["encoder"], "encoder-decoder": ["encoder", "decoder", "cross"]}[arch]
    assert sorted(patterns) == sorted(names)
    assert all(len(patterns[n]) == n_layers for n in names)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
def test_cached_decoding_equals_the_full_forward_pass(layout, positions):
    torch.manual_seed(0)
    config = tiny(positions=positions, n_kv_heads=LAYOUTS[layout])
    model = Transformer(config).eval()
    ids = torch.randint(0, 97, (2, 12))
    full = model(ids).logits
    cache = KVCache(config, batch=2, capacity=12, dtype=torch.float32)
    steps = [model(ids[:, :5], cache=cache).logits]  # the prompt at once, then one token at a time
    steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 12)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < 1e-5
    assert cache.keys.shape[2] == LAYOUTS[layout]  # GQA/MQA cache only their kv heads
    assert cache.length == 12


def test_cached_encoder_decoder_computes_cross_keys_once():
    torch.manual_seed(0)
    config = tiny(arch="encoder-decoder", n_kv_heads=2)
    model = Transformer(config).eval()
    source, target = torch.randint(0, 97, (2, 9)), torch.randint(0, 97, (2, 6))
    full = model(source, decoder=DecoderInput(target)).logits
    memory = model.encode(source)
    cache = KVCache(config, batch=2, capacity=6, dtype=torch.float32)
    steps = [model(source, decoder=DecoderInput(target[:, t : t + 1], memory=memory), cache=cache).logits for t in range(6)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < 1e-5
    assert all(kv is not None and kv[0].shape == (2, 2, 9, 8) for kv in cache.cross)


def test_sinusoidal_table_is_vaswanis():
    table = sinusoidal_table(50, 16)
    pos, i = 7, 3
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert table[0, 0::2].abs().max().item() == 0 and (table[0, 1::2] == 1).all()


def test_rotary_attention_depends_only_on_relative_position():
    torch.manual_seed(0)
    config = tiny(positions="rotary")
    rotary = Transformer(config).rotary
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    near = (rotary(q, 3) * rotary(k, 1)).sum()
    far = (rotary(q, 13) * rotary(k, 11)).sum()
    assert near.item() == pytest.approx(far.item(), abs=1e-5)


def test_post_norm_blocks_end_normalised():
    torch.manual_seed(0)
    model = Transformer(tiny(norm_placement="post", bias=False)).eval()
    hidden = model(torch.randint(0, 97, (1, 8)), head=HIDDEN).hidden
    assert hidden.mean(-1).abs().max().item() < 1e-5
    assert hidden.std(-1, unbiased=False).sub(1).abs().max().item() < 1e-3


@pytest.mark.parametrize(
    "options",
    [
        dict(activation="swiglu", norm="rmsnorm", bias=False),
        dict(activation="relu", tie_embeddings=False),
        dict(activation="relu2", zero_init_proj=True),
        dict(positions="rotary", norm="rmsnorm", bias=False, qk_norm=True, activation="relu2", zero_init_proj=True, logit_softcap=5.0, tie_embeddings=False),
        dict(activation="gelu_tanh", dropout=0.1),
        dict(arch="encoder", n_classes=3),
        dict(n_classes=2),
    ],
)
def test_variants_train(options):
    torch.manual_seed(0)
    model = Transformer(tiny(**options))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 97, (4, 16))
    losses = []
    for _ in range(25):
        out = model(ids)
        loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))
        if out.class_logits is not None:
            loss = loss + torch.nn.functional.cross_entropy(out.class_logits, torch.arange(4) % out.class_logits.shape[1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_tied_embeddings_share_one_tensor():
    model = Transformer(tiny())
    assert model.lm_head.weight is model.tok_emb.weight
    assert Transformer(tiny(tie_embeddings=False)).lm_head.weight is not Transformer(tiny(tie_embeddings=False)).tok_emb.weight


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_estimate_matches_the_model(name):
    config = preset(name)
    with torch.device("meta"):
        model = Transformer(config)
    assert model.parameter_count() == config.parameter_estimate()


def test_gpt2_small_has_the_published_parameter_count():
    assert preset("gpt2-small").parameter_estimate() == 124_439_808


def test_residual_projections_are_scaled():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=100, n_layers=8, d_model=256, n_heads=4))
    std = model.decoder.blocks[0].attn.out.weight.std().item()
    assert std == pytest.approx(0.02 / math.sqrt(16), rel=0.1)
    assert model.decoder.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=30, n_heads=4), "divisible by n_heads"),
        (dict(d_model=30, n_heads=4, d_head=1 << 13), "d_head = 8,192 is absurd"),
        (dict(n_kv_heads=3), "must divide n_heads"),
        (dict(d_model=1 << 20), "absurd"),
        (dict(n_layers=1000, d_model=16384, n_heads=16), "parameters"),
        (dict(arch="transformer"), "arch must be one of"),
        (dict(dropout=1.0), "dropout"),
        (dict(positions="rotary", d_model=36, n_heads=4), "even head size"),
        (dict(n_decoder_layers=3), "n_decoder_layers is for an encoder-decoder"),
        (dict(arch="encoder", n_decoder_layers=3), "an encoder's depth is n_layers"),
    ],
)
def test_bad_configs(overrides, message):
    with pytest.raises(TfcliError, match=message):
        tiny(**overrides)


def test_config_json_round_trip_and_unknown_keys():
    config = tiny(arch="encoder-decoder", n_kv_heads=1)
    assert ModelConfig.from_json(config.to_json()) == config
    with pytest.raises(TfcliError, match="unknown key 'n_embd'"):
        ModelConfig.from_json({**config.to_json(), "n_embd": 3})
    with pytest.raises(TfcliError, match="unknown model setting"):
        preset("tiny", width=3)


def test_too_long_sequences_are_refused():
    model = Transformer(tiny(block_size=8))
    with pytest.raises(TfcliError, match="longer than the model's block size"):
        model(torch.zeros(1, 9, dtype=torch.long))


# Gemma 3's options: local layers (a window and rotary tables of their own), norms on each sublayer's output,
# GeGLU, scaled embeddings, its own score scale, QK-norm.
GEMMA3 = dict(
    positions="rotary",
    norm="rmsnorm",
    activation="geglu",
    bias=False,
    qk_norm=True,
    post_norms=True,
    scale_embeddings=True,
    attn_scale=24**-0.5,
    sliding_window=4,
    local_layers=[0],
    rope_base=1e6,
    rope_local_base=1e4,
)

PRETRAINED_OPTIONS = {
    "qwen2 biases": dict(activation="swiglu", norm="rmsnorm", positions="rotary", bias=False, qkv_bias=True, n_kv_heads=2),
    "llama mlp bias apart": dict(activation="swiglu", norm="rmsnorm", bias=True, mlp_bias=False),
    "bert parts": dict(arch="encoder", norm_placement="post", type_vocab_size=2, embedding_norm=True, pooler=True, n_classes=3),
    "llama3 rope": dict(positions="rotary", rope_scaling={"kind": "llama3", "factor": 8.0, "original_context": 16}),
    "qwen3 qk norm, wide heads": dict(activation="swiglu", norm="rmsnorm", positions="rotary", bias=False, qk_norm=True, d_head=16, n_kv_heads=2),
    "qk norm, narrow heads, layernorm": dict(qk_norm=True, d_head=4),  # LayerNorms with biases
    "phi3 longrope": dict(
        positions="rotary",
        rope_scaling={"kind": "longrope", "factor": 4.0, "original_context": 32, "short_factor": [1.0, 1.5, 3.0, 7.0], "attention_factor": 1.2},
    ),
    "gemma3": dict(GEMMA3, d_head=16, n_kv_heads=2, rope_scaling={"kind": "linear", "factor": 2.0}),
    "sandwich norms, layernorm, geglu with biases": dict(post_norms=True, activation="geglu", scale_embeddings=True, attn_scale=0.3),
}


@pytest.mark.parametrize("options", PRETRAINED_OPTIONS.values(), ids=PRETRAINED_OPTIONS.keys())
def test_the_options_pretrained_models_bring_are_counted_and_train(options):
    config = ModelConfig.from_json({**tiny().to_json(), **options})
    assert ModelConfig.from_json(config.to_json()) == config
    torch.manual_seed(0)
    model = Transformer(config)
    assert model.parameter_count() == config.parameter_estimate()
    ids = torch.randint(0, 97, (2, 12))
    out = model(ids, torch.ones(2, 12, dtype=torch.bool))
    loss = out.logits.float().logsumexp(-1).mean() + (out.class_logits.sum() if out.class_logits is not None else 0)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_qk_norm_normalises_each_heads_query_before_rotary_and_wide_heads_decode_as_the_full_pass():
    torch.manual_seed(0)
    config = tiny(positions="rotary", norm="rmsnorm", activation="swiglu", qk_norm=True, d_head=16, n_kv_heads=2)
    model = Transformer(config).eval()
    assert model.decoder.blocks[0].attn.qkv.weight.shape == (4 * 16 + 2 * 2 * 16, 32) and model.decoder.blocks[0].attn.out.weight.shape == (32, 64)
    ids = torch.randint(0, 97, (2, 12))
    attention = model.decoder.blocks[0].attn
    with Hooks() as hooks:
        queries, outputs = hooks.read(attention.hook_rot_q), hooks.read(attention.hook_z)
        hooks.attention_patterns(model)  # read: the explicit path
        explicit = model(ids).logits
    (rotated,), (z,) = queries, outputs
    assert rotated.shape == z.shape == (2, 12, 4, 16)  # (B, T, nh, hs): heads of their own width
    # position 0 is not turned: there the query is q_norm's output, each head at root-mean-square 1
    torch.testing.assert_close(rotated[:, 0].pow(2).mean(-1).sqrt(), torch.ones(2, 4), rtol=0, atol=1e-2)  # (eps aside)
    assert (model(ids).logits - explicit).abs().max().item() < 1e-5  # the fused path and the explicit one
    cache = KVCache(config, batch=2, capacity=12, dtype=torch.float32)
    steps = [model(ids[:, :5], cache=cache).logits] + [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 12)]
    assert (torch.cat(steps, dim=1) - explicit).abs().max().item() < 1e-5
    assert cache.keys.shape == (2, 2, 2, 12, 16)  # (L, B, n_kv, S, hs)
    cross = tiny(arch="encoder-decoder", qk_norm=True, d_head=4)  # every attention has the norms, cross-attention too
    assert Transformer(cross).parameter_count() == cross.parameter_estimate()


def test_a_local_layer_attends_within_its_window_and_decodes_as_the_full_pass():
    torch.manual_seed(0)
    config = tiny(**GEMMA3, n_kv_heads=2)
    model = Transformer(config).eval()
    assert model.decoder.blocks[0].attn.rotary is model.local_rotary and model.decoder.blocks[1].attn.rotary is model.rotary
    assert model.decoder.blocks[0].attn.window == 4 and model.decoder.blocks[1].attn.window is None
    ids = torch.randint(0, 97, (2, 12))
    with Hooks() as hooks:
        patterns = hooks.attention_patterns(model)["decoder"]  # (B, nh, T, S) per layer
        explicit = model(ids).logits
    local, full = patterns
    query, key = torch.arange(12)[:, None], torch.arange(12)[None, :]
    assert (local[..., key <= query - 4] == 0).all() and (local[..., (key > query - 4) & (key <= query)] > 0).all()  # the last 4 positions
    assert (full[..., key <= query] > 0).all()  # the global layer sees the whole context
    assert (model(ids).logits - explicit).abs().max().item() < 1e-5  # the fused path and the explicit one
    cache = KVCache(config, batch=2, capacity=12, dtype=torch.float32)
    steps = [model(ids[:, :5], cache=cache).logits] + [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 12)]
    assert (torch.cat(steps, dim=1) - explicit).abs().max().item() < 1e-5
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids[:1]], dim=1)  # (1, 15): the first row, left-padded
    real = torch.arange(15)[None] >= 3
    padded = model.unembed(model.decode(left, real, positions=(real.long().cumsum(1) - 1).clamp(min=0)))
    assert (padded[:, 3:] - explicit[:1]).abs().max().item() < 1e-5  # a row decodes as it would alone
    from tfcli.checkpoint import model_from_tensors

    rebuilt = model_from_tensors(config, model.state_dict()).eval()  # the local tables are computed again
    torch.testing.assert_close(rebuilt(ids).logits, model(ids).logits, rtol=0, atol=0)
    torch.testing.assert_close(rebuilt.local_rotary.cos, model.local_rotary.cos)


def test_sandwich_norms_geglu_and_scaled_embeddings_compute_gemmas_block():
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = Transformer(tiny(**GEMMA3, norm_eps=1e-12)).eval()  # the sublayers' outputs are small at initialisation: no eps to speak of
    block = model.decoder.blocks[1]
    ids = torch.randint(0, 97, (2, 12))
    with Hooks() as hooks:
        embed, attn_out, mlp_out = hooks.read(model.hook_embed), hooks.read(block.hook_attn_out), hooks.read(block.hook_mlp_out)
        pre, pre_linear, post = hooks.read(block.mlp.hook_pre), hooks.read(block.mlp.hook_pre_linear), hooks.read(block.mlp.hook_post)
        resid_pre, resid_mid = hooks.read(block.hook_resid_pre), hooks.read(block.hook_resid_mid)
        model(ids)
    torch.testing.assert_close(embed[0], model.tok_emb(ids) * math.sqrt(32))
    for out in (attn_out[0], mlp_out[0]):  # each sublayer's output normed before it is added (the norms' weights are 1)
        torch.testing.assert_close(out.pow(2).mean(-1).sqrt(), torch.ones(2, 12), rtol=0, atol=1e-3)
    torch.testing.assert_close(resid_mid[0], resid_pre[0] + attn_out[0])
    torch.testing.assert_close(post[0], F.gelu(pre[0], approximate="tanh") * pre_linear[0])  # GeGLU: tanh GELU on the gate


def test_longrope_divides_each_frequency_by_its_short_factor_and_scales_cos_and_sin():
    from tfcli.model.config import RopeScaling
    from tfcli.model.layers import RotaryEmbedding

    short = (1.0, 2.0, 4.0, 8.0)
    rotary = RotaryEmbedding(8, 16, 10000.0, RopeScaling("longrope", 2.0, original_context=16, short_factor=short, attention_factor=1.5))
    frequencies = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)) / torch.tensor(short)
    angles = torch.arange(16, dtype=torch.float32)[:, None] * frequencies  # (L, hs/2)
    torch.testing.assert_close(rotary.cos, 1.5 * torch.cat([angles, angles], dim=-1).cos())
    torch.testing.assert_close(rotary.sin, 1.5 * torch.cat([angles, angles], dim=-1).sin())


def test_llama3_rope_scaling_keeps_high_frequencies_and_divides_low_ones():
    from tfcli.model.config import RopeScaling
    from tfcli.model.layers import scaled_frequencies

    frequencies = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    scaled = scaled_frequencies(frequencies, RopeScaling("llama3", 8.0, 1.0, 4.0, 64))
    wavelength = 2 * math.pi / frequencies
    assert torch.equal(scaled[wavelength < 16], frequencies[wavelength < 16])  # shorter than 64 / 4: kept
    torch.testing.assert_close(scaled[wavelength > 64], frequencies[wavelength > 64] / 8)  # longer than 64 / 1: divided
    assert torch.equal(scaled_frequencies(frequencies, RopeScaling("linear", 2.0)), frequencies / 2)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(rope_scaling={"kind": "llama3", "factor": 2.0}), "rope_scaling is for rotary positions"),
        (dict(positions="rotary", rope_scaling={"kind": "yarn", "factor": 2.0}), "rope_scaling.kind must be one of linear, llama3"),
        (dict(positions="rotary", rope_scaling={"kind": "linear", "factor": 0.5}), "factor >= 1"),
        (dict(pooler=True), "pooler is BERT's"),
        (dict(type_vocab_size=-1), "type_vocab_size"),
        (dict(d_head=0), "d_head must be at least 1"),
        (dict(positions="rotary", d_head=5), "even head size"),
        (dict(positions="rotary", rope_scaling={"kind": "longrope", "factor": 2.0, "original_context": 32, "short_factor": [1.0]}), "4 positive short_factor"),
        (
            dict(positions="rotary", rope_scaling={"kind": "longrope", "factor": 2.0, "original_context": 16, "short_factor": [1.0] * 4}),
            "up to original_context",
        ),
        (dict(positions="rotary", rope_scaling={"kind": "linear", "factor": 2.0, "attention_factor": 2.0}), "are longrope's"),
        (dict(sliding_window=4), "sliding_window and local_layers go together"),
        (dict(local_layers=[0]), "sliding_window and local_layers go together"),
        (dict(sliding_window=4, local_layers=[2]), "local_layers must be distinct layer numbers from 0 to 1"),
        (dict(sliding_window=4, local_layers=[1, 0]), "in order"),
        (dict(sliding_window=0, local_layers=[0]), "sliding_window must be at least 1"),
        (dict(arch="encoder", sliding_window=4, local_layers=[0]), "sliding_window is for a decoder"),
        (dict(positions="rotary", rope_local_base=1e4), "rope_local_base is the local layers' rotary base"),
        (dict(post_norms=True, norm_placement="post"), "post_norms adds a norm"),
        (dict(attn_scale=0.0), "attn_scale must be positive"),
    ],
)
def test_bad_pretrained_options(overrides, message):
    with pytest.raises(TfcliError, match=message):
        ModelConfig.from_json({**tiny().to_json(), **overrides})


# The modded-nanogpt speedrun's architecture: QK-norm (above), ReLU², output projections that start at zero,
# the logits soft-capped, and a head of its own (untied).
SPEEDRUN = dict(positions="rotary", norm="rmsnorm", bias=False, qk_norm=True, activation="relu2", zero_init_proj=True, logit_softcap=30.0, tie_embeddings=False)


def test_the_speedrun_options_round_trip_are_counted_and_shaped():
    config = tiny(**SPEEDRUN)
    assert ModelConfig.from_json(config.to_json()) == config
    assert preset("tiny", logit_softcap=30).logit_softcap == 30.0  # as --set reads it: a whole number is a float
    model = Transformer(config)
    assert model.parameter_count() == config.parameter_estimate()
    assert model.lm_head.weight is not model.tok_emb.weight  # untied: a head of its own
    assert model.decoder.blocks[0].mlp.fc.weight.shape == (64, 32)  # ReLU² is not gated: d_ff rows, not 2 * d_ff
    out = model(torch.randint(0, 97, (2, 12)))
    assert out.logits.shape == (2, 12, 97)


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_zero_init_proj_starts_every_output_projection_at_zero_and_the_blocks_as_the_identity(arch):
    torch.manual_seed(0)
    model = Transformer(tiny(arch=arch, zero_init_proj=True))
    projections = {name: p for name, p in model.named_parameters() if name.endswith(("attn.out.weight", "mlp.proj.weight"))}
    assert len(projections) == {"decoder": 4, "encoder-decoder": 10}[arch]  # cross-attention's output too
    assert all(bool((p == 0).all()) for p in projections.values())
    assert model.decoder.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)  # the rest as before
    ids = torch.randint(0, 97, (2, 10))
    with Hooks() as hooks:
        first, last = hooks.read(model.decoder.blocks[0].hook_resid_pre), hooks.read(model.decoder.blocks[-1].hook_resid_post)
        out = model(ids, decoder=DecoderInput(ids)) if arch == "encoder-decoder" else model(ids)
    torch.testing.assert_close(last[0], first[0], rtol=0, atol=0)  # each sublayer adds zero
    out.logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for name, p in projections.items() if name.startswith("decoder"))
    scaled = Transformer(tiny(arch=arch)).decoder.blocks[0].mlp.proj.weight.std().item()
    assert scaled == pytest.approx(0.02 / math.sqrt(2 * {"decoder": 2, "encoder-decoder": 4}[arch]), rel=0.15)  # GPT-2's without it


def test_relu2_squares_relus_output():
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = Transformer(tiny(activation="relu2")).eval()
    mlp = model.decoder.blocks[1].mlp
    with Hooks() as hooks:
        pre, post = hooks.read(mlp.hook_pre), hooks.read(mlp.hook_post)
        model(torch.randint(0, 97, (2, 12)))
    assert pre[0].shape == post[0].shape == (2, 12, 64)
    torch.testing.assert_close(post[0], F.relu(pre[0]) ** 2, rtol=0, atol=0)
    assert bool((pre[0] < 0).any()) and not torch.equal(post[0], F.relu(pre[0]))  # negatives read, and squared
    x = torch.tensor([[-2.0, -0.5, 0.0, 0.5, 3.0]])
    mlp.fc.weight.data, mlp.proj.weight.data = torch.eye(64, 32), torch.eye(32, 64)
    mlp.fc.bias.data.zero_(), mlp.proj.bias.data.zero_()
    h = torch.zeros(1, 1, 32)
    h[0, 0, :5] = x
    assert mlp(h)[0, 0, :5].tolist() == [0.0, 0.0, 0.0, 0.25, 9.0]


def _capped_and_plain(cap: float, **options) -> tuple[Transformer, Transformer]:
    """One model with its logits soft-capped at `cap`, the same weights without the cap; logits large enough
    (several times the cap) that tanh bends them."""
    torch.manual_seed(0)
    capped = Transformer(tiny(logit_softcap=cap, **options)).eval()
    with torch.no_grad():
        capped.lm_head.weight.mul_(30.0)
    plain = Transformer(tiny(**options)).eval()
    plain.load_state_dict(capped.state_dict())
    return capped, plain


@pytest.mark.parametrize("options", [dict(), dict(positions="rotary", tie_embeddings=False, activation="relu2")], ids=["tied", "speedrun"])
def test_the_soft_cap_applies_on_every_path_from_hidden_states_to_logits(options):
    """forward, cached decoding (generate's window), serve's slots, the loss and the logit difference of
    patching all give cap * tanh(plain / cap) of the uncapped model's logits."""
    import torch.nn.functional as F

    from tfcli.generate.window import DecoderWindow, Vocabulary
    from tfcli.inspect.recording import logit_difference
    from tfcli.model.transformer import Loss
    from tfcli.serve.slots import SlotBatch

    cap = 2.0
    model, plain = _capped_and_plain(cap, **options)
    ids = torch.randint(0, 97, (2, 12))

    def capped(logits: torch.Tensor) -> torch.Tensor:
        return cap * torch.tanh(logits / cap)

    with torch.no_grad():
        expected = capped(plain(ids).logits)  # (2, 12, vocab)
        assert plain(ids).logits.abs().max() > 3 * cap and (expected - plain(ids).logits).abs().max() > cap  # the cap bites
        torch.testing.assert_close(model(ids).logits, expected)  # forward
        assert model(ids).logits.abs().max() <= cap
        vocab = Vocabulary(limit=97, eos_id=None, pad_id=0, suppressed=[])
        window = DecoderWindow(model, 2, vocab)  # generate: the prompt, then a token at a time through the KV cache
        steps = [window.start(ids[:, :5], torch.ones(2, 5, dtype=torch.bool))]
        steps += [window.push(ids[:, t]) for t in range(5, 12)]
        torch.testing.assert_close(torch.stack(steps, dim=1), expected[:, 4:])
        slots = SlotBatch(model, 2, vocab)  # serve: a prefill, then a step for every row
        cache, first = slots.prefill([ids[0, :5].tolist(), ids[1, :5].tolist()])
        slots.join(ids[0, :5].tolist(), cache, 0), slots.join(ids[1, :5].tolist(), cache, 1)
        served = [first] + [slots.step(ids[:, t]) for t in range(5, 12)]
        torch.testing.assert_close(torch.stack(served, dim=1), expected[:, 4:])
        hidden = model(ids, head=HIDDEN).hidden[:, -1]  # patching's logit difference
        torch.testing.assert_close(logit_difference(model, hidden, 3, 5), expected[:, -1, 3] - expected[:, -1, 5])
    targets = torch.randint(0, 97, (2, 12))
    targets[0, :3] = -100  # ignored
    want = F.cross_entropy(expected.flatten(0, 1), targets.flatten(), reduction="sum", label_smoothing=0.1)
    torch.testing.assert_close(model(ids, head=Loss(targets, 0.1)).loss, want)  # the loss, through vocabulary_loss's softcap
    model.train()
    model(ids, head=Loss(targets)).loss.backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_the_accelerated_model_scores_the_capped_logits_with_the_fused_loss():
    import torch.nn.functional as F

    from tfcli.accel import accelerate, fused_loss
    from tfcli.model.transformer import Loss

    model, plain = _capped_and_plain(2.0)
    accelerate(model), accelerate(plain)
    assert isinstance(model.vocabulary_loss, fused_loss.VocabularyLoss)  # it takes the cap (tests/test_loss.py)
    ids, targets = torch.randint(0, 97, (2, 12)), torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        want = F.cross_entropy((2.0 * torch.tanh(plain(ids).logits / 2.0)).flatten(0, 1), targets.flatten(), reduction="sum")
        torch.testing.assert_close(model(ids, head=Loss(targets)).loss, want)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(logit_softcap=0.0), "logit_softcap must be a positive number, not 0.0"),
        (dict(logit_softcap=-30.0), "logit_softcap must be a positive number"),
        (dict(activation="relu3"), "activation must be one of gelu, gelu_tanh, relu, relu2, swiglu, geglu"),
        (dict(zero_init_proj="yes"), "zero_init_proj"),
    ],
)
def test_bad_speedrun_options(overrides, message):
    with pytest.raises(TfcliError, match=message):
        ModelConfig.from_json({**tiny().to_json(), **overrides})
