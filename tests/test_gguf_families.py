"""GGUF for the model families past Llama and GPT-2: a Qwen3 run (a norm on each head's q and k, heads wider
than d_model / n_heads) goes out as llama.cpp's qwen3 and a Phi-3 run with longrope as its phi3 (fused qkv and
gate/up, rope_factors_short/long, the attention factor), checked by the real llama.cpp (llama-cpp-python):
the same logits, the same greedy ids; each comes back in as the same model.

Then every option: for each family's run (imported from a tiny transformers model, or a tfcli preset) and for
each ModelConfig field set on its own, the export either refuses in one line naming the field, or writes a file
that llama.cpp runs as tfcli does and that import gives back with that field unchanged. Nothing is written wrong.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TINY_TEXT
from tests.gguf_files import gguf_copy
from tests.test_gguf import (
    PROMPT,
    _export,
    _llama,
    _llama_cpp,
    _llama_greedy,
    _llama_logits,
    _random_run,
    _suppressed,
    _tfcli_greedy,
    _tfcli_logits,
    ggml_gelu,
)
from tfcli.checkpoint import load_checkpoint
from tfcli.model.config import ModelConfig, RopeScaling, preset
from tfcli.tokenizer.core import TextTokenizer

gguf = pytest.importorskip("gguf")

LLAMA = dict(positions="rotary", norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=False)
SHORT_FACTORS = (1.0, 1.3, 2.5, 4.0, 1.1, 1.7, 3.0, 6.0)  # one per rotary frequency of a 16-wide head
FAMILIES = {
    # Qwen3: q/k norms, heads 32 wide in a 64-wide model (q is 128 rows), grouped-query, tied head
    "qwen3": dict(LLAMA, qk_norm=True, d_head=32, n_kv_heads=2, tie_embeddings=True),
    # Qwen3 with biases on q, k and v (llama.cpp's qwen3 loads them) and linear rope scaling
    "qwen3-qkv-bias-linear-rope": dict(LLAMA, qk_norm=True, qkv_bias=True, n_kv_heads=1, rope_scaling=RopeScaling("linear", 2.0)),
    # Phi-3 with longrope: short factors up to its original context (128 here, the run's whole context), attention factor
    "phi3-longrope": dict(
        LLAMA,
        n_kv_heads=2,
        rope_scaling=RopeScaling(
            "longrope", 32.0, original_context=128, short_factor=SHORT_FACTORS, attention_factor=math.sqrt(1 + math.log(32) / math.log(128))
        ),
    ),
    # Phi-4-mini: partial rotary (12 of each head's 16 features turn: rope.dimension_count), longrope over those, tied head
    "phi4-mini": dict(
        LLAMA,
        n_kv_heads=2,
        tie_embeddings=True,
        rope_fraction=0.75,
        rope_scaling=RopeScaling("longrope", 32.0, original_context=128, short_factor=SHORT_FACTORS[:6], attention_factor=1.2),
    ),
}
ARCHS = {"qwen3": "qwen3", "qwen3-qkv-bias-linear-rope": "qwen3", "phi3-longrope": "phi3", "phi4-mini": "phi3"}


def _config(tokenizer: TextTokenizer, **shape) -> ModelConfig:
    return ModelConfig(vocab_size=tokenizer.vocab_size, block_size=128, n_layers=2, n_heads=4, d_model=64, d_ff=96, **shape)


def _same(a, b) -> bool:
    """Equal, floats within float32's rounding (GGUF stores them as float32)."""
    if isinstance(a, RopeScaling) and isinstance(b, RopeScaling):
        if a.kind == b.kind == "longrope":  # longrope's factor is bookkeeping: tfcli computes from short_factor and attention_factor
            a, b = dataclasses.replace(a, factor=1.0), dataclasses.replace(b, factor=1.0)
        return _same(dataclasses.asdict(a), dataclasses.asdict(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-6)
    return a == b


EFFECTIVE = {"n_kv_heads": "kv_heads", "d_head": "head_dim", "d_ff": "hidden_dim", "qkv_bias": "has_qkv_bias", "mlp_bias": "has_mlp_bias"}
TRAINING_ONLY = ("dropout", "init_std", "zero_init_proj")  # change training, not what the model computes: GGUF has no place for them


def _differing(config: ModelConfig) -> list[str]:
    """The fields of `config` that differ from ModelConfig's defaults."""
    default = ModelConfig()
    return [f.name for f in dataclasses.fields(ModelConfig) if getattr(config, f.name) != getattr(default, f.name)]


def _refused_field(stderr: str) -> str:
    """The field a refusal names: the word after 'cannot express this model: '."""
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "cannot express this model: " in stderr, stderr
    return stderr.split("cannot express this model: ", 1)[1].split()[0]


def _refuses_or_round_trips(cli, tmp_path: Path, run: Path, fields: list[str]) -> str:
    """Export `run`: refused naming a field (the exact one each test pins), or a file llama.cpp runs as tfcli does that imports back with
    each of `fields` unchanged (the training-only ones at their defaults). Returns the architecture or the refusal."""
    config = load_checkpoint(run).config.model
    out = tmp_path / f"{run.name}.gguf"
    result = cli("export", run, "--to", "gguf", "-o", out)
    if result.code != 0:
        assert result.code == 2 and not out.exists(), result.stderr
        named = _refused_field(result.stderr)
        assert named in {f.name for f in dataclasses.fields(ModelConfig)}, result.stderr
        assert named in fields or getattr(config, named) is not None, f"{run.name}: refused for {named!r}, which it does not set: {result.stderr}"
        return f"refused: {named}"
    back = tmp_path / f"{run.name}-back"
    imported = cli("import", out, "-o", back)
    assert imported.code == 0, imported.stderr
    again = load_checkpoint(back).config.model
    noted = "tanh approximation" in result.stderr  # an exact GELU goes out as llama.cpp's tanh one, with a note
    for name in fields:
        if name in TRAINING_ONLY:
            assert getattr(again, name) == getattr(ModelConfig(), name), name
        elif not (name == "activation" and noted):
            theirs, ours = getattr(again, EFFECTIVE.get(name, name)), getattr(config, EFFECTIVE.get(name, name))
            assert _same(theirs, ours), f"{run.name}: {name} went out as {ours!r} and came back as {theirs!r}"
    tokenizer = TextTokenizer.load(run)
    ids = tokenizer.encode(TINY_TEXT)[: min(48, config.block_size)]
    assert np.abs(_tfcli_logits(back, ids) - _tfcli_logits(run, ids)).max() < (1e-3 if noted else 1e-4)
    llm = _llama(_llama_cpp(), out)
    if not noted:  # the exact GELU's logits differ by llama.cpp's tanh form (test_gguf holds that case)
        fp16_gelu = config.positions == "learned" or config.activation == "geglu"  # gpt2, gemma3: GELU from llama.cpp's fp16 table
        with ggml_gelu() if fp16_gelu else contextlib.nullcontext():
            assert np.abs(_llama_logits(llm, ids) - _tfcli_logits(run, ids)).max() < 1e-3
        ours, _ = _tfcli_greedy(cli, run, 12)
        assert ours == _llama_greedy(llm, tokenizer.encode(PROMPT), 12, _suppressed(tokenizer))
    return f"exported: {llm.metadata['general.architecture']}"


# --- Qwen3 and Phi-3 in llama.cpp --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def family_runs(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf-families")
    tokenizer = TextTokenizer.load(trained_tokenizer)
    return {kind: _random_run(root / kind, _config(tokenizer, **shape), tokenizer) for kind, shape in FAMILIES.items()}


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_qwen3_and_phi3_run_in_llama_cpp_as_in_tfcli(cli, tmp_path, family_runs, kind):
    llama_cpp = _llama_cpp()
    run = family_runs[kind]
    tokenizer = TextTokenizer.load(run)
    config = load_checkpoint(run).config.model
    path = _export(cli, run, tmp_path / "model.gguf")
    metadata = gguf.GGUFReader(path)
    arch = ARCHS[kind]
    assert metadata.fields["general.architecture"].contents() == arch
    names = {t.name for t in metadata.tensors}
    if arch == "qwen3":  # the norms, and q as wide as its heads: 4 heads of 32 (Qwen3), not d_model
        assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= names
        assert metadata.fields["qwen3.attention.key_length"].contents() == config.head_dim == metadata.fields["qwen3.attention.value_length"].contents()
        (q,) = [t for t in metadata.tensors if t.name == "blk.0.attn_q.weight"]
        assert list(q.shape) == [config.d_model, config.q_width]  # ggml's order: columns, rows
    else:
        assert {"rope_factors_short.weight", "rope_factors_long.weight", "blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"} <= names
        assert "blk.0.ffn_gate.weight" not in names
        assert metadata.fields["phi3.rope.scaling.attn_factor"].contents() == pytest.approx(config.rope_scaling.attention_factor, rel=1e-6)
        assert metadata.fields["phi3.rope.scaling.original_context_length"].contents() == 128
        assert metadata.fields["phi3.rope.dimension_count"].contents() == config.rotary_dim == (12 if kind == "phi4-mini" else 16)
    del metadata
    llm = _llama(llama_cpp, path)
    prompt = tokenizer.encode(TINY_TEXT)[:100]
    difference = np.abs(_llama_logits(llm, prompt) - _tfcli_logits(run, prompt)).max()
    assert difference < 1e-4, difference  # 1.1e-5 (qwen3), 5.0e-5 (phi3-longrope), 5.1e-5 (phi4-mini) measured, logits up to 9.6
    ours, _ = _tfcli_greedy(cli, run, 64)
    assert ours == _llama_greedy(llm, tokenizer.encode(PROMPT), 64, _suppressed(tokenizer))
    assert len(set(ours)) > 8  # a continuation, not a few tokens over and over

    result = cli("import", path, "-o", tmp_path / "back")  # and back: the same model
    assert result.code == 0, result.stderr
    assert f"GGUF {arch}" in result.stdout
    back = load_checkpoint(tmp_path / "back").config.model
    for field in dataclasses.fields(ModelConfig):
        name = EFFECTIVE.get(field.name, field.name)
        assert _same(getattr(back, name), getattr(config, name)), field.name
    assert np.abs(_tfcli_logits(tmp_path / "back", prompt) - _tfcli_logits(run, prompt)).max() < 1e-5
    again = cli("export", tmp_path / "back", "--to", "gguf", "-o", tmp_path / "again.gguf")
    assert again.code == 0, again.stderr


def test_a_phi3_gguf_with_a_longer_context_than_its_original_imports_up_to_it(cli, tmp_path, family_runs):
    """A Phi-3-128k GGUF as llama.cpp's converter writes it: context_length past the original context and long
    factors of their own. llama.cpp turns q and k by the short factors up to the original context; tfcli's
    context stops there, with a note, and its logits are llama.cpp's."""
    path = _export(cli, family_runs["phi3-longrope"], tmp_path / "phi3.gguf")

    def long_factors_tripled(tensor):
        data = np.asarray(tensor.data)
        return data * 3 if tensor.name == "rope_factors_long.weight" else data, tensor.tensor_type

    longer = {"phi3.context_length": 4096, "phi3.rope.scaling.original_context_length": 256}
    with gguf_copy(path, tmp_path / "long.gguf", values=longer, tensor=long_factors_tripled) as writer:
        writer.add_uint32("phi3.attention.sliding_window", 32)  # Phi-3-mini's; llama.cpp switches it off
    result = cli("import", tmp_path / "long.gguf", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    assert "context 256 (longrope's original context" in result.stderr and "sliding_window is 32" in result.stderr
    config = load_checkpoint(tmp_path / "run").config.model
    assert config.block_size == 256 and config.rope_scaling.original_context == 256 and config.rope_scaling.short_factor == pytest.approx(SHORT_FACTORS)
    # llama.cpp pads its context to a multiple of 256, and takes the long factors past the original context: 256 here
    llm = _llama_cpp().Llama(model_path=str(tmp_path / "long.gguf"), logits_all=True, n_ctx=256, n_threads=1, type_k=0, type_v=0, verbose=False)
    ids = TextTokenizer.load(tmp_path / "run").encode(TINY_TEXT)[:60]
    assert np.abs(_llama_logits(llm, ids) - _tfcli_logits(tmp_path / "run", ids)).max() < 1e-3


# --- every option: refused by name, or the same model in llama.cpp and back ---------------------------------


def _hf_family(kind: str, folder: Path, tokenizer_dir: Path):
    """A tiny transformers model of a family, saved with the trained tokenizer, and its class name."""
    transformers = pytest.importorskip("transformers")
    vocab = TextTokenizer.load(tokenizer_dir).vocab_size
    shape = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5
    )
    no_ids = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    configs = {
        "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=False)),
        "llama-3.1": (
            "LlamaConfig",
            "LlamaForCausalLM",
            dict(
                num_key_value_heads=1,
                tie_word_embeddings=True,
                rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
            ),
        ),
        "llama-biased": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True, rope_scaling={"rope_type": "linear", "factor": 2.0})),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
        "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=None, head_dim=8)),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)),
        "qwen3-biased": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=1, head_dim=8, attention_bias=True)),
        "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=2, **no_ids)),
        "phi3-longrope": (
            "Phi3Config",
            "Phi3ForCausalLM",
            dict(
                original_max_position_embeddings=32,
                rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.3, 2.5, 4.0], "long_factor": [2.0, 3.0, 5.0, 9.0]},
                **no_ids,
            ),
        ),
        "gemma3": (
            "Gemma3TextConfig",
            "Gemma3ForCausalLM",
            dict(
                num_key_value_heads=2,
                head_dim=16,
                query_pre_attn_scalar=16,  # llama.cpp's gemma3 scales by 1 / sqrt(head_dim)
                sliding_window=8,
                layer_types=["sliding_attention", "sliding_attention"],  # llama.cpp's gemma3: five local layers, then a global one
                rope_scaling={"rope_type": "linear", "factor": 2.0},
            ),
        ),
        "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    }
    config_class, model_class, extra = configs[kind]
    assert hasattr(transformers, config_class), f"the locked transformers has no {config_class}"
    settings = {**shape, **extra} if kind != "gpt2" else dict(vocab_size=vocab, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**settings)).eval()
    with torch.no_grad():  # far from zero, so every tensor shows in the logits
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(str(folder), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, folder / name)
    return model_class


HF_FAMILIES = ["llama", "llama-3.1", "llama-biased", "qwen2", "mistral", "qwen3", "qwen3-biased", "phi3", "phi3-longrope", "gemma3", "gpt2"]
EXPECTED = {  # what each family's run becomes: llama.cpp's architecture, or the option named in the refusal
    "llama": "exported: llama",
    "llama-3.1": "exported: llama",
    "llama-biased": "exported: llama",
    "qwen2": "exported: llama",  # biases on q, k and v only: llama.cpp's llama loads them
    "mistral": "exported: llama",
    "qwen3": "exported: qwen3",
    "qwen3-biased": "refused: bias",  # attention_bias covers the output projection, which llama.cpp's qwen3 lacks
    "phi3": "exported: llama",  # without rope scaling a Phi-3 is a Llama: its tensors map
    "phi3-longrope": "exported: phi3",
    "gemma3": "exported: gemma3",
    "gpt2": "exported: gpt2",
    "tiny": "exported: gpt2",  # the exact GELU, with the note
    "bert-base": "refused: arch",
    "seq2seq-tiny": "refused: arch",
}


@pytest.mark.parametrize("kind", HF_FAMILIES + ["tiny", "bert-base", "seq2seq-tiny"])
def test_each_familys_options_are_refused_by_name_or_go_through(cli, tmp_path, trained_tokenizer, kind):
    if kind in HF_FAMILIES:
        _hf_family(kind, tmp_path / "hf", trained_tokenizer)
        result = cli("import", tmp_path / "hf", "-o", tmp_path / kind)
        assert result.code == 0, result.stderr
        run = tmp_path / kind
    else:
        tokenizer = TextTokenizer.load(trained_tokenizer)
        small = dict(vocab_size=tokenizer.vocab_size, block_size=64, n_layers=2, n_heads=4, d_model=32, d_ff=64)
        run = _random_run(tmp_path / kind, preset(kind, **small), tokenizer)
    fields = _differing(load_checkpoint(run).config.model)
    assert _refuses_or_round_trips(cli, tmp_path, run, fields) == EXPECTED[kind]


# One other value for every ModelConfig field, set on a Llama-shaped base (with what it needs beside it)
ONE_OPTION = {
    "arch": dict(arch="encoder"),
    "vocab_size": dict(vocab_size=+16),  # relative: rows past the tokenizer's, written as unused tokens
    "block_size": dict(block_size=96),
    "n_layers": dict(n_layers=3),
    "n_decoder_layers": dict(arch="encoder-decoder", n_decoder_layers=1),
    "n_heads": dict(n_heads=2, n_kv_heads=None),
    "n_kv_heads": dict(n_kv_heads=1),
    "d_model": dict(d_model=48, n_heads=3, n_kv_heads=None),
    "d_head": dict(d_head=24),  # heads wider than d_model / n_heads, without qk_norm: llama with key_length
    "d_ff": dict(d_ff=40),
    "attn_scale": dict(attn_scale=0.2),
    "sliding_window": dict(sliding_window=8, local_layers=(0,)),
    "local_layers": dict(sliding_window=8, local_layers=(1,)),
    "positions": dict(positions="sinusoidal"),
    "rope_base": dict(rope_base=5000.0),
    "rope_scaling": dict(rope_scaling=RopeScaling("linear", 3.0)),
    "rope_local_base": dict(sliding_window=8, local_layers=(0,), rope_local_base=500.0),
    "rope_fraction": dict(rope_fraction=0.5),  # partial rotary: written as phi3 with rope.dimension_count
    "norm": dict(norm="layernorm"),
    "norm_placement": dict(norm_placement="post"),
    "norm_eps": dict(norm_eps=1e-6),
    "post_norms": dict(post_norms=True),
    "activation": dict(activation="geglu"),
    "dropout": dict(dropout=0.1),
    "bias": dict(bias=True),
    "qk_norm": dict(qk_norm=True),
    "qkv_bias": dict(qkv_bias=True),
    "mlp_bias": dict(mlp_bias=True),
    "tie_embeddings": dict(tie_embeddings=True),
    "scale_embeddings": dict(scale_embeddings=True),
    "n_classes": dict(n_classes=3),
    "type_vocab_size": dict(type_vocab_size=2),
    "embedding_norm": dict(embedding_norm=True),
    "pooler": dict(arch="encoder", pooler=True),
    "init_std": dict(init_std=0.05),
    "logit_softcap": dict(logit_softcap=30.0),
    "zero_init_proj": dict(zero_init_proj=True),
}


def test_every_model_option_has_a_case():
    missing = sorted({f.name for f in dataclasses.fields(ModelConfig)} - set(ONE_OPTION))
    assert not missing, f"add a value for {missing} to ONE_OPTION: GGUF export must refuse it by name or carry it through"


@pytest.mark.parametrize("option", sorted(ONE_OPTION))
def test_each_option_alone_is_refused_by_name_or_goes_through(cli, tmp_path, trained_tokenizer, option):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    overrides = dict(ONE_OPTION[option])
    if option == "vocab_size":
        overrides["vocab_size"] = tokenizer.vocab_size + overrides["vocab_size"]
    base = dict(vocab_size=tokenizer.vocab_size, block_size=64, n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, d_ff=64, **LLAMA)
    config = ModelConfig(**{**base, **overrides})
    run = _random_run(tmp_path / option, config, tokenizer)
    outcome = _refuses_or_round_trips(cli, tmp_path, run, list(overrides))
    if outcome.startswith("refused"):  # for the option itself, or one it needs beside it
        assert outcome.split(": ", 1)[1] in overrides, outcome
