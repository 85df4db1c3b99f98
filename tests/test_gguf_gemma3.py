"""Gemma 3 through GGUF as llama.cpp's `gemma3` reads it: a tiny random Gemma3ForCausalLM from transformers' own
config class, imported from its Hugging Face folder, exported to GGUF and run by the real llama.cpp
(llama-cpp-python): the same greedy ids, logits within what llama.cpp's arithmetic allows (its CPU GeGLU takes
GELU from a table of fp16 values, see `ggml_gelu`); imported back from that GGUF, the same model.

llama.cpp fixes what the file does not say (src/models/gemma3.cpp): every sixth layer global, the others local with
a rotary base of 10,000 (a run with other local layers or another local base says so in
attention.sliding_window_pattern and rope.freq_base_swa), scores scaled by 1 / sqrt(head_dim). A model outside
that is refused by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TINY_TEXT
from tests.gguf_files import gguf_copy
from tests.helpers import missing_tool
from tests.test_gguf import PROMPT, _llama, _llama_cpp, _llama_greedy, _llama_logits, _suppressed, _tfcli_greedy, _tfcli_logits, ggml_gelu
from tfcli.checkpoint import load_checkpoint
from tfcli.model.config import ModelConfig, RopeScaling
from tfcli.tokenizer.core import TextTokenizer

gguf = pytest.importorskip("gguf")

# transformers' Gemma 3 with llama.cpp's fixed layout: 7 layers (5 local, the 6th global, a 7th local), a window of
# 8 in prompts of 60, the local rotary base 10,000, the global one 1e6 linearly scaled, heads 16 wide (not 64 / 4)
GEMMA3 = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=7,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    query_pre_attn_scalar=16,
    sliding_window=8,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_parameters={
        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def _transformers():
    import os

    try:
        import transformers
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("transformers is not installed; CI installs it with .[test]")
        missing_tool("transformers is not installed")
    return transformers


def _hf_gemma3(folder: Path, tokenizer_dir: Path, **overrides):
    transformers = _transformers()
    vocab = TextTokenizer.load(tokenizer_dir).vocab_size
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(vocab_size=vocab, **{**GEMMA3, **overrides})
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # far from zero, so every tensor shows in the logits (the norms' offsets from 1 too)
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.15)
    model.save_pretrained(str(folder), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_dir / name).is_file():
            (folder / name).write_bytes((tokenizer_dir / name).read_bytes())
    return model


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory, trained_tokenizer):
    """The transformers model, its tfcli run and the GGUF exported from it."""
    from tfcli.cli.app import main

    root = tmp_path_factory.mktemp("gguf-gemma3")
    hf = _hf_gemma3(root / "hf", trained_tokenizer)
    for args in (["import", root / "hf", "-o", root / "run"], ["export", root / "run", "--to", "gguf", "-o", root / "model.gguf"]):
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            assert not exc.code, args
    return hf, root / "run", root / "model.gguf"


def test_gemma3_is_laid_out_as_llama_cpps_converter_writes_it(gemma3):
    hf, run, path = gemma3
    reader = gguf.GGUFReader(path)
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert field("general.architecture") == "gemma3"
    assert field("gemma3.attention.sliding_window") == 8 and field("gemma3.attention.key_length") == 16
    assert field("gemma3.rope.freq_base") == 1e6 and field("gemma3.rope.scaling.factor") == 2.0
    names = {t.name for t in reader.tensors}
    assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight", "blk.0.attn_q_norm.weight", "output.weight"} <= names
    (norm,) = [t for t in reader.tensors if t.name == "blk.3.post_ffw_norm.weight"]
    theirs = hf.model.layers[3].post_feedforward_layernorm.weight.detach().numpy()
    np.testing.assert_array_equal(np.asarray(norm.data), theirs + 1)  # Gemma's 1 added, as the converter adds it


def test_gemma3_runs_in_llama_cpp_as_in_transformers_and_tfcli(cli, gemma3):
    hf, run, path = gemma3
    tokenizer = TextTokenizer.load(run)
    prompt = tokenizer.encode(TINY_TEXT)[:60]  # seven windows of 8
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0].numpy()
    ours = _tfcli_logits(run, prompt)
    assert np.abs(ours - theirs).max() < 1e-4
    llm = _llama(_llama_cpp(), path)
    assert llm.metadata["general.architecture"] == "gemma3"
    cpp = _llama_logits(llm, prompt)
    # llama.cpp's CPU GeGLU takes GELU from a table of fp16 values: with that GELU tfcli's logits are llama.cpp's
    # within 1e-3 (7e-4 measured, logits up to 4.8: 1.5e-4 of the largest); with the exact one within 2e-3 (1.7e-3).
    # Not 1e-4: the table turns float32's rounding into steps of 2**-11 (test_the_gap_to_llama_cpp_is_its_fp16_gelu_table)
    with ggml_gelu():
        emulated = _tfcli_logits(run, prompt)
    assert np.abs(cpp - emulated).max() < 1e-3, np.abs(cpp - emulated).max()
    assert np.abs(cpp - ours).max() < 1e-3 * np.abs(ours).max(), np.abs(cpp - ours).max()
    greedy, _ = _tfcli_greedy(cli, run, 24)
    assert greedy == _llama_greedy(llm, tokenizer.encode(PROMPT), 24, _suppressed(tokenizer))
    assert len(set(greedy)) > 6


@contextlib.contextmanager
def _nudged_gelu(table: bool):
    """GELU (llama.cpp's fp16 table, or exact) read at inputs moved by float32's rounding (a relative 2**-23, at random):
    what another order of the same float32 sums gives it."""
    generator = torch.Generator().manual_seed(0)
    inner = torch.nn.functional.gelu

    def nudged(x, approximate="none"):
        moved = x * (1 + torch.randn(x.shape, generator=generator) * 2.0**-23)
        return inner(moved, approximate=approximate)

    with ggml_gelu() if table else contextlib.nullcontext():
        inner = torch.nn.functional.gelu
        torch.nn.functional.gelu = nudged
        try:
            yield
        finally:
            torch.nn.functional.gelu = inner


def test_the_gap_to_llama_cpp_is_its_fp16_gelu_table(gemma3):
    """Why tfcli's logits are llama.cpp's within 1e-3 for Gemma 3 and not 1e-4 (the issue's bound, which Llama-shaped
    files meet): llama.cpp's CPU GeGLU rounds GELU's input to fp16 and reads an fp16 result from a table (ggml-cpu/vec.h,
    GGML_GELU_FP16, defined in every build: no build option turns it off), a step of 2**-11 of the value. Two float32
    computations of the same input differ in their last bits (llama.cpp sums its products in another order than
    PyTorch), and where a value lies near a step the two land on different steps. Measured here: tfcli with the table
    and inputs nudged by float32's rounding moves its logits as far as llama.cpp's are from tfcli's with the table
    (within a factor of 4), while the exact GELU nudged alike moves them by under 1e-5: the table, not the model, holds
    the gap above 1e-4."""
    hf, run, path = gemma3
    prompt = TextTokenizer.load(run).encode(TINY_TEXT)[:60]
    cpp = _llama_logits(_llama(_llama_cpp(), path), prompt)
    exact = _tfcli_logits(run, prompt)
    with ggml_gelu():
        emulated = _tfcli_logits(run, prompt)
    with _nudged_gelu(table=True):
        nudged_table = _tfcli_logits(run, prompt)
    with _nudged_gelu(table=False):
        nudged_exact = _tfcli_logits(run, prompt)
    gap, table_noise, exact_noise = (np.abs(cpp - emulated).max(), np.abs(nudged_table - emulated).max(), np.abs(nudged_exact - exact).max())
    print(f"\nllama.cpp - tfcli (table) {gap:.2e}; tfcli (table), inputs nudged {table_noise:.2e}; tfcli (exact), nudged {exact_noise:.2e}")
    assert exact_noise < 1e-5
    assert gap / 4 < table_noise < gap * 4


def test_gemma3_comes_back_from_gguf_as_the_same_model(cli, tmp_path, gemma3):
    hf, run, path = gemma3
    result = cli("import", path, "-o", tmp_path / "back")
    assert result.code == 0, result.stderr
    assert "GGUF gemma3" in result.stdout
    config, back = load_checkpoint(run).config.model, load_checkpoint(tmp_path / "back").config.model
    differing = [f.name for f in dataclasses.fields(ModelConfig) if getattr(config, f.name) != getattr(back, f.name) and f.name not in ("init_std", "dropout")]
    assert differing == []
    prompt = TextTokenizer.load(run).encode(TINY_TEXT)[:60]
    assert np.abs(_tfcli_logits(tmp_path / "back", prompt) - _tfcli_logits(run, prompt)).max() < 1e-5
    again = cli("export", tmp_path / "back", "--to", "gguf", "-o", tmp_path / "again.gguf")
    assert again.code == 0, again.stderr


def test_a_gemma3_llama_cpp_cannot_run_is_refused_by_name_in_one_line(cli, tmp_path, trained_tokenizer):
    """transformers' query_pre_attn_scalar 24 with heads 16 wide: llama.cpp's gemma3 would scale by 1 / sqrt(16)."""
    _hf_gemma3(tmp_path / "hf", trained_tokenizer, query_pre_attn_scalar=24)
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    result = cli("export", tmp_path / "run", "--to", "gguf", "-o", tmp_path / "model.gguf")
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "GGUF's gemma3 architecture cannot express this model: attn_scale " in result.stderr, result.stderr
    assert not (tmp_path / "model.gguf").exists()


GEMMA3_RUN = dict(
    vocab_size=64,
    block_size=32,
    n_layers=7,
    n_heads=2,
    d_model=32,
    d_head=16,
    positions="rotary",
    norm="rmsnorm",
    activation="geglu",
    post_norms=True,
    qk_norm=True,
    scale_embeddings=True,
    bias=False,
    sliding_window=8,
    local_layers=(0, 1, 2, 3, 4, 6),
    rope_base=1e6,
    rope_local_base=1e4,
)


@pytest.mark.parametrize(
    "overrides, named",
    [
        (dict(rope_local_base=None, rope_scaling=RopeScaling("linear", 2.0)), "rope_local_base None with rope_scaling linear"),  # scaled local tables
        (dict(qkv_bias=True), "qkv_bias true"),
        (dict(sliding_window=None, local_layers=(), rope_local_base=None), "sliding_window None"),
    ],
)
def test_what_llama_cpps_gemma3_fixes_otherwise_is_named(overrides, named):
    from tfcli.errors import TfcliError
    from tfcli.gguf.layout import export_arch

    assert export_arch(ModelConfig(**GEMMA3_RUN)) == "gemma3"
    with pytest.raises(TfcliError) as refused:
        export_arch(ModelConfig(**{**GEMMA3_RUN, **overrides}))
    assert f"GGUF's gemma3 architecture cannot express this model: {named} " in refused.value.message


@pytest.mark.parametrize(
    "overrides, keys",
    [
        ({}, {}),  # llama.cpp's defaults: neither key
        (dict(local_layers=(0, 2, 4, 6)), {"attention.sliding_window_pattern": [True, False, True, False, True, False, True]}),
        (dict(rope_local_base=500.0), {"rope.freq_base_swa": 500.0}),
        (dict(rope_local_base=None), {"rope.freq_base_swa": 1e6}),  # the local layers on the global tables, unscaled
        (dict(rope_local_base=1e6), {"rope.freq_base_swa": 1e6}),  # the same tables, said the other way
        (dict(rope_base=1e4, rope_local_base=1e4), {}),
    ],
)
def test_other_local_layers_and_local_bases_are_written_as_llama_cpp_reads_them(overrides, keys):
    from tfcli.gguf.layout import config_from_gguf, export_arch, extra_tensors, hyperparameters, local_rope_base, tensor_layout

    config = ModelConfig(**{**GEMMA3_RUN, **overrides})
    assert export_arch(config) == "gemma3"
    written = hyperparameters(config, "gemma3")
    assert {k: v for k, v in written.items() if k in ("attention.sliding_window_pattern", "rope.freq_base_swa")} == keys
    names = {t.name for t in tensor_layout(config, "gemma3")}
    metadata = {f"gemma3.{key}": value for key, value in written.items()}
    back, _ = config_from_gguf(metadata, "gemma3", config.vocab_size, names, extra_tensors(config, "gemma3").__getitem__, "the file")
    assert back.local_layers == config.local_layers and local_rope_base(back) == local_rope_base(config)


def test_a_gemma3_with_its_own_local_layers_and_local_base_runs_in_llama_cpp_as_in_tfcli(cli, tmp_path, trained_tokenizer):
    """transformers' Gemma 3 with layer_types other than five local to one global and a local rotary base of 500:
    the file says both (attention.sliding_window_pattern, rope.freq_base_swa), and llama.cpp's logits are tfcli's
    within 1e-3 of the largest, the bound test_gemma3_runs_in_llama_cpp_as_in_transformers_and_tfcli holds them to."""
    layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    rope = {**GEMMA3["rope_parameters"], "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}
    hf = _hf_gemma3(tmp_path / "hf", trained_tokenizer, layer_types=layer_types, rope_parameters=rope)
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    config = load_checkpoint(tmp_path / "run").config.model
    assert config.local_layers == (0, 2, 4, 5) and config.rope_local_base == 500.0
    result = cli("export", tmp_path / "run", "--to", "gguf", "-o", tmp_path / "model.gguf")
    assert result.code == 0, result.stderr
    reader = gguf.GGUFReader(tmp_path / "model.gguf")
    assert reader.fields["gemma3.attention.sliding_window_pattern"].contents() == [True, False, True, False, True, True, False]
    assert reader.fields["gemma3.rope.freq_base_swa"].contents() == 500.0
    del reader
    prompt = TextTokenizer.load(tmp_path / "run").encode(TINY_TEXT)[:60]
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0].numpy()
    ours = _tfcli_logits(tmp_path / "run", prompt)
    assert np.abs(ours - theirs).max() < 1e-4
    # 1.8e-3 measured (logits up to 4.7), 1.4e-3 with llama.cpp's GELU table, which is what that table's steps
    # alone move them by here (test_the_gap_to_llama_cpp_is_its_fp16_gelu_table): within 1e-3 of the largest
    bound = 1e-3 * np.abs(ours).max()
    cpp = _llama_logits(_llama(_llama_cpp(), tmp_path / "model.gguf"), prompt)
    assert np.abs(cpp - ours).max() < bound, np.abs(cpp - ours).max()
    for key in ("gemma3.attention.sliding_window_pattern", "gemma3.rope.freq_base_swa"):  # without either key, llama.cpp computes another model
        without = _rewritten(tmp_path / "model.gguf", tmp_path / f"without-{key}.gguf", drop=(key,))
        assert np.abs(_llama_logits(_llama(_llama_cpp(), without), prompt) - ours).max() > 10 * bound, key


def _rewritten(src: Path, out: Path, drop: tuple[str, ...] = (), add: dict | None = None) -> Path:
    """A copy of a GGUF file with some keys dropped and others added (as floats)."""
    with gguf_copy(src, out, drop=drop) as writer:
        for key, value in (add or {}).items():
            writer.add_float32(key, value)
    return out


def test_a_gemma3_gguf_without_a_window_is_soft_capped_or_refused(cli, tmp_path, gemma3):
    """Without a sliding window llama.cpp's gemma3 makes every layer global and soft-caps the logits: by the
    file's final_logit_softcapping, as tfcli does, or by a default its versions disagree on, which tfcli refuses."""
    _, _, path = gemma3
    capped = _rewritten(path, tmp_path / "capped.gguf", drop=("gemma3.attention.sliding_window",), add={"gemma3.final_logit_softcapping": 3.0})
    result = cli("import", capped, "-o", tmp_path / "capped")
    assert result.code == 0, result.stderr
    config = load_checkpoint(tmp_path / "capped").config.model
    assert config.local_layers == () and config.sliding_window is None and config.logit_softcap == 3.0
    uncapped = _rewritten(path, tmp_path / "uncapped.gguf", drop=("gemma3.attention.sliding_window",))
    result = cli("import", uncapped, "-o", tmp_path / "uncapped")
    assert result.code == 2 and "needs gemma3.final_logit_softcapping" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "uncapped").exists()
    info = json.loads((Path(tmp_path / "capped") / "config.json").read_text())
    assert info["model"]["logit_softcap"] == 3.0


def test_a_gemma_sentencepiece_vocabulary_goes_out_as_llama_spm(cli, tmp_path, llama_cpp_models):
    """Gemma's tokenizer.json: SentencePiece pieces as a BPE with byte fallback, spaces replaced by U+2581 and no
    space put first, then a split at " " that never splits. Built here from Phi-3-mini's real vocabulary (llama.cpp's
    ggml-vocab-phi-3.gguf as transformers converts it: its pieces and merges) laid out as Gemma's, on a one-layer Gemma 3 run: it goes out as llama.cpp's `llama` tokenizer model
    without a space prefix, as the converter writes Gemma 3's, and llama.cpp tokenizes and continues as tfcli."""
    import os

    from tests.llama_cpp_sdist import converted
    from tests.test_gguf import TEXTS, VARIED, _random_run

    phi3 = converted(llama_cpp_models, "phi-3", Path(os.environ["TFCLI_CACHE_DIR"]))
    spec = json.loads((phi3 / "tokenizer.json").read_text(encoding="utf-8"))
    spec["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    spec["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
    spec["decoder"]["decoders"] = spec["decoder"]["decoders"][:3]  # no leading space to strip
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    roles = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>", "add_bos_token": False, "tokenizer_class": "PreTrainedTokenizerFast"}
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(roles), encoding="utf-8")
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    shape = dict(positions="rotary", norm="rmsnorm", activation="geglu", post_norms=True, qk_norm=True, scale_embeddings=True, bias=False)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, block_size=64, n_layers=1, n_heads=2, d_model=16, d_head=8, d_ff=32, sliding_window=8, local_layers=(0,), **shape
    )
    run = _random_run(tmp_path / "run", config, tokenizer)
    path = tmp_path / "gemma.gguf"
    result = cli("export", run, "--to", "gguf", "-o", path)
    assert result.code == 0, result.stderr
    reader = gguf.GGUFReader(path)
    assert reader.fields["tokenizer.ggml.model"].contents() == "llama" and reader.fields["tokenizer.ggml.add_space_prefix"].contents() is False
    del reader
    llm = _llama(_llama_cpp(), path)
    for text in [*TEXTS, *VARIED]:
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == tokenizer.encode(text), text
    prompt = tokenizer.encode(TINY_TEXT)[:40]
    with ggml_gelu():
        assert np.abs(_llama_logits(llm, prompt) - _tfcli_logits(run, prompt)).max() < 1e-3
