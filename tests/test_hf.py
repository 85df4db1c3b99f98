"""GPT-2 interop: exported runs load in transformers with equal logits, and GPT-2 folders import into
run directories with equal logits (random models built locally; no network)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer

transformers = pytest.importorskip("transformers")


def _gpt2_shaped(vocab: int, **overrides) -> ModelConfig:
    base = dict(vocab_size=vocab, block_size=32, n_layers=2, n_heads=4, d_model=32, activation="gelu_tanh")
    return ModelConfig(**{**base, **overrides})


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(tie_embeddings=False, activation="relu", d_ff=48), dict(tie_embeddings=False, zero_init_proj=True)],  # the speedrun's init: a GPT-2 as any other
    ids=["tied", "untied-relu", "untied-zero-init"],
)
def test_export_loads_in_transformers_with_equal_logits(cli, tmp_path, trained_tokenizer, overrides):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    torch.manual_seed(0)
    model = Transformer(_gpt2_shaped(tokenizer.vocab_size, **overrides)).eval()
    with torch.no_grad():  # non-zero biases and norms, so a wrong mapping cannot hide
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    save_checkpoint(tmp_path / "run", model, tokenizer)
    result = cli("export", tmp_path / "run", "--to", "hf", "-o", tmp_path / "hf")
    assert result.code == 0, result.stderr
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.randint(0, tokenizer.vocab_size, (3, 20))
    with torch.no_grad():
        assert (hf(ids).logits - model(ids).logits).abs().max().item() < 1e-4
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert auto("the fox", add_special_tokens=False)["input_ids"] == tokenizer.encode("the fox")


@pytest.mark.parametrize(
    "overrides, option",
    [
        (dict(positions="rotary"), "positions 'rotary'"),
        (dict(n_kv_heads=2), "n_kv_heads 2"),
        (dict(norm_placement="post"), "norm_placement 'post'"),
        (dict(activation="swiglu"), "activation 'swiglu'"),
        (dict(arch="encoder"), "BertForMaskedLM cannot express this model: norm_placement 'pre'"),
        (dict(bias=False), "bias false"),
        (dict(norm="rmsnorm"), "norm 'rmsnorm'"),
        (dict(activation="relu2"), "activation 'relu2' (GPT-2 has gelu, gelu_tanh or relu)"),
        (dict(logit_softcap=30.0), "logit_softcap 30 (GPT2LMHeadModel does not soft-cap its logits"),
    ],
)
def test_export_refuses_options_gpt2_cannot_express(cli, tmp_path, trained_tokenizer, overrides, option):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    save_checkpoint(tmp_path / "run", Transformer(_gpt2_shaped(tokenizer.vocab_size, **overrides)), tokenizer)
    result = cli("export", tmp_path / "run", "-o", tmp_path / "hf")
    assert result.code == 2 and option in result.stderr
    assert not (tmp_path / "hf" / "model.safetensors").exists()


def _hub_style_gpt2(folder, trained_tokenizer, vocab, prefix: bool, **config):
    torch.manual_seed(1)
    hf_config = transformers.GPT2Config(vocab_size=vocab, n_positions=40, n_embd=48, n_layer=3, n_head=4, **config)
    model = transformers.GPT2LMHeadModel(hf_config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(folder), safe_serialization=True)
    if not prefix:  # the hub's own gpt2 files name GPT2Model's tensors, without "transformer."
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(folder / "model.safetensors"))
        save_file({k.removeprefix("transformer."): v for k, v in tensors.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(trained_tokenizer / "tokenizer.json", folder / "tokenizer.json")
    return model


@pytest.mark.parametrize("prefix", [True, False])
def test_import_gives_transformers_logits(cli, tmp_path, trained_tokenizer, prefix):
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    hf = _hub_style_gpt2(tmp_path / "gpt2", trained_tokenizer, vocab, prefix)
    result = cli("import", tmp_path / "gpt2", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    ours = load_checkpoint(tmp_path / "run")
    assert ours.config.model.n_layers == 3 and ours.config.model.activation == "gelu_tanh"
    ids = torch.randint(0, vocab, (2, 25))
    with torch.no_grad():
        assert (hf(ids).logits - ours.model(ids).logits).abs().max().item() < 1e-4


def test_import_builds_the_tokenizer_from_vocab_and_merges(tmp_path, trained_tokenizer):
    from tfcli.hf import import_hf

    tokenizer = TextTokenizer.load(trained_tokenizer)
    _hub_style_gpt2(tmp_path / "gpt2", trained_tokenizer, tokenizer.vocab_size, True)
    spec = json.loads((trained_tokenizer / "tokenizer.json").read_text())
    (tmp_path / "gpt2" / "tokenizer.json").unlink()
    (tmp_path / "gpt2" / "vocab.json").write_text(json.dumps(spec["model"]["vocab"]))
    (tmp_path / "gpt2" / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]) + "\n"
    )
    import_hf(tmp_path / "gpt2", tmp_path / "run")
    imported = TextTokenizer.load(tmp_path / "run")
    assert imported.encode("The fox was happy.") == tokenizer.encode("The fox was happy.")


def test_import_bad_folders(cli, tmp_path, trained_tokenizer):
    (tmp_path / "empty").mkdir()
    result = cli("import", tmp_path / "empty", "-o", tmp_path / "run")
    assert result.code == 2 and "has no config.json" in result.stderr
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    _hub_style_gpt2(tmp_path / "gpt2", trained_tokenizer, vocab, True)
    (tmp_path / "gpt2" / "model.safetensors").rename(tmp_path / "gpt2" / "pytorch_model.bin")
    result = cli("import", tmp_path / "gpt2", "-o", tmp_path / "run")
    assert result.code == 2 and "pickle" in result.stderr
    config = json.loads((tmp_path / "gpt2" / "config.json").read_text())
    config["model_type"] = "llama"
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps(config))
    result = cli("import", tmp_path / "gpt2", "-o", tmp_path / "run")
    assert result.code == 2 and "not gpt2" in result.stderr
    config.update(model_type="gpt2", n_embd="48")
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps(config))
    result = cli("import", tmp_path / "gpt2", "-o", tmp_path / "run")
    assert result.code == 2 and 'has n_embd "48", which is not a whole number' in result.stderr
    _hub_style_gpt2(tmp_path / "no-tokenizer", trained_tokenizer, vocab, True)
    (tmp_path / "no-tokenizer" / "tokenizer.json").unlink()
    result = cli("import", tmp_path / "no-tokenizer", "-o", tmp_path / "run")
    assert result.code == 2 and "tokenizer" in result.stderr
    assert not (tmp_path / "run").exists()  # a failed import leaves no folder behind
    _hub_style_gpt2(tmp_path / "short", trained_tokenizer, vocab - 64, True)  # the tokenizer is written before this check
    result = cli("import", tmp_path / "short", "-o", tmp_path / "run")
    assert result.code == 2 and "tokens but the model only" in result.stderr
    assert not (tmp_path / "run").exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    assert cli("import", tmp_path / "short", "-o", tmp_path / "kept").code == 2
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["notes.txt"]  # only what it added is gone


def test_a_vocabulary_padded_past_the_tokenizer_imports_and_is_never_generated(cli, tmp_path, trained_tokenizer, tiny_corpus):
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    padded = vocab + 64 - vocab % 64  # as nanoGPT pads GPT-2's 50,257 to 50,304
    hf = _hub_style_gpt2(tmp_path / "gpt2", trained_tokenizer, padded, True)
    with torch.no_grad():
        hf.lm_head.weight[vocab:] = 5.0  # the padding rows would win every step if they were ever chosen
    hf.save_pretrained(str(tmp_path / "gpt2"), safe_serialization=True)
    result = cli("import", tmp_path / "gpt2", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    ours = load_checkpoint(tmp_path / "run")
    assert ours.config.model.vocab_size == padded and ours.tokenizer.vocab_size == vocab
    ids = torch.randint(0, vocab, (1, 20))
    with torch.no_grad():
        assert (hf(ids).logits - ours.model(ids).logits).abs().max().item() < 1e-4
    result = cli("generate", tmp_path / "run", "-p", "Once upon a time", "--max-new-tokens", "12", "--json")
    assert result.code == 0, result.stderr
    (completion,) = json.loads(result.stdout)["completions"]
    assert completion["tokens"] and max(completion["tokens"]) < vocab
    info = cli("info", tmp_path / "run")
    assert info.code == 0 and f"model vocabulary {padded:,}" in info.stdout and "problem" not in info.stdout
    assert cli("eval", tmp_path / "run", "--data", tiny_corpus).code == 0
    assert cli("export", tmp_path / "run", "--to", "hf", "-o", tmp_path / "again").code == 0
    assert json.loads((tmp_path / "again" / "config.json").read_text())["vocab_size"] == padded


def test_a_full_disk_during_export_or_import_is_one_line_and_leaves_nothing(cli, tmp_path, trained_tokenizer, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    tokenizer = TextTokenizer.load(trained_tokenizer)
    save_checkpoint(tmp_path / "run", Transformer(_gpt2_shaped(tokenizer.vocab_size)), tokenizer)
    assert cli("export", tmp_path / "run", "-o", tmp_path / "hf").code == 0

    def full(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    for command in (["export", tmp_path / "run", "-o", tmp_path / "hf2"], ["import", tmp_path / "hf", "-o", tmp_path / "run2"]):
        result = cli(*command)
        assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "could not finish" in result.stderr and "No space left" in result.stderr
        assert not (tmp_path / str(command[-1])).exists()


def test_import_and_export_never_overwrite(cli, tmp_path, trained_tokenizer):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    save_checkpoint(tmp_path / "run", Transformer(_gpt2_shaped(tokenizer.vocab_size)), tokenizer)
    before = (tmp_path / "run" / "model.safetensors").read_bytes()
    assert cli("export", tmp_path / "run", "-o", tmp_path / "hf").code == 0
    exported = (tmp_path / "hf" / "model.safetensors").read_bytes()
    result = cli("export", tmp_path / "run", "-o", tmp_path / "hf")
    assert result.code == 2 and "already holds an exported model" in result.stderr
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")  # onto the run it came from
    assert result.code == 2 and "already holds a tfcli run" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = cli("export", tmp_path / "run", "-o", tmp_path / "run")  # onto a run, not an export
    assert result.code == 2 and "already holds a tfcli run" in result.stderr
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == exported
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "again").code == 0
    result = cli("import", tmp_path / "run", "-o", tmp_path / "third")  # a tfcli run is not a GPT-2 folder
    assert result.code == 2 and "is a tfcli run already" in result.stderr


def test_a_killed_import_leaves_no_half_run_and_the_next_import_clears_what_it_left(cli, tmp_path, trained_tokenizer):
    """The run is made in a locked staging folder beside -o and moved into place whole: a kill -9 during the
    import leaves no folder holding only the tokenizer, and the next import to that place removes the staging folder."""
    import subprocess
    import sys

    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    _hub_style_gpt2(tmp_path / "gpt2", trained_tokenizer, vocab, True)
    stop = "import os, signal\nimport tfcli.checkpoint as c\nimport tfcli.hf.convert as h\n"
    stop += "h.save_checkpoint = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # killed once the tokenizer is written\n"
    stop += f"h.import_hf({str(tmp_path / 'gpt2')!r}, {str(tmp_path / 'run')!r})\n"
    killed = subprocess.run([sys.executable, "-c", stop], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]
    assert not (tmp_path / "run").exists() and len(left) == 1 and (left[0] / "tokenizer.json").is_file()
    os.utime(left[0], (0, 0))  # older than a writer's first moments
    result = cli("import", tmp_path / "gpt2", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    assert "removed 1 temporary file" in result.stderr + result.stdout and not left[0].exists()
    assert load_checkpoint(tmp_path / "run").config.model.n_layers == 3
