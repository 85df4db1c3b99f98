"""LoRA (`train finetune --lora-rank`): the adapter layer, with and without tfcli.accel; adapter runs that
save megabytes and load onto their parent everywhere; merge; PEFT loading the exported adapter with
tfcli's logits; exact resume; two gloo ranks; the refusals."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_TEXT, forget_accel
from tests.helpers import ddp_start_up_broadcast
from tfcli.adapters import AdapterRecord
from tfcli.adapters.lora import LoraLinear, adapter_tensors, apply_lora, base_state, check_rank, merged_state
from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.model.config import ModelConfig, RopeScaling
from tfcli.model.transformer import Loss, Transformer
from tfcli.tokenizer.core import TextTokenizer

TINY = dict(block_size=32, n_layers=2, n_heads=4, d_model=32, d_ff=64)


def _record(config: ModelConfig, rank: int = 4, groups=("qkv", "out", "mlp"), **extra) -> AdapterRecord:
    fields = dict(parent="p", parent_path="/p", parent_weights_bytes=0, parent_weights_sha256="")
    fields.update(extra)
    return AdapterRecord(rank=rank, alpha=2.0 * rank, targets=list(groups), modules=check_rank(config, rank, groups), **fields)


def _randomise_adapters(model) -> None:
    """B starts at zero; a trained adapter does not: give every A and B values, so a wrong path shows."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLinear):
                module.lora_B.weight.normal_(0, 0.2)


# ---- the layer ---------------------------------------------------------------------------------------


def test_an_adapter_starts_as_the_base_model_and_trains_only_its_own_weights():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, **TINY)
    model = Transformer(config).eval()
    ids = torch.randint(0, 50, (2, 10))
    before = model(ids).logits
    apply_lora(model, _record(config))
    assert torch.equal(model(ids).logits, before)  # B = 0: step 0 is the base model
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    assert len(trainable) == 2 * 4 * config.n_layers  # qkv, out, fc, proj in each layer
    wrapped = {name for name, m in model.named_modules() if isinstance(m, LoraLinear)}
    assert wrapped == {f"decoder.blocks.{i}.{s}" for i in range(2) for s in ("attn.qkv", "attn.out", "mlp.fc", "mlp.proj")}


@pytest.mark.parametrize("order", ["accelerate-then-wrap", "wrap-then-accelerate"])
def test_an_accelerated_adapter_model_computes_the_plain_ones_logits_and_gradients(order, monkeypatch):
    from tfcli.accel import accelerate, products

    monkeypatch.delenv("TFCLI_ACCEL", raising=False)
    forget_accel()
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, block_size=64, n_layers=2, n_heads=4, d_model=64, d_ff=256)
    plain = Transformer(config)
    fast = Transformer(config)
    fast.load_state_dict(plain.state_dict())
    record = _record(config, rank=8)
    torch.manual_seed(1)
    apply_lora(plain, record)
    if order == "accelerate-then-wrap":
        accelerate(fast)
        torch.manual_seed(1)
        apply_lora(fast, record)
    else:
        torch.manual_seed(1)
        apply_lora(fast, record)
        accelerate(fast)
    torch.manual_seed(2)
    _randomise_adapters(plain)
    torch.manual_seed(2)
    _randomise_adapters(fast)
    assert any(isinstance(m, products.Linear) for m in fast.modules())
    ids = torch.randint(0, 300, (4, 64))
    targets = torch.randint(0, 300, (4, 64))
    losses = []
    for model in (plain, fast):
        loss = model(ids, head=Loss(targets)).loss
        loss.backward()
        losses.append(loss.item())
        assert all(p.grad is None for n, p in model.named_parameters() if ".lora_" not in n)  # the base gets no gradient
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    with torch.no_grad():
        assert (plain.eval()(ids).logits - fast.eval()(ids).logits).abs().max().item() < 1e-4
    grads = {n: p.grad for n, p in plain.named_parameters() if p.grad is not None}
    for name, p in fast.named_parameters():
        if name in grads:
            assert (p.grad - grads[name]).abs().max().item() <= 1e-4 * grads[name].abs().max().item() + 1e-6, name
    forget_accel()


def test_merging_gives_the_adapter_models_logits():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, positions="rotary", norm="rmsnorm", activation="swiglu", n_kv_heads=2, bias=False, **TINY)
    model = apply_lora(Transformer(config), _record(config, rank=4, groups=("qkv", "mlp")))
    _randomise_adapters(model)
    model.eval()
    merged = Transformer(config).eval()
    merged.load_state_dict(merged_state(base_state(model), model.lora, adapter_tensors(model)))
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        assert (model(ids).logits - merged(ids).logits).abs().max().item() < 1e-5


def test_a_rank_past_the_smallest_targeted_layer_is_refused():
    from tfcli.errors import TfcliError

    config = ModelConfig(vocab_size=50, **TINY)
    assert len(check_rank(config, 32, ("qkv",))) == 2
    with pytest.raises(TfcliError, match=r"--lora-rank 33 is larger than the smallest targeted layer .*32 -> 96.*at most 32"):
        check_rank(config, 33, ("qkv",))


# ---- adapter runs through the commands ---------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    """Shards of the tiny text and a tiny decoder run pretrained on them (the parent of the adapters)."""
    from tfcli.cli.app import main
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus

    folder = tmp_path_factory.mktemp("lora")
    corpus = folder / "corpus.txt"
    corpus.write_text(TINY_TEXT * 30, encoding="utf-8")
    shutil.copytree(trained_tokenizer, folder / "tokenizer")
    encode_corpus(resolve_corpus([corpus]), TextTokenizer.load(folder / "tokenizer"), folder / "shards", val_fraction=0.2)
    parent = folder / "parent"
    args = ["train", "pretrain", "--data", folder / "shards", "-o", parent, "--block-size", "32", "--batch-size", "8", "--max-steps", "30"]
    args += ["--set", "d_model=32", "--set", "n_heads=2", "--set", "n_layers=2", "--set", "d_ff=64", "--lr", "3e-3"]
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    assert exit_info.value.code == 0
    labeled = folder / "reviews.jsonl"
    lines = [json.dumps({"text": f"the {'fox' if i % 2 else 'dog'} saw the ball", "label": "fox" if i % 2 else "dog"}) for i in range(60)]
    labeled.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"shards": folder / "shards", "parent": parent, "labeled": labeled}


def lora_args(base, out: Path, *extra) -> list:
    """A fine-tune without --lora-rank."""
    return ["train", "finetune", "--init-from", base["parent"], "--task", "lm", "--data", base["shards"], "-o", out, "--block-size", "32", *extra]


def finetune(base, out: Path, *extra) -> list:
    common = ["--block-size", "32", "--batch-size", "8", "--lr", "1e-2", "--log-every", "1", "--lora-rank", "4"]
    return ["train", "finetune", "--init-from", base["parent"], "--task", "lm", "--data", base["shards"], "-o", out, *common, *extra]


def test_a_lora_run_keeps_only_the_adapter_and_every_command_loads_it(cli, base, tmp_path):
    run = tmp_path / "lora"
    result = cli(*finetune(base, run, "--max-steps", "12", "--eval-every", "6", "--keep-checkpoints", "6", "--lora-targets", "qkv,mlp"))
    assert result.code == 0, result.stderr
    assert "trainable, " in result.stderr and "%)" in result.stderr  # the trainable count and its share
    names = {p.name for p in run.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "config.json", "tokenizer.json", "trainer", "best"} <= names
    assert "model.safetensors" not in names and "model.safetensors" not in {p.name for p in (run / "best").iterdir()}
    config = json.loads((run / "config.json").read_text())
    assert (run / config["adapter"]["parent"]).resolve() == base["parent"].resolve() and not Path(config["adapter"]["parent"]).is_absolute()
    assert config["adapter"]["rank"] == 4 and config["adapter"]["alpha"] == 8.0 and config["adapter"]["targets"] == ["qkv", "mlp"]
    peft = json.loads((run / "adapter_config.json").read_text())
    assert peft["peft_type"] == "LORA" and peft["r"] == 4 and peft["base_model_name_or_path"] == str(base["parent"].resolve())
    from safetensors.torch import load_file

    keys = sorted(load_file(str(run / "adapter_model.safetensors")))
    assert keys[0] == "base_model.model.decoder.blocks.0.attn.qkv.lora_A.weight" and len(keys) == 2 * 3 * 2
    optimizer = load_file(str(run / "trainer" / "optimizer.safetensors"))
    assert optimizer and all(".lora_" in key for key in optimizer)  # optimizer state for the adapters alone
    assert (run / "adapter_model.safetensors").stat().st_size < (base["parent"] / "model.safetensors").stat().st_size / 4

    # the adapter changed the model, and the loaded model is the parent's weights plus B A
    parent, loaded = load_checkpoint(base["parent"]).model, load_checkpoint(run).model
    assert not any(isinstance(m, LoraLinear) for m in loaded.modules())  # merged: a plain model
    kept = load_checkpoint(run / "checkpoints" / "step-0000012").model  # kept checkpoints are adapters on the same parent
    assert all(torch.equal(a, b) for a, b in zip(kept.state_dict().values(), loaded.state_dict().values()))
    assert not torch.equal(parent.decoder.blocks[0].attn.qkv.weight, loaded.decoder.blocks[0].attn.qkv.weight)
    assert torch.equal(parent.decoder.blocks[0].attn.out.weight, loaded.decoder.blocks[0].attn.out.weight)  # not targeted

    for args in (
        ["generate", run, "--prompt", "The fox", "--max-new-tokens", "5", "--seed", "1"],
        ["eval", run, "--data", base["shards"]],
        ["info", run],
        ["inspect-attention", run, "--text", "The fox saw the ball.", "--head", "0"],
    ):
        result = cli(*args)
        assert result.code == 0, (args, result.stderr)
    info = cli("info", run, "--json")
    data = json.loads(info.stdout)
    assert data["adapter"]["rank"] == 4 and data["weights_bytes"]["file"] == (run / "adapter_model.safetensors").stat().st_size

    # merge: a full run with the same logits
    merged = tmp_path / "merged"
    result = cli("export", run, "--merge", "-o", merged)
    assert result.code == 0, result.stderr
    assert (merged / "model.safetensors").is_file() and json.loads((merged / "config.json").read_text())["adapter"] is None
    ids = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        assert (load_checkpoint(merged).model(ids).logits - loaded(ids).logits).abs().max().item() < 1e-5
    assert cli("export", merged, "--merge", "-o", tmp_path / "again").code == 2  # nothing to merge

    # a moved parent: one line, exit 2, from every command; moving both together keeps working
    moved = base["parent"].with_name("parent-moved")
    base["parent"].rename(moved)
    try:
        for args in (["generate", run, "--prompt", "The fox", "--max-new-tokens", "2"], ["eval", run, "--data", base["shards"]]):
            result = cli(*args)
            assert result.code == 2 and "is a LoRA adapter on the run" in result.stderr and "not there" in result.stderr, result.stderr
            assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
        assert cli("info", run).code == 1
    finally:
        moved.rename(base["parent"])


def test_a_lora_classifier_trains_its_new_head_whole(cli, base, tmp_path):
    run = tmp_path / "classify"
    args = ["train", "finetune", "--init-from", base["parent"], "--task", "classify", "--data", base["labeled"], "-o", run]
    result = cli(*args, "--lora-rank", "2", "--lora-targets", "qkv", "--max-steps", "6", "--batch-size", "8", "--lr", "1e-2")
    assert result.code == 0, result.stderr
    config = json.loads((run / "config.json").read_text())
    assert config["adapter"]["modules_to_save"] == ["classifier"]
    from safetensors.torch import load_file

    assert {"base_model.model.classifier.weight", "base_model.model.classifier.bias"} <= set(load_file(str(run / "adapter_model.safetensors")))
    result = cli("generate", run, "--classify", "the fox saw the ball")
    assert result.code == 0, result.stderr


def _adapter(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "adapter_model.safetensors"))


def test_a_killed_lora_run_resumes_bit_for_bit(cli, base, tmp_path):
    from tests.training import spawn, wait_for_step

    args = ["--max-steps", "24", "--save-every", "8", "--eval-every", "8", "--lora-dropout", "0.1"]
    whole = tmp_path / "whole"
    assert cli(*finetune(base, whole, *args)).code == 0
    broken = tmp_path / "broken"
    process = spawn(finetune(base, broken, *args))
    wait_for_step(broken, process, 10)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    saved = json.loads((broken / "trainer" / "state.json").read_text())["step"]
    assert saved % 8 == 0 and saved < 24
    result = cli(*finetune(base, broken, *args, "--resume"))
    assert result.code == 0, result.stderr
    a, b = _adapter(whole), _adapter(broken)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    changed = cli(*finetune(base, broken, *args, "--resume", "--max-steps", "30", "--lora-rank", "8"))
    assert changed.code == 2 and "lora_rank was 4, now 8" in changed.stderr


@pytest.mark.slow  # torchrun
def test_two_gloo_ranks_train_a_lora_run_like_one_process(cli, base, tmp_path):
    from tests.training import torchrun

    def args(out, batch):
        args = finetune(base, out, "--max-steps", "4", "--eval-every", "2")
        args[args.index("--batch-size") + 1] = str(batch)
        return [str(a) for a in args]

    # the ranks run while the reference, one process with the whole batch, runs here (one thread, as each rank)
    ranks = torchrun(args(tmp_path / "two", 4))
    reference = cli(*args(tmp_path / "one", 8))
    assert reference.code == 0, reference.stderr
    _, err = ranks.communicate(timeout=240)
    assert ranks.returncode == 0, err
    one, two = ([json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("one", "two"))
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2, 3, 4]
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-5
    a, b = _adapter(tmp_path / "one"), _adapter(tmp_path / "two")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6


def test_ddp_broadcasts_only_what_trains_of_a_lora_run():
    """Every rank reads the parent from the same file and no gradient changes its frozen weights: DDP sends the
    adapters from rank 0 as it starts, never the parent, and still averages the adapters' gradients. One rank
    of a gloo group in this process."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, **TINY)
    model = apply_lora(Transformer(config), _record(config))
    sent, _ = ddp_start_up_broadcast(model, torch.randint(0, 50, (2, 8)))
    adapters = {p.data_ptr() for p in model.parameters() if p.requires_grad}
    assert adapters and {t.data_ptr() for t in sent} == adapters  # the adapters went, no frozen weight with them
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)


def test_lora_refusals_are_one_line(cli, base, tmp_path):
    out = tmp_path / "run"
    cases = [
        (finetune(base, out, "--lora-rank", "0"), "--lora-rank must be at least 1, not 0"),
        (finetune(base, out, "--lora-rank", "-3"), "--lora-rank must be at least 1, not -3"),
        (finetune(base, out, "--lora-rank", "40"), "--lora-rank 40 is larger than the smallest targeted layer"),
        (finetune(base, out, "--lora-targets", "qkv,attn"), "lora_targets names an unknown group 'attn'"),
        (finetune(base, out, "--freeze", "embeddings"), "--freeze embeddings does not go with LoRA"),
        (lora_args(base, out, "--set", "lora_alpha=4"), "lora_alpha is for LoRA"),
        (["train", "pretrain", "--data", base["shards"], "-o", out, "--lora-rank", "4"], "No such option: --lora-rank"),
        (["train", "pretrain", "--data", base["shards"], "-o", out, "--set", "lora_rank=4"], "LoRA (lora_rank) is for fine-tuning"),
        (["export", base["parent"], "--merge", "-o", tmp_path / "merged"], "is not a LoRA run; there is nothing to merge"),
        (["export", base["parent"], "--to", "tfcli", "-o", tmp_path / "merged"], "--to tfcli writes a LoRA run merged"),
    ]
    for args, message in cases:
        result = cli(*args)
        assert result.code == 2 and message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
        assert not (out / "config.json").exists() and not (tmp_path / "merged").exists()


# ---- PEFT -------------------------------------------------------------------------------------------


def _adapter_run(tmp_path, trained_tokenizer, config: ModelConfig, groups, new_head: tuple[str, ...] = ()) -> tuple[Path, Transformer]:
    """A parent run of `config` (non-zero biases and norms) and an adapter run on it with random A and B."""
    from tfcli.adapters import describe_parent

    tokenizer = TextTokenizer.load(trained_tokenizer)
    torch.manual_seed(0)
    parent_config = ModelConfig.from_json({**config.to_json(), "n_classes": 0}) if new_head else config
    parent = Transformer(parent_config).eval()
    with torch.no_grad():
        for name, p in parent.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    save_checkpoint(tmp_path / "parent", parent, tokenizer)
    model = Transformer(config)
    model.load_state_dict(parent.state_dict(), strict=False)
    record = AdapterRecord(
        rank=4,
        alpha=8.0,
        targets=list(groups),
        modules=check_rank(config, 4, groups),
        modules_to_save=list(new_head),
        **describe_parent(tmp_path / "parent", tmp_path / "parent" / "model.safetensors"),
    )
    apply_lora(model, record)
    _randomise_adapters(model)
    save_checkpoint(tmp_path / "lora", model, tokenizer)
    return tmp_path / "lora", model.eval()


FAMILIES = {
    "gpt2": (dict(activation="gelu_tanh"), ("qkv", "out", "mlp"), ()),
    "llama": (dict(positions="rotary", norm="rmsnorm", activation="swiglu", n_kv_heads=2, bias=False, tie_embeddings=False), ("qkv", "out", "mlp"), ()),
    "qwen3": (dict(positions="rotary", norm="rmsnorm", activation="swiglu", n_kv_heads=2, bias=False, qk_norm=True, d_head=16), ("qkv", "out", "mlp"), ()),
    "phi3-longrope": (  # qkv_proj and gate_up_proj, fused as tfcli's: one A and B each
        dict(
            positions="rotary",
            norm="rmsnorm",
            activation="swiglu",
            bias=False,
            rope_scaling=RopeScaling("longrope", 2.0, 1.0, 4.0, 32, (1.0, 1.5, 2.0, 3.0), 1.1),
        ),
        ("qkv", "out", "mlp"),
        (),
    ),
    "gemma3": (  # q/k norms, sandwich norms (1 + weight in transformers), GeGLU, scaled embeddings, a local layer of 8 in 12 tokens
        dict(
            positions="rotary",
            norm="rmsnorm",
            activation="geglu",
            n_kv_heads=2,
            bias=False,
            qk_norm=True,
            d_head=16,
            post_norms=True,
            scale_embeddings=True,
            attn_scale=24**-0.5,
            sliding_window=8,
            local_layers=(0,),
            rope_local_base=500.0,
        ),
        ("qkv", "out", "mlp"),
        (),
    ),
    "bert-classifier": (
        dict(arch="encoder", norm_placement="post", embedding_norm=True, type_vocab_size=2, pooler=True, n_classes=3),
        ("qkv", "mlp"),
        ("classifier",),
    ),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_peft_loads_the_exported_adapter_with_tfcli_logits(cli, tmp_path, trained_tokenizer, family):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    overrides, groups, new_head = FAMILIES[family]
    tokenizer = TextTokenizer.load(trained_tokenizer)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, **{**TINY, **overrides})
    run, model = _adapter_run(tmp_path, trained_tokenizer, config, groups, new_head)
    result = cli("export", run, "--to", "hf", "-o", tmp_path / "hf")
    assert result.code == 0, result.stderr
    assert "PeftModel.from_pretrained" in result.stdout
    auto = transformers.AutoModelForSequenceClassification if new_head else transformers.AutoModelForCausalLM
    hf_base = auto.from_pretrained(str(tmp_path / "hf" / "base")).eval()
    peft_model = peft.PeftModel.from_pretrained(hf_base, str(tmp_path / "hf" / "adapter")).eval()
    ids = torch.randint(5, tokenizer.vocab_size, (2, 12))
    with torch.no_grad():
        if new_head:
            theirs, ours = peft_model(input_ids=ids).logits, load_checkpoint(run).model(ids).class_logits
        else:
            theirs, ours = peft_model(input_ids=ids).logits, load_checkpoint(run).model(ids).logits
        assert (theirs - ours).abs().max().item() < 1e-4
        assert (ours - model(ids).__getattribute__("class_logits" if new_head else "logits")).abs().max().item() < 1e-5
    # merged into one transformers folder: the same logits without PEFT
    result = cli("export", run, "--merge", "--to", "hf", "-o", tmp_path / "merged")
    assert result.code == 0, result.stderr
    with torch.no_grad():
        assert (auto.from_pretrained(str(tmp_path / "merged")).eval()(input_ids=ids).logits - theirs).abs().max().item() < 1e-4


def test_an_adapter_a_family_cannot_express_is_a_clear_error(cli, tmp_path, trained_tokenizer):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, positions="sinusoidal", **TINY)  # neither GPT-2 nor Llama
    run, _ = _adapter_run(tmp_path, trained_tokenizer, config, ("qkv",))
    result = cli("export", run, "--to", "hf", "-o", tmp_path / "hf")
    assert result.code == 2 and "cannot express this model" in result.stderr and not (tmp_path / "hf").exists()
