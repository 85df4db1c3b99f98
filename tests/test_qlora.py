"""QLoRA: `train finetune --lora-rank` over a quantized run trains LoRA adapters while the base stays in its block
bytes (QuantLinear, frozen, never widened to f32 whole, the output head in the loss neither); gradients reach every
adapter through the blocks; the adapter run loads everywhere (decoding keeps the blocks and the adapter beside them);
PEFT loads the exported adapter over the dequantized base with tfcli's logits; resume is exact; two DDP ranks train
like one process without broadcasting the blocks; whole fine-tuning and --fsdp are refused in one line."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_TEXT
from tests.helpers import ddp_start_up_broadcast, in_ci, missing_tool
from tfcli.accel import quantized_head
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


@pytest.mark.parametrize("loss", ["fused", "plain"])
def test_the_loss_reads_the_quantized_head_a_slab_at_a_time_with_the_whole_matrixs_loss_and_gradients(qlora, monkeypatch, loss):
    """The vocabulary loss reads a frozen quantized head a slab of rows at a time (the fused loss walks the slabs with
    an online log-sum-exp; the plain one goes through the head's own product), never as a whole float matrix: the
    loss and the adapters' gradients are those over the head's dequantized matrix, as the loss read it before."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tfcli.model.loss import IGNORE_INDEX, vocabulary_cross_entropy

    monkeypatch.setattr(linear, "SLAB_VALUES", 1000)  # the head (320 x 64) in 22 slabs
    monkeypatch.setattr(quantized_head, "SLAB_VALUES", 1000)
    model = load_run(qlora["q8"], "lora-parent").model
    torch.manual_seed(1)
    apply_lora(model, _record(model.config))
    prepare(model, "train", "cpu")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLinear):
                module.lora_B.weight.normal_(0, 0.2)
    head = model.lm_head
    reference = copy.deepcopy(model)  # the head read whole, as before: a frozen float matrix of the dequantized blocks
    reference.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=False).requires_grad_(False)
    reference.lm_head.weight.copy_(head.dequantized())
    if loss == "plain":
        model.vocabulary_loss = reference.vocabulary_loss = vocabulary_cross_entropy
    ids, targets = torch.randint(0, 300, (2, 16)), torch.randint(0, 300, (2, 16))
    targets[0, :3] = IGNORE_INDEX

    whole = (head.out_features, head.in_features)
    made: list[tuple[int, ...]] = []

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            made.extend(tuple(t.shape) for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())
            return out

    def refuse(self):
        raise AssertionError("the whole head was dequantized")

    with monkeypatch.context() as patch:
        patch.setattr(QuantLinear, "dequantized", refuse)
        patch.setattr(QuantEmbedding, "weight", property(refuse))
        with Shapes():
            value = model(ids, head=Loss(targets, 0.1)).loss
            value.backward()
    assert made and whole not in made and whole[::-1] not in made
    expected = reference(ids, head=Loss(targets, 0.1)).loss
    expected.backward()
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=0)
    theirs = dict(reference.named_parameters())
    trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert len(trained) == 16
    for name, parameter in trained.items():  # float sums in another order: 1e-5 of the gradient's size
        assert (parameter.grad - theirs[name].grad).norm() <= 1e-5 * theirs[name].grad.norm(), name


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("softcap, smoothing", [(None, 0.0), (20.0, 0.1)])
def test_the_fused_loss_over_a_quantized_head_with_a_bias_is_the_loss_over_its_matrix(monkeypatch, grad, softcap, smoothing):
    """A head with a bias (an encoder's), rows without a target, with and without label smoothing and a soft cap:
    the loss over the blocks, in several blocks of rows and slabs of the head, gives the value and the hidden
    states' gradient that the fused loss gives over the dequantized matrix."""
    from tfcli.accel.fused_loss import linear_cross_entropy
    from tfcli.model.loss import IGNORE_INDEX
    from tfcli.quant.formats import quantize
    from tfcli.quant.tensors import Blocks

    monkeypatch.setattr(quantized_head, "SLAB_VALUES", 1000)  # 15 rows of the head a slab
    monkeypatch.setattr(quantized_head, "SLAB_LOGITS", 1000)  # 66 rows of hidden states a block
    torch.manual_seed(0)
    values = torch.randn(300, 64)
    head = QuantLinear(Blocks(torch.from_numpy(quantize(values.numpy(), "q4_0")), "q4_0", (300, 64)), torch.randn(300))
    matrix = head.dequantized()
    targets = torch.randint(0, 300, (200,))
    targets[::7] = IGNORE_INDEX
    results = []
    for weight, bias in ((head, None), (matrix, head.bias.detach())):
        hidden = torch.randn(200, 64, generator=torch.Generator().manual_seed(1)).requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            loss = linear_cross_entropy(hidden, weight, bias, targets, smoothing, softcap)
        if grad:
            loss.backward()
        results.append((loss.detach(), hidden.grad))
    (ours, our_grad), (theirs, their_grad) = results
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=0)
    if grad:
        assert (our_grad - their_grad).norm() <= 1e-5 * their_grad.norm()


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


@pytest.mark.slow  # torchrun
def test_two_gloo_ranks_train_a_qlora_run_like_one_process(qlora, cli, tmp_path):
    """DDP over a quantized parent: each rank holds the same blocks (read from the same file), only the adapters'
    gradients are averaged, and two ranks of 4 rows end with the adapter of one process of 8."""
    from safetensors.torch import load_file

    from tests.training import torchrun

    def args(out: Path, batch: int) -> list[str]:
        args = [str(a) for a in finetune(qlora["folder"], out, "--max-steps", "3", "--eval-every", "3")]
        args[args.index("--batch-size") + 1] = str(batch)
        return args

    ranks = torchrun(args(tmp_path / "two", 4))  # the ranks run while the reference runs here (one thread, as each rank)
    reference = cli(*args(tmp_path / "one", 8))
    assert reference.code == 0, reference.stderr
    _, err = ranks.communicate(timeout=240)
    assert ranks.returncode == 0, err
    one, two = ([json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("one", "two"))
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2, 3]
    assert all(abs(a["loss"] - b["loss"]) < 1e-5 for a, b in zip(one, two)), (one, two)
    a, b = (load_file(str(tmp_path / run / "adapter_model.safetensors")) for run in ("one", "two"))
    # a rank multiplies 4 rows a step, the one process 8: accel measures each shape class's products on its own (the
    # frozen blocks' too), so sums may run in another order; an unaveraged gradient would be off by ~lr (1e-2)
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert _sha256(qlora["q8"] / "model.safetensors") == qlora["sha256"]


def test_fsdp_over_a_quantized_parent_is_refused_in_one_line(qlora, cli, tmp_path):
    result = cli(*finetune(qlora["folder"], tmp_path / "fsdp", "--fsdp"))
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--fsdp does not go with LoRA" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "fsdp" / "config.json").exists()


def test_ddp_leaves_the_quantized_parents_blocks_where_they_are(qlora):
    """Every rank reads the parent's blocks from the same file: DDP broadcasts the adapters from rank 0 as it
    starts, never the block bytes (nor any frozen parameter). One rank of a gloo group in this process."""
    model = load_run(qlora["q8"], "lora-parent").model
    apply_lora(model, _record(model.config))
    sent, ddp = ddp_start_up_broadcast(model)
    assert ddp is not None and sent and all(t.is_floating_point() for t in sent)  # something went, no block bytes
    assert sum(t.numel() for t in sent) < sum(t.numel() for t in model.buffers() if t.dtype == torch.uint8)
    adapters = [t for t in model.parameters() if t.requires_grad]
    assert adapters and {t.data_ptr() for t in adapters} <= {t.data_ptr() for t in sent}


def test_the_qlora_step_script_runs_on_a_tiny_model(capsys):
    """scripts/qlora_step.py (the QLoRA figures in docs/guide/lora.md) on a tiny model: a random model's loss is about
    log(vocab) a token, and the peak RSS it reports only grows."""
    import importlib.util
    import math
    import re

    spec = importlib.util.spec_from_file_location("qlora_step", Path(__file__).resolve().parent.parent / "scripts" / "qlora_step.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--d-model", "64", "--vocab", "300", "--layers", "1", "--rows", "2", "--tokens", "16", "--steps", "2"])
    line = capsys.readouterr().out.strip()
    found = re.fullmatch(r"loss ([\d.]+)  step ([\d.]+) s \(CPU ([\d.]+) s\)  peak RSS (\d+) MB before the steps, (\d+) MB after", line)
    assert found, line
    loss, wall, cpu, before, after = map(float, found.groups())
    assert abs(loss / 32 - math.log(300)) < 0.5 and 0 < before <= after and wall > 0 and cpu > 0
