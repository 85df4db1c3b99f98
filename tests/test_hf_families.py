"""Llama-family and BERT interop: random models built locally with transformers (tiny configs, no network)
import with transformers' logits, export back to the same class with equal logits, and generate, fill
masks and classify as transformers does."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tfcli.checkpoint import load_checkpoint
from tfcli.tokenizer.core import TextTokenizer

transformers = pytest.importorskip("transformers")

PROMPT = "Once upon a time"


def _perturb(model) -> None:
    """Non-zero biases and norms, so a wrong mapping cannot hide."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                p.add_(torch.randn_like(p) * 0.1)


def _save(model, folder, tokenizer_dir) -> None:
    model.save_pretrained(str(folder), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, folder / name)


LLAMAS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-tied-biased-llama3-rope": ("LlamaConfig", "LlamaForCausalLM", dict(
        num_key_value_heads=1, tie_word_embeddings=True, attention_bias=True, mlp_bias=False, rope_theta=5000.0,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16})),
    "llama-linear-rope": ("LlamaConfig", "LlamaForCausalLM", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}, mlp_bias=True)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=None, head_dim=8)),
}


def _llama(kind: str, vocab: int, folder, tokenizer_dir):
    config_class, model_class, extra = LLAMAS[kind]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, rms_norm_eps=1e-5, **extra)
    model = getattr(transformers, model_class)(config).eval()
    _perturb(model)
    _save(model, folder, tokenizer_dir)
    return model


def _decoder_logits_equal(hf, ours, vocab) -> None:
    ids = torch.randint(0, vocab, (2, 12))
    real = torch.ones(2, 12, dtype=torch.bool)
    real[1, 8:] = False  # right padding
    with torch.no_grad():
        theirs = hf(ids, attention_mask=real.long()).logits
        mine = ours(ids, real).logits
    assert (theirs[real] - mine[real]).abs().max().item() < 1e-4


def _greedy_ids_equal(cli, run, hf, tokenizer: TextTokenizer) -> None:
    result = cli("generate", run, "-p", PROMPT, "--max-new-tokens", "12", "--json")
    assert result.code == 0, result.stderr
    (completion,) = json.loads(result.stdout)["completions"]
    prompt = tokenizer.encode(PROMPT)
    eos = tokenizer.special_ids.get("eos")
    suppressed = sorted({i for role, i in tokenizer.special_ids.items() if i != eos})  # tfcli never generates these
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos,
                          suppress_tokens=suppressed or None, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    assert completion["tokens"] == out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kind", list(LLAMAS))
def test_llama_family_imports_exports_and_generates_as_transformers(cli, tmp_path, trained_tokenizer, kind):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    vocab = tokenizer.vocab_size
    hf = _llama(kind, vocab, tmp_path / "hf", trained_tokenizer)
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    assert LLAMAS[kind][1] in result.stdout and f"{sum(p.numel() for p in hf.parameters()):,} parameters" in result.stdout
    ours = load_checkpoint(tmp_path / "run")
    assert ours.config.source_class == LLAMAS[kind][1]
    _decoder_logits_equal(hf, ours.model, vocab)
    _greedy_ids_equal(cli, tmp_path / "run", hf, ours.tokenizer)
    result = cli("export", tmp_path / "run", "--to", "hf", "-o", tmp_path / "back")
    assert result.code == 0, result.stderr
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == [LLAMAS[kind][1]]
    again = getattr(transformers, LLAMAS[kind][1]).from_pretrained(str(tmp_path / "back")).eval()
    _decoder_logits_equal(again, ours.model, vocab)
    assert sum(p.numel() for p in again.parameters()) == sum(p.numel() for p in hf.parameters())
