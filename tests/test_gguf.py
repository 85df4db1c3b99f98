"""GGUF out and in, checked by the real llama.cpp (llama-cpp-python): tiny Llama- and GPT-2-shaped runs
exported to GGUF load there, tokenize to the same ids, score a prompt with the same logits and continue it
greedily with the same tokens; a GGUF laid out as llama.cpp's converter lays out a transformers Llama
imports and generates as llama.cpp does; import gives an export back exactly; bad files are refused in
one line with nothing written."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TINY_TEXT
from tests.gguf_files import copied_gguf, gguf_copy, new_gguf
from tests.helpers import missing_tool
from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.model.config import ModelConfig, RopeScaling
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer

gguf = pytest.importorskip("gguf")

PROMPT = "Once upon a time a little fox"
TEXTS = [PROMPT, TINY_TEXT, "Zoë smiled at the café 🦊, didn't she?  Tom  had 123 apples.\n\nThe end <|endoftext|>"]
SHAPES = {
    # rotary, RMSNorm, SwiGLU, grouped-query attention, untied head
    "llama": dict(positions="rotary", norm="rmsnorm", activation="swiglu", n_kv_heads=2, bias=False, tie_embeddings=False),
    # biases on q, k and v only (Qwen2's layout), multi-query, tied head, Llama 3.1's rope scaling (rope_freqs.weight)
    "llama-qkv-bias-tied-llama3-rope": dict(
        positions="rotary",
        norm="rmsnorm",
        activation="swiglu",
        n_kv_heads=1,
        bias=False,
        qkv_bias=True,
        tie_embeddings=True,
        rope_scaling=RopeScaling("llama3", 4.0, 1.0, 4.0, 32),
    ),
    # linear rope scaling, biases everywhere (llama's optional attention and MLP biases)
    "llama-biased-linear-rope": dict(positions="rotary", norm="rmsnorm", activation="swiglu", n_kv_heads=4, bias=True, rope_scaling=RopeScaling("linear", 2.0)),
    # learned positions, LayerNorm, GELU (tanh), biases everywhere
    "gpt2": dict(positions="learned", norm="layernorm", activation="gelu_tanh", bias=True, tie_embeddings=True),
}


def _llama_cpp():
    """llama-cpp-python, the real llama.cpp; CI must have it (the test extra builds it)."""
    try:
        import llama_cpp
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("llama-cpp-python is not installed; CI installs it with .[test]")
        missing_tool("llama-cpp-python is not installed")
    return llama_cpp


def _tiny_run(folder: Path, tokenizer_dir: Path, shape: dict, seed: int = 0) -> Path:
    tokenizer = TextTokenizer.load(tokenizer_dir)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=128, n_layers=2, n_heads=4, d_model=64, d_ff=96, **shape)
    return _random_run(folder, config, tokenizer, seed)


def _random_run(folder: Path, config: ModelConfig, tokenizer: TextTokenizer, seed: int = 0) -> Path:
    """A run whose weights are random but far from zero, so every tensor shows in the logits and greedy
    decoding wanders instead of repeating two tokens (a GELU MLP's input stays gentle: see ggml_gelu)."""
    torch.manual_seed(seed)
    model = Transformer(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            gentle = config.activation != "swiglu" and "mlp.fc" in name
            parameter.add_(torch.randn_like(parameter) * (0.08 if gentle else 0.25))
    save_checkpoint(folder, model, tokenizer)
    return folder


@contextlib.contextmanager
def ggml_gelu():
    """GELU as llama.cpp's CPU backend computes it (ggml-cpu/vec.h, GGML_GELU_FP16): the input rounded to
    fp16, looked up in a table of fp16 results; 0 below -10, the input above 10."""
    exact = torch.nn.functional.gelu

    def table(x, approximate="none"):
        y = exact(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))

    torch.nn.functional.gelu = table
    try:
        yield
    finally:
        torch.nn.functional.gelu = exact


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf-runs")
    return {kind: _tiny_run(root / kind, trained_tokenizer, shape) for kind, shape in SHAPES.items()}


@pytest.fixture(scope="module")
def metaspace_run(tmp_path_factory) -> Path:
    """A Llama-shaped run with a SentencePiece-style (metaspace BPE) tokenizer: llama.cpp's `llama` tokenizer."""
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    root = tmp_path_factory.mktemp("gguf-metaspace")
    (root / "corpus.txt").write_text(TINY_TEXT * 20, encoding="utf-8")
    train_tokenizer(resolve_corpus([root / "corpus.txt"]), root / "tok", TokenizerTrainingConfig(vocab_size=200, pre_tokenizer="metaspace"))
    return _tiny_run(root / "run", root / "tok", SHAPES["llama"])


def _export(cli, run: Path, out: Path, kind: str = "f32") -> Path:
    result = cli("export", run, "--to", "gguf", "-o", out, "--type", kind)
    assert result.code == 0, result.stderr
    return out


def _tfcli_logits(run: Path, ids: list[int]) -> np.ndarray:
    model = load_checkpoint(run).model
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


F32 = 0  # GGML_TYPE_F32: the KV cache in fp32 as tfcli's (llama.cpp's default is f16)


def _llama(llama_cpp, path: Path):
    return llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=128, n_threads=1, n_threads_batch=1, type_k=F32, type_v=F32, verbose=False)


def _llama_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def _llama_greedy(llm, prompt: list[int], n: int, suppressed: list[int]) -> list[int]:
    """llama.cpp's logits, argmax each step (the special tokens tfcli never generates held out, as tfcli does)."""
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(n):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        logits[suppressed] = -np.inf
        out.append(int(logits.argmax()))
        llm.eval([out[-1]])
    return out


def _tfcli_greedy(cli, run: Path, n: int) -> tuple[list[int], list[int]]:
    result = cli("generate", run, "-p", PROMPT, "--max-new-tokens", str(n), "--ignore-eos", "--json")
    assert result.code == 0, result.stderr
    (completion,) = json.loads(result.stdout)["completions"]
    return completion["tokens"], completion


def _suppressed(tokenizer: TextTokenizer) -> list[int]:
    eos = tokenizer.special_ids.get("eos")
    return sorted({i for i in tokenizer.special_ids.values() if i != eos})


@pytest.mark.parametrize("kind", list(SHAPES))
def test_exported_run_runs_in_llama_cpp_as_in_tfcli(cli, tmp_path, runs, kind):
    llama_cpp = _llama_cpp()
    run = runs[kind]
    tokenizer = TextTokenizer.load(run)
    llm = _llama(llama_cpp, _export(cli, run, tmp_path / "model.gguf"))
    assert llm.n_vocab() == tokenizer.vocab_size and llm.metadata[f"{'gpt2' if kind == 'gpt2' else 'llama'}.context_length"] == "128"
    for text in TEXTS:  # the same ids, special-token text staying text
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == tokenizer.encode(text), text
    prompt = tokenizer.encode(TINY_TEXT)[:100]
    theirs = _llama_logits(llm, prompt)
    difference = np.abs(theirs - _tfcli_logits(run, prompt)).max()
    if kind == "gpt2":
        # llama.cpp's gpt2 takes GELU from an fp16 table: with that GELU, tfcli's logits are llama.cpp's within 1e-3;
        # with the exact one they differ by the table's rounding (3e-4 of the largest logit here)
        with ggml_gelu():
            assert np.abs(theirs - _tfcli_logits(run, prompt)).max() < 1e-3
        assert difference < 5e-4 * np.abs(theirs).max(), difference
    else:
        assert difference < 1e-3, difference
    ours, completion = _tfcli_greedy(cli, run, 64)
    assert completion["prompt_tokens"] == len(tokenizer.encode(PROMPT))
    assert ours == _llama_greedy(llm, tokenizer.encode(PROMPT), 64, _suppressed(tokenizer))
    assert len(set(ours)) > 8  # a continuation, not a few tokens over and over


def test_a_sentencepiece_style_tokenizer_without_byte_pieces_is_refused(cli, tmp_path, metaspace_run):
    result = cli("export", metaspace_run, "--to", "gguf", "-o", tmp_path / "model.gguf")
    assert result.code == 2 and "256 byte pieces" in result.stderr  # llama.cpp would stop at the first unknown character
    assert not (tmp_path / "model.gguf").exists()


def test_the_chat_template_and_special_tokens_go_through(cli, tmp_path, runs):
    import shutil

    from tfcli.gguf import read_gguf

    run = tmp_path / "chat"
    shutil.copytree(runs["gpt2"], run)
    config = json.loads((run / "tokenizer_config.json").read_text())
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    (run / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    path = _export(cli, run, tmp_path / "chat.gguf")
    metadata = read_gguf(path).metadata
    tokenizer = TextTokenizer.load(run)
    assert metadata["tokenizer.chat_template"] == template
    assert metadata["tokenizer.ggml.eos_token_id"] == tokenizer.special_ids["eos"] and metadata["gpt2.context_length"] == 128
    assert metadata["tokenizer.ggml.token_type"][tokenizer.special_ids["pad"]] == 3  # control: never made from text
    assert cli("import", path, "-o", tmp_path / "back").code == 0
    assert json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())["chat_template"] == template


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_f16_and_q8_0_stay_close(cli, tmp_path, runs, kind, capsys):
    llama_cpp = _llama_cpp()
    run = runs[kind]
    tokenizer = TextTokenizer.load(run)
    prompt = tokenizer.encode(TINY_TEXT)[:100]
    reference = _tfcli_logits(run, prompt)
    ours, _ = _tfcli_greedy(cli, run, 24)
    differences = {}
    for kind_ in ("f16", "q8_0"):
        llm = _llama(llama_cpp, _export(cli, run, tmp_path / f"{kind_}.gguf", kind_))
        differences[kind_] = float(np.abs(_llama_logits(llm, prompt) - reference).max())
        if kind_ == "f16":
            assert _llama_greedy(llm, tokenizer.encode(PROMPT), 24, _suppressed(tokenizer)) == ours
        del llm
    largest = float(np.abs(reference).max())
    with capsys.disabled():
        print(f"\n{kind}: largest logit difference from tfcli's f32 (logits up to {largest:.1f}): f16 {differences['f16']:.2e}, q8_0 {differences['q8_0']:.2e}")
    assert differences["f16"] < 0.01 * largest and differences["q8_0"] < 0.2 * largest, differences


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_import_gives_the_export_back(cli, tmp_path, runs, kind, dtype):
    run = runs[kind]
    path = _export(cli, run, tmp_path / "model.gguf", dtype)
    result = cli("import", path, "-o", tmp_path / "back")
    assert result.code == 0, result.stderr
    assert f"GGUF {'gpt2' if kind == 'gpt2' else 'llama'}" in result.stdout
    back = load_checkpoint(tmp_path / "back")
    original = load_checkpoint(run)
    assert back.config.model == original.config.model
    ids = original.tokenizer.encode(TINY_TEXT)[:100]
    difference = np.abs(_tfcli_logits(tmp_path / "back", ids) - _tfcli_logits(run, ids)).max()
    assert difference < (1e-5 if dtype == "f32" else 0.05), difference
    for text in TEXTS:  # the rebuilt tokenizer.json encodes and decodes through tokenizers as the run's own
        assert back.tokenizer.encode(text) == original.tokenizer.encode(text)
        assert back.tokenizer.hf.decode(back.tokenizer.encode(text)) == text
    assert back.tokenizer.special_ids == original.tokenizer.special_ids
    again = cli("export", tmp_path / "back", "--to", "gguf", "-o", tmp_path / "again.gguf", "--type", dtype)
    assert again.code == 0, again.stderr
    assert cli("info", tmp_path / "back").code == 0  # a run like any other


def test_the_reader_agrees_with_gguf_own_reader(cli, tmp_path, runs):
    from tfcli.gguf import read_gguf

    path = _export(cli, runs["llama"], tmp_path / "model.gguf", "q8_0")
    ours = read_gguf(path)
    theirs = gguf.GGUFReader(path)
    assert set(ours.tensors) == {t.name for t in theirs.tensors}
    for tensor in theirs.tensors:
        info = ours.tensors[tensor.name]
        assert info.start == tensor.data_offset and info.nbytes == tensor.n_bytes and info.kind == tensor.tensor_type
        expected = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(info.shape)
        assert np.array_equal(ours.read(tensor.name).numpy(), expected)
    assert ours.metadata["tokenizer.ggml.tokens"] == theirs.fields["tokenizer.ggml.tokens"].contents()
    assert ours.metadata["llama.attention.head_count_kv"] == 2


# --- a Llama laid out as llama.cpp's converter lays it out (convert_hf_to_gguf.py, LlamaModel) ---------------


def _converter_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, as it is written there."""
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _sentencepiece_vocab(tmp_path: Path) -> tuple[list[str], list[float], list[int]]:
    """A Llama-2-style vocabulary: <unk> <s> </s>, the 256 byte pieces, then SentencePiece-style pieces
    (U+2581 for a space) scored by when a BPE on the tiny text made them."""
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TINY_TEXT * 20, encoding="utf-8")
    train_tokenizer(resolve_corpus([corpus]), tmp_path / "spm", TokenizerTrainingConfig(vocab_size=200, pre_tokenizer="metaspace"))
    spec = json.loads((tmp_path / "spm" / "tokenizer.json").read_text())
    added = {t["content"] for t in spec["added_tokens"]}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    merged = {(m if isinstance(m, str) else " ".join(m)).replace(" ", ""): rank for rank, m in enumerate(spec["model"]["merges"])}
    for piece in sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get):
        if piece in added:
            continue
        tokens.append(piece)
        types.append(1)
        scores.append(-float(merged.get(piece, -1) + 1))
    return tokens, scores, types


def _write_converter_llama(hf, path: Path, tokens: list[str], scores: list[float], types: list[int]) -> None:
    """What convert_hf_to_gguf.py writes for a LlamaForCausalLM (f32): its keys, its tensor names, q and k permuted."""
    c = hf.config
    with new_gguf(path, "llama") as writer:
        writer.add_name("tiny-llama")
        writer.add_type("model")
        writer.add_context_length(c.max_position_embeddings)
        writer.add_embedding_length(c.hidden_size)
        writer.add_block_count(c.num_hidden_layers)
        writer.add_feed_forward_length(c.intermediate_size)
        writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
        writer.add_head_count(c.num_attention_heads)
        writer.add_head_count_kv(c.num_key_value_heads)
        writer.add_layer_norm_rms_eps(c.rms_norm_eps)
        writer.add_rope_freq_base(10000.0)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        writer.add_vocab_size(c.vocab_size)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        names = {
            "model.embed_tokens.weight": "token_embd.weight",
            "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight",
        }
        for i in range(c.num_hidden_layers):
            for theirs, ours in (
                ("self_attn.q_proj", "attn_q"),
                ("self_attn.k_proj", "attn_k"),
                ("self_attn.v_proj", "attn_v"),
                ("self_attn.o_proj", "attn_output"),
                ("mlp.gate_proj", "ffn_gate"),
                ("mlp.up_proj", "ffn_up"),
                ("mlp.down_proj", "ffn_down"),
                ("input_layernorm", "attn_norm"),
                ("post_attention_layernorm", "ffn_norm"),
            ):
                names[f"model.layers.{i}.{theirs}.weight"] = f"blk.{i}.{ours}.weight"
        for name, tensor in hf.state_dict().items():
            data = tensor.detach().numpy().astype(np.float32)
            if name.endswith("q_proj.weight"):
                data = _converter_permute(data, c.num_attention_heads)
            elif name.endswith("k_proj.weight"):
                data = _converter_permute(data, c.num_key_value_heads)
            writer.add_tensor(names[name], data)


def test_a_converter_laid_out_llama_imports_and_generates_as_llama_cpp(cli, tmp_path):
    llama_cpp = _llama_cpp()
    transformers = pytest.importorskip("transformers")
    tokens, scores, types = _sentencepiece_vocab(tmp_path)
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.08)
    path = tmp_path / "tiny-llama.gguf"
    _write_converter_llama(hf, path, tokens, scores, types)
    result = cli("import", path, "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    run = load_checkpoint(tmp_path / "run")
    assert run.tokenizer.adds_bos and run.tokenizer.special_ids["bos"] == 1 and run.tokenizer.special_ids["eos"] == 2
    llm = _llama(llama_cpp, path)
    for text in TEXTS:  # SentencePiece-style, as llama.cpp tokenizes: a space prefix, pieces merged by score, bytes for the rest
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert run.tokenizer.encode(text) == ids, text
        assert run.tokenizer.hf.decode(ids) == llm.detokenize(ids).decode("utf-8", errors="replace").lstrip(" ") == text
    prompt = [1, *run.tokenizer.encode(PROMPT)]
    with torch.no_grad():  # the permutation undone: tfcli's logits are transformers' own
        assert (hf(torch.tensor([prompt])).logits[0] - run.model(torch.tensor([prompt])).logits[0]).abs().max() < 1e-4
    ours, completion = _tfcli_greedy(cli, tmp_path / "run", 64)
    assert completion["prompt_tokens"] == len(prompt)
    assert ours == _llama_greedy(llm, prompt, 64, _suppressed(run.tokenizer))
    # exported again, the SentencePiece-style tokenizer is llama.cpp's `llama` model once more, and tokenizes as the original
    again = _llama(llama_cpp, _export(cli, tmp_path / "run", tmp_path / "again.gguf"))
    assert again.metadata["tokenizer.ggml.model"] == "llama" and again.metadata["tokenizer.ggml.add_bos_token"] == "true"
    for text in TEXTS:
        assert again.tokenize(text.encode(), add_bos=True, special=False) == llm.tokenize(text.encode(), add_bos=True, special=False)
    assert np.abs(_llama_logits(again, prompt) - _llama_logits(llm, prompt)).max() < 1e-4


# --- what export refuses ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "named"),
    [
        (dict(positions="learned", norm="layernorm", activation="relu"), "activation 'relu'"),
        (dict(positions="rotary", norm="layernorm", activation="swiglu"), "norm 'layernorm'"),
        (dict(positions="sinusoidal"), "positions 'sinusoidal'"),
        (dict(positions="learned", activation="gelu_tanh", norm_placement="post"), "norm_placement 'post'"),
    ],
)
def test_export_names_what_gguf_cannot_express(cli, tmp_path, trained_tokenizer, shape, named):
    run = _tiny_run(tmp_path / "run", trained_tokenizer, shape)
    result = cli("export", run, "--to", "gguf", "-o", tmp_path / "model.gguf")
    assert result.code == 2
    assert named in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "model.gguf").exists() and not list(tmp_path.glob(".model.gguf*"))


# --- the models tfcli makes by default ---------------------------------------------------------------------


def _hf_greedy(model, prompt: list[int], n: int, suppressed: list[int]) -> list[int]:
    """transformers' logits, argmax each step, the same tokens held out."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            logits[suppressed] = -torch.inf
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_the_default_model_leaves_through_gguf_and_hf_with_the_same_greedy_text(cli, tmp_path, trained_tokenizer, runs):
    """The tiny preset (the quickstart's model and train pretrain's default) has the exact GELU, which llama.cpp's
    gpt2 computes as its tanh approximation: the export says so, and the greedy text is tfcli's in llama.cpp and in
    transformers alike."""
    from tfcli.gguf import export_gguf
    from tfcli.model.config import preset

    llama_cpp = _llama_cpp()
    transformers = pytest.importorskip("transformers")
    tokenizer = TextTokenizer.load(trained_tokenizer)
    config = preset("tiny", vocab_size=tokenizer.vocab_size)
    assert config.activation == "gelu" and config.positions == "learned"  # what `tfcli export --to gguf` refused
    run = _random_run(tmp_path / "run", config, tokenizer)
    result = cli("export", run, "--to", "gguf", "-o", tmp_path / "model.gguf")
    assert result.code == 0, result.stderr
    assert "GGUF gpt2" in result.stdout
    (note,) = export_gguf(run, tmp_path / "again.gguf").notes
    assert "tanh approximation" in note and export_gguf(runs["gpt2"], tmp_path / "tanh.gguf").notes == []

    llm = _llama(llama_cpp, tmp_path / "model.gguf")
    ids = tokenizer.encode(TINY_TEXT)[:100]
    theirs = _llama_logits(llm, ids)
    difference = np.abs(theirs - _tfcli_logits(run, ids)).max()  # 4e-3 here, on logits up to 10
    assert difference < 1e-3 * np.abs(theirs).max(), difference
    with ggml_gelu():  # llama.cpp's GELU (tanh, from its fp16 table) in tfcli: several times closer, so the GELU is what differs
        assert np.abs(theirs - _tfcli_logits(run, ids)).max() < difference / 3

    prompt, suppressed = tokenizer.encode(PROMPT), _suppressed(tokenizer)
    ours, completion = _tfcli_greedy(cli, run, 32)
    assert len(set(ours)) > 8  # a continuation, not a few tokens over and over
    assert _llama_greedy(llm, prompt, 32, suppressed) == ours
    assert llm.detokenize(ours).decode("utf-8", errors="replace") == completion["text"]  # random weights: stray bytes too

    result = cli("export", run, "--to", "hf", "-o", tmp_path / "hf")
    assert result.code == 0, result.stderr
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert hf.config.activation_function == "gelu"  # transformers' exact GELU, as tfcli's
    assert _hf_greedy(hf, prompt, 32, suppressed) == ours
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf")).decode(ours) == completion["text"]

    back = cli("import", tmp_path / "model.gguf", "-o", tmp_path / "back")  # in again as what llama.cpp runs
    assert back.code == 0, back.stderr
    assert load_checkpoint(tmp_path / "back").config.model == config.with_overrides(activation="gelu_tanh")


def test_the_one_command_default_model_exports_to_gguf(cli, tmp_path):
    """`train pretrain --data TEXT` makes the tiny preset in the modern recipe's shape, and that run exports as
    Qwen3 (llama.cpp's qwen3, transformers' Qwen3ForCausalLM), with llama.cpp continuing as tfcli does."""
    from tfcli.model.config import preset
    from tfcli.train.recipes import recipe_settings

    notes = tmp_path / "notes.txt"
    notes.write_text(TINY_TEXT * 40, encoding="utf-8")
    result = cli("train", "pretrain", "--data", notes, "-o", tmp_path / "run", "--max-steps", "2", "--batch-size", "4")
    assert result.code == 0, result.stderr
    config = load_checkpoint(tmp_path / "run").config.model
    modern = {key.split(".")[1]: value for key, value in recipe_settings("modern").items() if key.startswith("model.")}
    assert config == preset("tiny", vocab_size=config.vocab_size, **modern)
    result = cli("export", tmp_path / "run", "--to", "gguf", "-o", tmp_path / "model.gguf")
    assert result.code == 0, result.stderr
    assert gguf.GGUFReader(tmp_path / "model.gguf").fields["general.architecture"].contents() == "qwen3"
    prompt = TextTokenizer.load(tmp_path / "run").encode(TINY_TEXT)[:12]
    assert np.abs(_llama_logits(_llama(_llama_cpp(), tmp_path / "model.gguf"), prompt) - _tfcli_logits(tmp_path / "run", prompt)).max() < 1e-3
    hf = cli("export", tmp_path / "run", "--to", "hf", "-o", tmp_path / "hf")
    assert hf.code == 0 and json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]


def test_export_refuses_a_tokenizer_llama_cpp_cannot_run(cli, tmp_path):
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TINY_TEXT * 20, encoding="utf-8")
    train_tokenizer(resolve_corpus([corpus]), tmp_path / "tok", TokenizerTrainingConfig(vocab_size=200, model="wordpiece"))
    run = _tiny_run(tmp_path / "run", tmp_path / "tok", SHAPES["llama"])
    result = cli("export", run, "--to", "gguf", "-o", tmp_path / "model.gguf")
    assert result.code == 2 and "wordpiece tokenizer" in result.stderr
    assert not (tmp_path / "model.gguf").exists()
    assert cli("export", run, "--to", "hf", "--type", "f16", "-o", tmp_path / "hf").code == 2  # --type is GGUF's


# --- what llama.cpp's loader tolerates, and only that ------------------------------------------------------


def _with_keys(src: Path, dst: Path, arch: str | None = None, **keys) -> Path:
    """A copy of a GGUF file with metadata keys set (as u32 when an int, as text when a str), others kept."""
    names = {key.replace("__", "."): value for key, value in keys.items()}
    with gguf_copy(src, dst, arch=arch, drop=names) as writer:
        for key, value in names.items():
            writer.add_string(key, value) if isinstance(value, str) else writer.add_uint32(key, value)
    return dst


NONE_ID = 4294967295  # what llama.cpp's converter writes for "no such token"


def test_none_and_out_of_range_special_ids_are_dropped_with_a_note_as_llama_cpp_does(cli, tmp_path, exported_llama):
    """A file converted from a model without a separator or padding token: llama.cpp's loader warns ("bad special
    token") and goes on; so does import, saying so, and the run decodes as llama.cpp decodes the file."""
    llama_cpp = _llama_cpp()
    path = _with_keys(
        exported_llama,
        tmp_path / "none.gguf",
        tokenizer__ggml__seperator_token_id=NONE_ID,
        tokenizer__ggml__padding_token_id=NONE_ID,
        tokenizer__ggml__mask_token_id=100_000,
    )
    result = cli("import", path, "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 3, result.stderr
    assert 'seperator_token_id is 4,294,967,295 (the converter\'s "no such token"' in notes[0] and "as llama.cpp does" in notes[0]
    assert "padding_token_id is 4,294,967,295" in notes[1] and "mask_token_id is 100,000 (past the vocabulary" in notes[2]
    run = load_checkpoint(tmp_path / "run")
    roles = json.loads((tmp_path / "run" / "tokenizer_config.json").read_text())
    assert "pad_token" not in roles and "sep_token" not in roles and "mask_token" not in roles and roles["eos_token"] == "<|endoftext|>"
    llm = _llama(llama_cpp, path)
    prompt = run.tokenizer.encode(PROMPT)
    ours, _ = _tfcli_greedy(cli, tmp_path / "run", 32)
    assert ours == _llama_greedy(llm, prompt, 32, _suppressed(run.tokenizer))
    ids = run.tokenizer.encode(TINY_TEXT)[:100]
    assert np.abs(_llama_logits(llm, ids) - _tfcli_logits(tmp_path / "run", ids)).max() < 1e-4


def test_an_out_of_range_end_of_text_says_what_llama_cpp_falls_back_to(cli, tmp_path, exported_llama):
    result = cli("import", _with_keys(exported_llama, tmp_path / "eos.gguf", tokenizer__ggml__eos_token_id=NONE_ID), "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    assert "eos_token_id is 4,294,967,295" in result.stderr and "uses its default id 11" in result.stderr  # gpt2's BPE default
    assert "eos_token" not in json.loads((tmp_path / "run" / "tokenizer_config.json").read_text())


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        # everything else stays strict: a negative id is no u32, a name is no id
        (dict(tokenizer__ggml__eos_token_id="two"), "eos_token_id is 'two', not a token id"),
        (dict(tokenizer__ggml__sep_token_id=1), "tokenizer.ggml.sep_token_id is not something"),  # llama.cpp's key is seperator_token_id
        # another tokenizer model: the model is the reason, not a key of its own
        (dict(tokenizer__ggml__model="rwkv", tokenizer__ggml__cls_token_id=1), "tokenizer.ggml.model is 'rwkv' (RWKV's trie)"),
    ],
)
def test_other_special_token_problems_stay_refused(cli, tmp_path, exported_llama, keys, named):
    result = cli("import", _with_keys(exported_llama, tmp_path / "bad.gguf", **keys), "-o", tmp_path / "run")
    assert result.code == 2 and named in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "cls_token_id" not in result.stderr or "model is" not in named


def test_a_bert_gguf_is_refused_as_bert(cli, tmp_path):
    """What llama.cpp's converter writes for a BERT: architecture bert, a WordPiece (bert) tokenizer with its
    [CLS] and [SEP]. tfcli does not import an encoder from GGUF, and says that, not that a key is unknown."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s"]
    with new_gguf(tmp_path / "bert.gguf", "bert") as writer:
        writer.add_context_length(16)
        writer.add_embedding_length(8)
        writer.add_block_count(1)
        writer.add_feed_forward_length(16)
        writer.add_head_count(2)
        writer.add_layer_norm_eps(1e-12)
        writer.add_causal_attention(False)
        writer.add_pooling_type(gguf.PoolingType.CLS)
        writer.add_tokenizer_model("bert")
        writer.add_token_list(tokens)
        writer.add_token_types([3, 2, 3, 3, 3, 1, 1, 1])
        writer.add_uint32("tokenizer.ggml.cls_token_id", 2)
        writer.add_sep_token_id(3)
        writer.add_pad_token_id(0)
        writer.add_mask_token_id(4)
        writer.add_unk_token_id(1)
        writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    result = cli("import", tmp_path / "bert.gguf", "-o", tmp_path / "run")
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "is a BERT encoder" in result.stderr and "cls_token_id" not in result.stderr
    assert not (tmp_path / "run").exists()


# --- every pre-tokenizer llama.cpp splits by regexes ---------------------------------------------------------

VARIED = [
    "Hello world! I'LL say it: don't, won't, they've.  Tabs\tand\r\nCRLF\n\n\nend   ",
    "Zoë smiled at the café 🦊🦊, naïve façade; ΑΒΓ δεζ Привет Мир Ankara'da İstanbul'u",
    "中文测试，你好。日本語のテキスト、カタカナ。한국어 텍스트",
    "def f(x):\n    return x**2 + 3.14159 # 1234567 12 123456\n\tif a<=b and c!=d: print(f'{x}')",
    "नमस्ते दुनिया ... full－width ＡＢＣ１２３ — “quotes” ‘single’ $100 + 5% = ~^|`",
    "numbers 1 12 123 1234 12345 1,234,567.89 and   spaces      here\n \n  \n",
    "camelCaseWord HTTPServer XMLHttpRequest getHTTPResponseCode ÀÉÎõü end.\n\nNext!\n?!\n",
]


@pytest.fixture(scope="module")
def boundary_bpe() -> tuple[list[str], list[str]]:
    """A byte-level BPE trained on VARIED without any pre-tokenizer split, so that its merges cross every boundary a
    pre-tokenizer could draw: where two pre-tokenizers split differently, the ids differ."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"], min_frequency=1)
    tokenizer.train_from_iterator(VARIED * 3, trainer)
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    return sorted(vocab, key=vocab.get), [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]


def _vocab_gguf(path: Path, tokens: list[str], merges: list[str], pre: str) -> Path:
    """A llama GGUF holding only what llama.cpp's vocabulary loader reads (llama_cpp.Llama(vocab_only=True))."""
    with new_gguf(path, "llama") as writer:
        for key, value in dict(context_length=64, embedding_length=16, block_count=1, feed_forward_length=32, head_count=2).items():
            writer.add_uint32(f"llama.{key}", value)
        writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types([3] + [1] * (len(tokens) - 1))
        writer.add_token_merges(merges)
        writer.add_eos_token_id(0)
    return path


def _pre_names() -> list[str]:
    from tfcli.gguf.vocab import PRES

    return sorted(PRES)


@pytest.mark.parametrize("pre", _pre_names())
def test_every_pre_tokenizer_name_tokenizes_as_llama_cpp(tmp_path, boundary_bpe, pre):
    """Each `tokenizer.ggml.pre` name tfcli rebuilds (deepseek-coder, falcon, starcoder, gpt-4o, tekken, ... and their
    aliases) gives the ids llama.cpp gives, on text where the pre-tokenizers differ (CJK, cased words, digits,
    contractions, punctuation before newlines, whitespace runs); bos as llama.cpp adds it when the file does not say."""
    from tokenizers import Tokenizer

    from tfcli.gguf.reader import read_gguf
    from tfcli.gguf.vocab import PRES, Vocab, _byte_level_pre_name

    llama_cpp = _llama_cpp()
    path = _vocab_gguf(tmp_path / "vocab.gguf", *boundary_bpe, pre)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = Vocab(read_gguf(path).metadata, str(path))
    ours = Tokenizer.from_str(vocab.tokenizer_json())
    matched = [text for text in VARIED if ours.encode(text, add_special_tokens=False).ids == llm.tokenize(text.encode(), add_bos=False, special=False)]
    assert len(matched) == len(VARIED), f"{pre}: {len(matched)}/{len(VARIED)} strings as llama.cpp tokenizes them"
    written = _byte_level_pre_name(json.loads(vocab.tokenizer_json()))  # exported again: a name llama.cpp splits the same way
    assert (PRES[written].splits, PRES[written].ignore_merges) == (PRES[pre].splits, PRES[pre].ignore_merges), written
    adds = len(llm.tokenize(b"a", add_bos=True, special=False)) - len(llm.tokenize(b"a", add_bos=False, special=False))
    assert vocab.add_bos == PRES[pre].add_bos == bool(adds)  # a bos in front when the file does not say: llama.cpp's default


def test_the_pre_tokenizers_are_told_apart(tmp_path, boundary_bpe):
    """The test above would catch a wrong regex: llama.cpp itself gives different ids for these names on VARIED."""
    llama_cpp = _llama_cpp()
    groups = [
        "gpt-2",
        "llama-bpe",
        "qwen2",
        "qwen35",
        "smollm",
        "deepseek-llm",
        "deepseek-coder",
        "deepseek-v3",
        "falcon",
        "bloom",
        "viking",
        "tekken",
        "gpt-4o",
    ]
    seen = {}
    for pre in groups:
        llm = llama_cpp.Llama(model_path=str(_vocab_gguf(tmp_path / f"{pre}.gguf", *boundary_bpe, pre)), vocab_only=True, verbose=False)
        ids = tuple(tuple(llm.tokenize(text.encode(), add_bos=False, special=False)) for text in VARIED)
        assert ids not in seen, f"{pre} tokenizes VARIED as {seen.get(ids)} does"
        seen[ids] = pre


# --- bad files ---------------------------------------------------------------------------------------------


def _rewrite(src: Path, dst: Path, *, drop=(), arch: str | None = None, quantized: str | None = None, kind: str = "Q8_K") -> Path:
    """A copy of a GGUF file through gguf's reader and writer, with keys dropped, another architecture, or
    one tensor declared as another type (Q8_K: llama.cpp's activations' type, which no file's weights have)."""

    def declared(tensor):
        if tensor.name != quantized:
            return np.asarray(tensor.data), tensor.tensor_type
        blocks = np.zeros((tensor.shape[1], gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][1]), dtype=np.uint8)
        return blocks, gguf.GGMLQuantizationType[kind]

    return copied_gguf(src, dst, arch=arch, drop_prefixes=tuple(drop), tensor=declared)


def _offset_past_the_end(src: Path, dst: Path) -> Path:
    data = bytearray(src.read_bytes())
    tensor = gguf.GGUFReader(src).tensors[-1]
    field = tensor.field
    where = field.offset + 8 + len(tensor.name.encode()) + 4 + 8 * len(tensor.shape) + 4  # the offset's 8 bytes
    data[where : where + 8] = (len(data) // 32 * 32).to_bytes(8, "little")
    dst.write_bytes(bytes(data))
    return dst


BAD_FILES = {
    "truncated": (lambda src, dst: dst.write_bytes(src.read_bytes()[: src.stat().st_size * 2 // 3]) and dst, "truncated"),
    "wrong magic": (lambda src, dst: dst.write_bytes(b"GGUX" + src.read_bytes()[4:]) and dst, "not a GGUF file"),
    "offset past the end": (_offset_past_the_end, "runs past the end of the file"),
    "unknown architecture": (lambda src, dst: _rewrite(src, dst, arch="mamba"), "general.architecture is 'mamba'"),
    "a type gguf cannot dequantize": (lambda src, dst: _rewrite(src, dst, quantized="blk.0.ffn_down.weight"), "blk.0.ffn_down.weight is Q8_K, which"),
    # every type llama.cpp writes is read (tests/test_gguf_types.py): a K-quant whose blocks do not fit the shape is refused for that
    "a K-quant of the wrong size": (lambda src, dst: _rewrite(src, dst, quantized="blk.0.ffn_down.weight", kind="Q4_K"), "has shape [64, 256], but"),
    "no tokenizer": (lambda src, dst: _rewrite(src, dst, drop=("tokenizer.",)), "has no tokenizer"),
    "metadata tfcli cannot express": (lambda src, dst: _rewrite(src, dst, arch="qwen2") and _with_key(dst), "qwen2.expert_count"),
}


def _with_key(path: Path) -> Path:
    with gguf_copy(path, path.with_suffix(".tmp"), arch="qwen2") as writer:
        writer.add_uint32("qwen2.expert_count", 8)
    path.with_suffix(".tmp").replace(path)
    return path


@pytest.fixture(scope="module")
def exported_llama(tmp_path_factory, runs) -> Path:
    from tfcli.gguf import export_gguf

    path = tmp_path_factory.mktemp("gguf-file") / "llama.gguf"
    export_gguf(runs["llama"], path)
    return path


@pytest.mark.parametrize("bad", list(BAD_FILES))
def test_a_bad_file_is_refused_in_one_line_with_nothing_written(cli, tmp_path, exported_llama, bad):
    make, named = BAD_FILES[bad]
    path = make(exported_llama, tmp_path / "bad.gguf")
    result = cli("import", path, "-o", tmp_path / "run")
    assert result.code == 2, result.stdout + result.stderr
    assert named in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists()


# --- the benchmark beside llama.cpp ------------------------------------------------------------------------


@pytest.mark.slow  # the benchmark's worker processes, end to end
def test_bench_generate_against_llama_cpp_decodes_the_same_tokens(cli, tmp_path):
    from tfcli.bench.generate import run_generate_bench

    _llama_cpp()
    bench = run_generate_bench(
        tmp_path, "tiny", prompt_tokens=4, new_tokens=12, repeat=1, threads=1, no_cache=False, peer=False, first_run=False, against="llama.cpp", compiled=False
    )
    assert set(bench.results) == {"tfcli", "llama.cpp"}
    llama, ours = bench.results["llama.cpp"], bench.results["tfcli"]
    assert llama.new_tokens == 12 and llama.threads == ours.threads == 1 and llama.seconds > 0
    assert bench.same_tokens_as_llama_cpp is True  # the same GGUF export of the same weights, greedy
    assert bench.to_json()["time_per_token_vs_llama_cpp"] == pytest.approx(ours.seconds / llama.seconds, rel=1e-3)  # tfcli / llama.cpp
    assert "--against knows llama.cpp" in cli("bench", "generate", "--against", "vllm").stderr


def test_an_imported_run_works_with_every_command(cli, tmp_path, exported_llama):
    """A GGUF imported as a run generates, is inspected, evaluated, fine-tuned (whole and with LoRA) and
    exported back, as any run is."""
    run = tmp_path / "imported"
    assert cli("import", exported_llama, "-o", run).code == 0
    text = tmp_path / "text.txt"
    text.write_text(TINY_TEXT * 8, encoding="utf-8")
    assert cli("tokenize", "encode", text, "-t", run / "tokenizer.json", "-o", tmp_path / "shards", "--val-fraction", "0.2").code == 0
    commands = {
        "generate": ["generate", run, "-p", PROMPT, "--max-new-tokens", "4", "--json"],
        "inspect-attention": ["inspect-attention", run, "--text", PROMPT, "--format", "json"],
        "inspect-logits": ["inspect-logits", run, "--text", PROMPT, "--json"],
        "eval": ["eval", run, "--data", text, "--json"],
    }
    for name, args in commands.items():
        result = cli(*args)
        assert result.code == 0, f"{name}: {result.stderr}"
        assert json.loads(result.stdout), name
    tune = ["--init-from", run, "--task", "lm", "--data", tmp_path / "shards", "--max-steps", "2", "--batch-size", "2", "--block-size", "32"]
    for name, extra in {"whole": [], "lora": ["--lora-rank", "4"]}.items():
        result = cli("train", "finetune", *tune, "-o", tmp_path / name, *extra)
        assert result.code == 0, f"{name}: {result.stderr}"
        assert cli("generate", tmp_path / name, "-p", PROMPT, "--max-new-tokens", "4").code == 0, name
    again = cli("export", tmp_path / "lora", "--to", "gguf", "-o", tmp_path / "again.gguf")
    assert again.code == 0, again.stderr
    assert cli("import", tmp_path / "again.gguf", "-o", tmp_path / "back").code == 0
