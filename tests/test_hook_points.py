"""The model's hook points: named, parameterless, free and invisible when unused, each with its documented
shape; reading changes nothing, editing changes what follows; hooks never outlive their `with` block; the
forwards stay small, and nothing outside tfcli/model/ reaches into a model's private attributes."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from unittest import mock

import pytest
import torch

from tfcli.inspect.hooks import Hooks, hook_point, run_with_cache
from tfcli.model.attention import Attention
from tfcli.model.config import ModelConfig
from tfcli.model.hook_point import HookPoint, any_hooked, hook_points
from tfcli.model.layers import MLP
from tfcli.model.transformer import HIDDEN, Block, DecoderInput, Logits, Stack, Transformer

ROOT = Path(__file__).resolve().parents[1]


def tiny(**overrides) -> Transformer:
    torch.manual_seed(0)
    settings = dict(vocab_size=97, block_size=16, n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, d_ff=48)
    return Transformer(ModelConfig(**{**settings, **overrides})).eval()


def test_hook_points_add_no_parameters_and_no_state_dict_keys():
    model = tiny()
    points = hook_points(model)
    assert len(points) == 2 * (6 + 5 + 2) + 1 + 4  # per block: 6 of its own, 5 attention, 2 MLP; the stack's; the model's
    assert all(not list(point.parameters()) and not list(point.buffers()) for point in points.values())
    assert not [key for key in model.state_dict() if "hook" in key]
    assert set(model.state_dict()) == {name for name, _ in model.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_every_hook_point_shows_its_documented_shape(arch):
    model = tiny(arch=arch, positions="rotary" if arch == "decoder" else "learned")
    B, T, S, d, nh, nkv, hs = 2, 5, 7, 32, 4, 2, 8
    ids = torch.randint(0, 97, (B, S if arch != "decoder" else T))
    decoder = DecoderInput(torch.randint(0, 97, (B, T))) if arch != "decoder" else None
    out, cache = run_with_cache(model, ids, decoder=decoder)
    stack = "decoder.blocks.1."
    expected = {
        f"{stack}hook_resid_pre": (B, T, d),
        f"{stack}hook_attn_out": (B, T, d),
        f"{stack}hook_resid_mid": (B, T, d),
        f"{stack}hook_mlp_in": (B, T, d),
        f"{stack}hook_mlp_out": (B, T, d),
        f"{stack}hook_resid_post": (B, T, d),
        f"{stack}attn.hook_q": (B, nh, T, hs),
        f"{stack}attn.hook_k": (B, nkv, T, hs),
        f"{stack}attn.hook_v": (B, nkv, T, hs),
        f"{stack}attn.hook_pattern": (B, nh, T, T),
        f"{stack}attn.hook_z": (B, T, nh, hs),
        f"{stack}mlp.hook_pre": (B, T, 48),
        f"{stack}mlp.hook_post": (B, T, 48),
        "decoder.hook_normalized": (B, T, d),
        "hook_embed": (B, T, d),
        "hook_head_input": (B, T, d),
        "hook_logits": (B, T, 97),
    }
    if arch == "encoder-decoder":
        expected |= {f"{stack}cross_attn.hook_pattern": (B, nh, T, S), f"{stack}cross_attn.hook_k": (B, nkv, S, hs), "encoder.hook_normalized": (B, S, d)}
        expected |= {"hook_pos_embed": (T, d)}  # learned positions, the same for every row
    for name, shape in expected.items():
        assert tuple(cache[name].shape) == shape, name
    assert set(cache) == set(hook_points(model)) - ({"hook_pos_embed"} if arch == "decoder" else set())  # rotary: none added
    torch.testing.assert_close(cache["hook_logits"], out.logits)
    torch.testing.assert_close(cache["decoder.hook_normalized"], model.decoder.norm(cache[f"{stack}hook_resid_post"]))
    torch.testing.assert_close(cache[f"{stack}attn.hook_pattern"].sum(-1), torch.ones(B, nh, T))


def test_reading_changes_nothing_and_an_edit_changes_what_follows():
    model = tiny()
    ids = torch.randint(0, 97, (2, 9))
    with torch.inference_mode():
        plain = model(ids).logits
        read, _ = run_with_cache(model, ids)
        torch.testing.assert_close(read.logits, plain, rtol=0, atol=1e-5)  # the patterns' explicit path: the same numbers
        with Hooks() as hooks:
            hooks.edit(hook_point(model, "decoder.blocks.1.hook_resid_post"), torch.zeros_like)
            blank = model(ids).logits  # every position's stream zeroed before the final norm
        torch.testing.assert_close(blank, model.unembed(model.decoder.norm(torch.zeros(1, 1, 32))).expand_as(blank))
        with Hooks() as hooks:
            hooks.edit_heads(model.decoder, 0, lambda z: z[:, :, 1].zero_())  # head 1 of layer 0 knocked out
            ablated = model(ids).logits
        assert (ablated - plain).abs().max() > 1e-4
        assert torch.equal(model(ids).logits, plain)  # gone with its block


def test_hooks_are_removed_when_the_block_ends_even_on_an_error():
    model = tiny()
    with pytest.raises(RuntimeError, match="boom"), Hooks() as hooks:
        hooks.read(model.decoder.blocks[0].hook_resid_pre)
        hooks.attention_patterns(model)
        assert any_hooked()
        raise RuntimeError("boom")
    assert not any_hooked()
    assert not any(point.hooked for point in hook_points(model).values())
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


def test_attention_takes_the_fused_path_unless_its_pattern_is_hooked():
    model = tiny()
    ids = torch.randint(0, 97, (1, 6))
    with mock.patch.object(Attention, "_explicit", autospec=True, side_effect=Attention._explicit) as explicit:
        model(ids)
        assert explicit.call_count == 0
        with Hooks() as hooks:
            hooks.read(model.decoder.blocks[1].attn.hook_pattern)
            model(ids)
        assert explicit.call_count == 1  # that attention only


def test_a_hook_point_is_an_identity_and_counts_its_hooks():
    point = HookPoint()
    x = torch.randn(3)
    assert point(x) is x and not point.hooked
    with point.register_forward_hook(lambda module, args, output: output + 1):
        assert point.hooked and any_hooked()
        torch.testing.assert_close(point(x), x + 1)
    assert not point.hooked and not any_hooked()
    with pytest.raises(KeyError, match="not a hook point"):
        hook_point(tiny(), "decoder.blocks.9.hook_resid_pre")


def test_the_forwards_take_at_most_five_parameters():
    for forward in (Transformer.forward, Stack.forward):
        parameters = [p for p in inspect.signature(forward).parameters if p != "self"]
        assert len(parameters) <= 5, (forward.__qualname__, parameters)
    assert "need_weights" not in inspect.signature(Attention.forward).parameters
    assert len(inspect.signature(Block.forward).parameters) <= 5 and len(inspect.signature(MLP.forward).parameters) == 2
    model = tiny()
    scored = torch.zeros(1, 6, dtype=torch.bool)
    scored[0, 2] = True
    ids = torch.randint(0, 97, (1, 6))
    assert model(ids, head=Logits(at=scored)).logits.shape == (1, 97)
    assert model(ids, head=HIDDEN).logits is None


def _private_model_names() -> set[str]:
    """Every single-underscore attribute the model's own classes define (methods and class attributes)."""
    from tfcli.model import attention, layers, transformer

    names: set[str] = set()
    for module in (attention, layers, transformer):
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__:
                names |= {name for name in vars(cls) if name.startswith("_") and not name.startswith("__")}
    return names


def test_nothing_outside_the_model_touches_a_private_model_attribute():
    private = _private_model_names()
    assert {"_embed", "_pooled", "_vocabulary_loss", "_explicit"} <= private
    patterns = [
        re.compile(r"\b\w*model\w*\._(?!_)\w+"),  # model._x, self.model._x, checkpoint.model._x, base_model._x
        re.compile(r"\.(" + "|".join(sorted(private)) + r")\b"),  # a private name of the model's classes on anything
        re.compile(r"getattr\(\s*\w*model\w*\s*,\s*[\"']_(?!_)"),  # the same through getattr
    ]
    found = []
    for path in sorted((ROOT / "tfcli").rglob("*.py")):
        if path.is_relative_to(ROOT / "tfcli" / "model"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if any(pattern.search(line) for pattern in patterns):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
    assert patterns[0].search("x = checkpoint.model._head_input(h)") and not patterns[0].search("model.__dict__")
