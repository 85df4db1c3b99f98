"""--optimizer muon: torch.optim.Muon on the blocks' weight matrices, AdamW on the rest, each at its own rate under
one schedule; the settings that go with it and those that do not."""

from __future__ import annotations

import math

import pytest
import torch

from tfcli.errors import TfcliError
from tfcli.model.config import preset
from tfcli.model.transformer import Transformer
from tfcli.train.optim import MuonWithAdamW, hidden_matrices, load_optimizer_tensors, make_optimizer, optimizer_tensors, set_lr_factor
from tfcli.training_config import TrainConfig

TINY = dict(vocab_size=50, d_model=16, n_heads=2, n_layers=2, d_ff=32, block_size=8)


def tiny_model(**changes) -> Transformer:
    torch.manual_seed(0)
    return Transformer(preset("tiny", **{**TINY, **changes})).eval()  # no dropout: two copies compute alike


def names_of(model, parameters) -> set[str]:
    ids = {id(p) for p in parameters}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def backward(model, seed: int) -> None:
    ids = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]), generator=torch.Generator().manual_seed(seed))
    model(ids).logits.square().mean().backward()


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_muon_takes_the_blocks_matrices_and_adamw_everything_else(arch):
    model = tiny_model(arch=arch, tie_embeddings=False) if arch == "decoder" else tiny_model(arch=arch)
    optimizer = make_optimizer(model, TrainConfig(optimizer="muon"), torch.device("cpu"))
    assert isinstance(optimizer, MuonWithAdamW)
    muon = names_of(model, [p for g in optimizer.muon.param_groups for p in g["params"]])
    adamw = names_of(model, [p for g in optimizer.adamw.param_groups for p in g["params"]])
    stack = "decoder" if arch == "decoder" else "encoder"
    expected = {f"{stack}.blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.out", "mlp.fc", "mlp.proj")}
    assert muon == expected
    assert muon.isdisjoint(adamw) and muon | adamw == {name for name, _ in model.named_parameters()}
    assert "tok_emb.weight" in adamw and f"{stack}.norm.weight" in adamw and f"{stack}.blocks.0.attn.qkv.bias" in adamw
    assert ("lm_head.weight" if arch == "decoder" else "mlm_transform.weight") in adamw  # the untied output layer; the MLM head's transform


def test_adamw_alone_keeps_the_optimizer_it_always_was():
    model = tiny_model()
    optimizer = make_optimizer(model, TrainConfig(), torch.device("cpu"))
    assert type(optimizer) is torch.optim.AdamW and hidden_matrices(model)


def newton_schulz(matrix: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Keller Jordan's quintic Newton-Schulz iteration in bfloat16 (X <- aX + (bA + cA^2)X, A = XX^T), with its
    two products fused as torch fuses them (addmm), so the roundings agree."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = matrix.bfloat16()
    tall = matrix.size(0) > matrix.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def test_muon_steps_equal_torch_muon_and_adamw_applied_by_hand():
    """Two updates at a schedule factor of 0.5: tfcli's optimizer against torch.optim.Muon over the hidden
    matrices and torch.optim.AdamW over the rest, built by hand on a copy of the same model; the first Muon
    update also against the formula (momentum, Newton-Schulz, the rate scaled by sqrt(max(1, rows / cols)))."""
    config = TrainConfig(optimizer="muon", lr=3e-3, muon_lr=0.02, muon_momentum=0.95, muon_weight_decay=0.01, weight_decay=0.1)
    model, reference = tiny_model(), tiny_model()
    ours = make_optimizer(model, config, torch.device("cpu"))
    set_lr_factor(ours, 0.5)

    matrices = hidden_matrices(reference)
    others = names_of(reference, matrices)
    decay = [p for n, p in reference.named_parameters() if n not in others and p.dim() >= 2 and n not in ("tok_emb.weight", "pos_emb.weight")]
    plain = [p for n, p in reference.named_parameters() if n not in others and not (p.dim() >= 2 and n not in ("tok_emb.weight", "pos_emb.weight"))]
    by_hand = [
        torch.optim.Muon(matrices, lr=0.02 * 0.5, weight_decay=0.01, momentum=0.95, nesterov=True),
        torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}], lr=3e-3 * 0.5, betas=(0.9, 0.95), eps=1e-8),
    ]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for seed in (1, 2):
        backward(model, seed)
        backward(reference, seed)
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        ours.step()
        ours.zero_grad()
        for optimizer in by_hand:
            optimizer.step()
            optimizer.zero_grad()
        if seed == 1:  # the formula, for one matrix of each shape
            for name in ("decoder.blocks.0.attn.qkv.weight", "decoder.blocks.0.mlp.proj.weight"):
                grad, weight = grads[name], before[name]
                update = newton_schulz(grad.lerp(grad * 0.05, 0.95))  # Nesterov on a buffer that was zero
                rate = 0.02 * 0.5 * math.sqrt(max(1, weight.size(0) / weight.size(1)))
                expected = weight * (1 - 0.02 * 0.5 * 0.01) - rate * update.float()
                after = dict(model.named_parameters())[name].detach()
                torch.testing.assert_close(after, expected)
                assert (after - weight).abs().max() > rate * 0.1  # a real update, far past the tolerance
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.equal(a, b), name
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters() if n in others)


def test_both_optimizers_state_round_trips_under_their_own_prefixes():
    model = tiny_model()
    names = {id(p): n for n, p in model.named_parameters()}
    optimizer = make_optimizer(model, TrainConfig(optimizer="muon"), torch.device("cpu"))
    backward(model, 0)
    optimizer.step()
    tensors = optimizer_tensors(optimizer, names)
    assert "muon/decoder.blocks.0.attn.qkv.weight/momentum_buffer" in tensors and "tok_emb.weight/exp_avg" in tensors
    assert "decoder.blocks.0.attn.qkv.weight/exp_avg" not in tensors
    fresh = make_optimizer(model, TrainConfig(optimizer="muon"), torch.device("cpu"))
    load_optimizer_tensors(fresh, tensors, names)
    again = optimizer_tensors(fresh, names)
    assert again.keys() == tensors.keys() and all(torch.equal(again[k], tensors[k]) for k in tensors)
    with pytest.raises(TfcliError, match="not a trainable parameter"):  # an AdamW run's state does not fit
        load_optimizer_tensors(make_optimizer(model, TrainConfig(), torch.device("cpu")), tensors, names)


def test_muon_settings_that_cannot_work_are_refused():
    from tfcli.train.command_line import check_settings_apply

    with pytest.raises(TfcliError, match="--fsdp") as refused:
        TrainConfig(optimizer="muon", fsdp=True)
    assert "shard" in str(refused.value)
    with pytest.raises(TfcliError, match="LoRA"):
        check_settings_apply(TrainConfig(optimizer="muon", lora_rank=4), finetune=True)
    with pytest.raises(TfcliError, match="optimizer"):
        TrainConfig(optimizer="sgd")
    with pytest.raises(TfcliError, match="muon_lr"):
        TrainConfig(muon_lr=0)


def test_the_options_are_checked_before_anything_is_made(cli, shards, tmp_path):
    from tests.training import pretrain_args

    for option, value in (("--optimizer", "sgd"), ("--schedule", "cyclic")):
        result = cli(*pretrain_args(shards, tmp_path / "run", option, value))
        assert result.code == 2 and f"{option} must be one of" in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / "run").exists()
