"""The model's hook points: named, parameterless, free and invisible when unused, each with its documented
shape; every name TransformerLens also has holds what TransformerLens's holds (an imported GPT-2 and a
grouped-query Llama, run by both); reading changes nothing, editing changes what follows; hooks never outlive
their `with` block; the forwards stay small, and nothing outside tfcli/model/ reaches into a model's private
attributes."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import missing_tool
from tfcli.checkpoint import load_checkpoint
from tfcli.hf import import_hf
from tfcli.inspect.hooks import Hooks, hook_point, run_with_cache
from tfcli.model.attention import Attention
from tfcli.model.config import ModelConfig
from tfcli.model.hook_point import HookPoint, any_hooked, hook_points
from tfcli.model.layers import MLP
from tfcli.model.transformer import HIDDEN, Block, DecoderInput, Logits, Stack, Transformer
from tfcli.tokenizer.core import TextTokenizer

ROOT = Path(__file__).resolve().parents[1]


def tiny(**overrides) -> Transformer:
    torch.manual_seed(0)
    settings = dict(vocab_size=97, block_size=16, n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, d_ff=48)
    return Transformer(ModelConfig(**{**settings, **overrides})).eval()


def test_hook_points_add_no_parameters_and_no_state_dict_keys():
    model = tiny()
    points = hook_points(model)
    assert len(points) == 2 * (6 + 6 + 2) + 1 + 4  # per block: 6 of its own, 6 attention, 2 MLP; the stack's; the model's
    assert len(hook_points(tiny(positions="rotary", activation="swiglu"))) == len(points) + 2 * (2 + 1)  # hook_rot_q/k, hook_pre_linear
    assert all(not list(point.parameters()) and not list(point.buffers()) for point in points.values())
    assert not [key for key in model.state_dict() if "hook" in key]
    assert set(model.state_dict()) == {name for name, _ in model.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_every_hook_point_shows_its_documented_shape(arch):
    decoder_only = arch == "decoder"
    model = tiny(arch=arch, positions="rotary" if decoder_only else "learned", activation="swiglu" if decoder_only else "gelu")
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
        f"{stack}attn.hook_q": (B, T, nh, hs),
        f"{stack}attn.hook_k": (B, T, nkv, hs),
        f"{stack}attn.hook_v": (B, T, nkv, hs),
        f"{stack}attn.hook_attn_scores": (B, nh, T, T),
        f"{stack}attn.hook_pattern": (B, nh, T, T),
        f"{stack}attn.hook_z": (B, T, nh, hs),
        f"{stack}mlp.hook_pre": (B, T, 48),
        f"{stack}mlp.hook_post": (B, T, 48),
        "decoder.hook_normalized": (B, T, d),
        "hook_embed": (B, T, d),
        "hook_head_input": (B, T, d),
        "hook_logits": (B, T, 97),
    }
    if decoder_only:  # rotary and SwiGLU
        expected |= {f"{stack}attn.hook_rot_q": (B, T, nh, hs), f"{stack}attn.hook_rot_k": (B, T, nkv, hs), f"{stack}mlp.hook_pre_linear": (B, T, 48)}
    else:
        expected |= {f"{stack}cross_attn.hook_pattern": (B, nh, T, S), f"{stack}cross_attn.hook_k": (B, S, nkv, hs), "encoder.hook_normalized": (B, S, d)}
        expected |= {f"{stack}cross_attn.hook_q": (B, T, nh, hs), "hook_pos_embed": (B, T, d)}  # learned positions, one row per text
    for name, shape in expected.items():
        assert tuple(cache[name].shape) == shape, name
    assert set(cache) == set(hook_points(model)) - ({"hook_pos_embed"} if arch == "decoder" else set())  # rotary: none added
    torch.testing.assert_close(cache["hook_logits"], out.logits)
    torch.testing.assert_close(cache["decoder.hook_normalized"], model.decoder.norm(cache[f"{stack}hook_resid_post"]))
    torch.testing.assert_close(cache[f"{stack}attn.hook_pattern"].sum(-1), torch.ones(B, nh, T))
    torch.testing.assert_close(cache[f"{stack}attn.hook_attn_scores"].softmax(-1), cache[f"{stack}attn.hook_pattern"])
    assert cache[f"{stack}attn.hook_attn_scores"][:, :, 0, 1:].isneginf().all()  # the causal mask: -inf, before the softmax
    torch.testing.assert_close(cache[f"{stack}hook_mlp_in"], cache[f"{stack}hook_resid_mid"])  # before the MLP's norm
    if decoder_only:
        rotated = model.rotary(cache[f"{stack}attn.hook_q"], 0)  # (B, T, nh, hs)
        torch.testing.assert_close(cache[f"{stack}attn.hook_rot_q"], rotated)
        assert not torch.allclose(cache[f"{stack}attn.hook_q"][:, 1:], rotated[:, 1:])  # position 0 is not turned


# tfcli's names that TransformerLens does not have: its ln_final.hook_normalized is taken before the norm's
# weights, and it hooks neither the head's input nor the logits by these names.
TFCLI_ONLY = {"decoder.hook_normalized", "hook_head_input", "hook_logits"}


def _per_block(*names: str) -> set[str]:
    return {f"blocks.{layer}.{name}" for layer in range(2) for name in names}


BLOCK_NAMES = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_in", "hook_mlp_out", "hook_resid_post")
ATTENTION_NAMES = ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z")


def _save_with_tokenizer(hf, folder: Path, tokenizer_dir: Path) -> None:
    with torch.no_grad():  # non-zero biases and norms, so a wrong place cannot hide
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "ln_" in name or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(str(folder), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, folder / name)


# TransformerLens runs in a process of its own: importing it loads sentencepiece, whose OpenMP runtime would
# keep this process from loading tfcli's C code in the tests after these.
TRANSFORMER_LENS_RUN = """
import json, sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformer_lens.model_bridge import TransformerBridge  # 3.x (the version SAELens allows) exports it here only

folder, ids, out = Path(sys.argv[1]), torch.tensor(json.loads(sys.argv[2])), Path(sys.argv[3])
bridge = TransformerBridge.boot_transformers(str(folder), device="cpu")
bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)  # its hook names on HF's weights as they are
bridge.set_use_hook_mlp_in(True)
with torch.no_grad():
    logits, cache = bridge.run_with_cache(ids)
save_file({name: cache[name].clone() for name in cache.keys()}, str(out / "cache.safetensors"))
save_file({"logits": logits.contiguous()}, str(out / "logits.safetensors"))
(out / "names.json").write_text(json.dumps(sorted(bridge.hook_dict)))
"""


def _transformer_lens(folder: Path, ids: torch.Tensor, out: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor], set[str]]:
    """TransformerLens's bridge over the HF folder, run offline on ids: (logits, the activations it hooked by
    name, every hook name it defines)."""
    if importlib.util.find_spec("transformer_lens") is None:
        missing_tool("could not import transformer_lens, the reference for hook names and shapes")
    out.mkdir()
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # everything comes from `folder`
    args = [sys.executable, "-c", TRANSFORMER_LENS_RUN, str(folder), json.dumps(ids.tolist()), str(out)]
    done = subprocess.run(args, env=offline, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    names = set(json.loads((out / "names.json").read_text()))
    return load_file(out / "logits.safetensors")["logits"], load_file(out / "cache.safetensors"), names


def _compare_with_transformer_lens(folder: Path, tmp_path: Path, ids: torch.Tensor) -> set[str]:
    """tfcli's model imported from the HF `folder` by its own import, and TransformerLens's over the same
    folder, both over `ids`: every hook name both define fires in both or in neither, with the same shape
    and close values. Returns the names compared."""
    import_hf(folder, tmp_path / "run")
    ours = load_checkpoint(tmp_path / "run").model
    with torch.no_grad():
        out, mine = run_with_cache(ours, ids)
    logits, theirs, defined = _transformer_lens(folder, ids, tmp_path / "transformer-lens")
    names = {name: name.removeprefix("decoder.") for name in hook_points(ours)}  # decoder.blocks.0.x -> blocks.0.x
    assert {name for name, theirs_name in names.items() if theirs_name not in defined} == TFCLI_ONLY
    compared = set()
    for name, theirs_name in names.items():
        if theirs_name not in defined:
            continue
        assert (name in mine) == (theirs_name in theirs), name
        if name in mine:
            assert mine[name].shape == theirs[theirs_name].shape, name
            torch.testing.assert_close(mine[name], theirs[theirs_name], atol=1e-4, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
            compared.add(theirs_name)
    torch.testing.assert_close(out.logits, logits, atol=1e-4, rtol=1e-4)
    return compared


def test_every_name_transformer_lens_also_has_holds_the_same_on_gpt2(tmp_path, trained_tokenizer):
    transformers = pytest.importorskip("transformers", reason="could not import transformers")
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=32, vocab_size=vocab)).eval()
    _save_with_tokenizer(hf, tmp_path / "gpt2", trained_tokenizer)
    compared = _compare_with_transformer_lens(tmp_path / "gpt2", tmp_path, torch.randint(0, vocab, (2, 9)))
    assert compared == {"hook_embed", "hook_pos_embed"} | _per_block(*BLOCK_NAMES, *ATTENTION_NAMES, "mlp.hook_pre", "mlp.hook_post")


def test_every_name_transformer_lens_also_has_holds_the_same_on_a_grouped_query_llama(tmp_path, trained_tokenizer):
    transformers = pytest.importorskip("transformers", reason="could not import transformers")
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    _save_with_tokenizer(hf, tmp_path / "llama", trained_tokenizer)
    compared = _compare_with_transformer_lens(tmp_path / "llama", tmp_path, torch.randint(0, vocab, (2, 9)))
    rotary_swiglu = ("attn.hook_rot_q", "attn.hook_rot_k", "mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post")
    assert compared == {"hook_embed"} | _per_block(*BLOCK_NAMES, *ATTENTION_NAMES, *rotary_swiglu)  # rotary: no hook_pos_embed in either


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


@pytest.mark.parametrize("point", ["hook_attn_scores", "hook_pattern"])
def test_attention_takes_the_fused_path_unless_its_scores_or_pattern_are_hooked(point):
    model = tiny()
    ids = torch.randint(0, 97, (1, 6))
    with mock.patch.object(Attention, "_explicit", autospec=True, side_effect=Attention._explicit) as explicit:
        model(ids)
        assert explicit.call_count == 0
        with Hooks() as hooks:
            hooks.read(getattr(model.decoder.blocks[1].attn, point))
            model(ids)
        assert explicit.call_count == 1  # that attention only


def test_an_edit_of_the_mlp_input_changes_what_the_mlp_reads_not_the_stream():
    model = tiny()
    ids = torch.randint(0, 97, (1, 6))
    block = model.decoder.blocks[0]
    with torch.inference_mode(), Hooks() as hooks:
        mid, out, post = hooks.read(block.hook_resid_mid), hooks.read(block.hook_mlp_out), hooks.read(block.hook_resid_post)
        hooks.edit(block.hook_mlp_in, lambda x: x.zero_())  # in place, as TransformerLens's copy allows
        model(ids)
        torch.testing.assert_close(out[0], block.mlp(block.mlp_norm(torch.zeros(1, 6, 32))).expand(1, 6, 32))
    assert mid[0].abs().max() > 0  # the stream itself kept its values
    torch.testing.assert_close(post[0], mid[0] + out[0])


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
