"""QLoRA: `train finetune --lora-rank` over a quantized run trains LoRA adapters while the base stays in its block
bytes (QuantLinear, frozen, never widened to f32 whole); gradients reach every adapter through the blocks; the
adapter run loads everywhere (decoding keeps the blocks and the adapter beside them); PEFT loads the exported
adapter over the dequantized base with tfcli's logits; resume is exact; whole fine-tuning is refused in one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_TEXT
from tests.helpers import in_ci, missing_tool
from tfcli.adapters import AdapterRecord
from tfcli.adapters.lora import LoraLinear, apply_lora, check_rank
from tfcli.checkpoint import load_checkpoint, quantize_run, save_checkpoint
from tfcli.loader import load_run, prepare
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Loss, Transformer
from tfcli.quant import linear
from tfcli.quant.linear import QuantEmbedding, QuantLinear
from tfcli.tokenizer.core import TextTokenizer

STEPS = ["--block-size", "32", "--max-steps", "6", "--log-every", "1", "--batch-size", "8", "--lr", "1e-2"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def qlora(tmp_path_factory, trained_tokenizer) -> dict:
    """A tiny GPT-2-shaped run, quantized to q8_0 (every matrix and the embedding in blocks), shards of the tiny
    text, and a QLoRA run of 6 steps over the quantized run."""
    from tfcli.cli.app import main
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus

    folder = tmp_path_factory.mktemp("qlora")
    corpus = folder / "corpus.txt"
    corpus.write_text(TINY_TEXT * 30, encoding="utf-8")
    tokenizer = TextTokenizer.load(trained_tokenizer)
    encode_corpus(resolve_corpus([corpus]), tokenizer, folder / "shards", val_fraction=0.2)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layers=2, n_heads=2, d_model=64, d_ff=128, activation="gelu_tanh")
    save_checkpoint(folder / "f32", Transformer(config).eval(), tokenizer)
    quantize_run(folder / "f32", folder / "q8", "q8_0")
    before = _sha256(folder / "q8" / "model.safetensors")
    run = folder / "qlora"
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in finetune(folder, run)])
    assert exit_info.value.code == 0
    return {"folder": folder, "shards": folder / "shards", "q8": folder / "q8", "run": run, "sha256": before}


def finetune(folder: Path, out: Path, *extra, lora: tuple = ("--lora-rank", "4")) -> list:
    return ["train", "finetune", "--init-from", folder / "q8", "--task", "lm", "--data", folder / "shards", "-o", out, *STEPS, *lora, *extra]


def _record(config: ModelConfig) -> AdapterRecord:
    groups = ["qkv", "out", "mlp"]
    return AdapterRecord(
        rank=4, alpha=8.0, targets=groups, modules=check_rank(config, 4, groups), parent="p", parent_path="/p", parent_weights_bytes=0, parent_weights_sha256=""
    )


def test_qlora_trains_the_adapters_and_leaves_the_quantized_parent_as_it_was(qlora):
    run = qlora["run"]
    losses = [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(losses) == 6 and sum(losses[-3:]) < sum(losses[:3]), losses  # the loss goes down
    assert _sha256(qlora["q8"] / "model.safetensors") == qlora["sha256"]  # the blocks, byte for byte
    config = json.loads((run / "config.json").read_text())
    assert config["quantized"] is None and config["adapter"]["parent_weights_sha256"] == qlora["sha256"]
    assert (run / config["adapter"]["parent"]).resolve() == qlora["q8"].resolve()
    assert "model.safetensors" not in {p.name for p in run.iterdir()} and (run / "adapter_model.safetensors").is_file()
    from safetensors.torch import load_file

    assert all(".lora_" in key for key in load_file(str(run / "trainer" / "optimizer.safetensors")))  # state for the adapters alone


def test_the_base_stays_in_blocks_and_gradients_reach_every_adapter_as_over_the_dequantized_weights(qlora, monkeypatch):
    monkeypatch.setattr(linear, "SLAB_VALUES", 1000)  # several slabs per product, forward and backward
    model = load_run(qlora["q8"], "lora-parent").model
    torch.manual_seed(1)
    apply_lora(model, _record(model.config))
    prepare(model, "train", "cpu")
    assert isinstance(model.tok_emb, QuantEmbedding) and isinstance(model.lm_head, QuantLinear)
    bases = [m.base_layer for m in model.modules() if isinstance(m, LoraLinear)]
    assert len(bases) == 8 and all(isinstance(b, QuantLinear) for b in bases)
    blocks = {name: b.clone() for name, b in model.named_buffers() if name.endswith(".blocks")}
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLinear):
                module.lora_B.weight.normal_(0, 0.2)  # B = 0 would leave A without a gradient
    reference = load_checkpoint(qlora["q8"]).model  # every weight dequantized to f32
    torch.manual_seed(1)
    apply_lora(reference, _record(reference.config))
    reference.load_state_dict({k: v for k, v in model.state_dict().items() if ".lora_" in k}, strict=False)

    shapes = {(m.out_features, m.in_features) for m in model.modules() if isinstance(m, QuantLinear)}
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append((tuple(tensor.shape), tensor.dtype))
        return tensor

    ids, targets = torch.randint(0, 300, (2, 16)), torch.randint(0, 300, (2, 16))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(ids, head=Loss(targets)).loss
    loss.backward()
    reference(ids, head=Loss(targets)).loss.backward()
    assert saved and not [s for s in saved if s[0] in shapes and s[1].is_floating_point]  # no weight kept for backward
    held = [*model.named_parameters(), *model.named_buffers()]
    assert not [name for name, t in held if tuple(t.shape) in shapes and t.is_floating_point()]  # nor anywhere in the model

    theirs = dict(reference.named_parameters())
    trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert len(trained) == 16 and all(".lora_" in name for name in trained)
    for name, parameter in trained.items():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
        torch.testing.assert_close(parameter.grad, theirs[name].grad, rtol=1e-4, atol=1e-5)
    torch.optim.AdamW(trained.values(), lr=1e-2).step()
    assert all(torch.equal(b, blocks[name]) for name, b in model.named_buffers() if name in blocks)


def test_a_qlora_run_decodes_over_the_blocks_and_every_command_loads_it(qlora, cli, monkeypatch):
    run = qlora["run"]
    monkeypatch.setenv("TFCLI_QUANT_PATH", "torch")  # the dequantized product: the same sums as f32 weights
    decoding = load_run(run, "decode").model
    wrapped = [m for m in decoding.modules() if isinstance(m, LoraLinear)]
    assert len(wrapped) == 8 and all(isinstance(m.base_layer, QuantLinear) for m in wrapped)  # blocks kept, the adapter beside
    inspected = load_run(run, "inspect")  # dequantized, the adapter merged: a plain model
    assert not any(isinstance(m, (LoraLinear, QuantLinear)) for m in inspected.model.modules())
    assert inspected.notes == [f"{run}'s parent's q8_0 weights were dequantized to f32 (for inspect)"]
    ids = torch.randint(0, 300, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(decoding(ids).logits, inspected.model(ids).logits, rtol=1e-4, atol=1e-4)
    monkeypatch.delenv("TFCLI_QUANT_PATH")
    for args in (
        ["generate", run, "--prompt", "The fox", "--max-new-tokens", "4", "--temperature", "0"],
        ["eval", run, "--data", qlora["shards"]],
        ["info", run],
        ["inspect-attention", run, "--text", "The fox saw the ball.", "--format", "json"],
    ):
        result = cli(*args)
        assert result.code == 0, (args, result.stderr)


def test_peft_loads_the_exported_qlora_adapter_over_the_dequantized_base(qlora, cli, tmp_path):
    try:
        import peft
        import transformers
    except ImportError:
        if in_ci():
            raise
        missing_tool("peft and transformers are not installed")
    result = cli("export", qlora["run"], "--to", "hf", "-o", tmp_path / "hf")
    assert result.code == 0, result.stderr
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf" / "base")).eval()
    peft_model = peft.PeftModel.from_pretrained(base, str(tmp_path / "hf" / "adapter")).eval()
    ids = torch.randint(5, 300, (2, 12))
    with torch.no_grad():
        theirs, ours = peft_model(input_ids=ids).logits, load_run(qlora["run"], "inspect").model(ids).logits
    assert (theirs - ours).abs().max().item() < 1e-4  # the same function: PEFT over the f32 base is tfcli's merged model


def test_a_stopped_qlora_run_resumes_to_the_same_adapter(qlora, cli, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from tfcli.train.trainer import Trainer

    stop_reason = Trainer.stop_reason
    monkeypatch.setattr(Trainer, "stop_reason", lambda self, received: stop_reason(self, received or self.step == 4))  # as a Ctrl-C after step 4
    broken = tmp_path / "broken"
    assert cli(*finetune(qlora["folder"], broken)).code != 0
    assert json.loads((broken / "trainer" / "state.json").read_text())["step"] == 4
    monkeypatch.setattr(Trainer, "stop_reason", stop_reason)
    result = cli(*finetune(qlora["folder"], broken, "--resume"))
    assert result.code == 0, result.stderr
    a, b = load_file(str(qlora["run"] / "adapter_model.safetensors")), load_file(str(broken / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_whole_fine_tuning_of_a_quantized_run_is_refused_in_one_line(qlora, cli, tmp_path):
    result = cli(*finetune(qlora["folder"], tmp_path / "whole", lora=()))
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "holds quantized weights (q8_0); training starts from f32 weights" in result.stderr and "--lora-rank" in result.stderr
    assert not (tmp_path / "whole" / "config.json").exists()


def test_an_adapter_run_over_a_qlora_run_decodes_merged_and_says_so(qlora, cli, tmp_path):
    """A chain (LoRA over the QLoRA run over the quantized run): only a QLoRA run's own parent stays in blocks, so the
    chain loads merged into f32, and the note names the quantized ancestor."""
    chain = tmp_path / "chain"
    result = cli("train", "finetune", "--init-from", qlora["run"], "--task", "lm", "--data", qlora["shards"], "-o", chain, *STEPS, "--lora-rank", "4")
    assert result.code == 0, result.stderr
    loaded = load_run(chain, "decode")
    assert not any(isinstance(m, (LoraLinear, QuantLinear)) for m in loaded.model.modules())
    assert loaded.notes == [f"{chain}'s quantized ancestor's q8_0 weights were dequantized to f32 (for decode)"]
