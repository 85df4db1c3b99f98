"""The fused projection + cross-entropy (tfcli.accel): the same loss and gradients as the plain logits path,
in every block layout, with bias, label smoothing and ignored targets, and through the model's `targets=`,
plain or accelerated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfcli.accel import accelerate
from tfcli.accel.fused_loss import _block_rows, linear_cross_entropy
from tfcli.model.config import ModelConfig
from tfcli.model.loss import IGNORE_INDEX, vocabulary_cross_entropy
from tfcli.model.transformer import DecoderInput, Loss, Transformer


def _reference(hidden, weight, bias, targets, smoothing):
    return F.cross_entropy(F.linear(hidden, weight, bias), targets, reduction="sum", label_smoothing=smoothing, ignore_index=IGNORE_INDEX)


@pytest.mark.parametrize(
    "rows, vocab, width, bias, smoothing, ignored, block",
    [
        (300, 1000, 32, True, 0.0, False, None),  # one block
        (300, 1000, 32, False, 0.1, True, 100),  # three blocks
        (500, 60000, 8, False, 0.2, False, 7),  # many blocks, the last one short
        (40, 60000, 16, True, 0.0, True, None),  # one block
    ],
)
def test_fused_loss_equals_cross_entropy_of_the_logits(rows, vocab, width, bias, smoothing, ignored, block, monkeypatch):
    if block:
        monkeypatch.setattr("tfcli.accel.fused_loss._block_rows", lambda n, v, weight_grad=True: block)
    torch.manual_seed(0)
    hidden = torch.randn(rows, width, requires_grad=True)
    weight = (torch.randn(vocab, width) * 0.3).requires_grad_()
    b = torch.randn(vocab, requires_grad=True) if bias else None
    targets = torch.randint(0, vocab, (rows,))
    if ignored:
        targets[::3] = IGNORE_INDEX
    leaves = [hidden, weight] + ([b] if bias else [])
    # the reference in float64: fp32 cross-entropy over 60,000 logits is itself off by ~3e-5 on some CPUs
    exact = [t.detach().double().requires_grad_() for t in leaves]
    expected = _reference(exact[0], exact[1], exact[2] if bias else None, targets, smoothing)
    expected_grads = [g.float() for g in torch.autograd.grad(expected * 0.37, exact)]
    fused = linear_cross_entropy(hidden, weight, b, targets, smoothing)
    grads = torch.autograd.grad(fused * 0.37, leaves)  # backward scales the gradients made in forward
    assert fused.item() == pytest.approx(expected.item(), rel=1e-5)
    for got, want in zip(grads, expected_grads):
        assert torch.allclose(got, want, atol=2e-5, rtol=1e-4)
    with torch.no_grad():
        assert linear_cross_entropy(hidden, weight, b, targets, smoothing).item() == pytest.approx(expected.item(), rel=1e-5)


def test_block_layout():
    assert _block_rows(4096, 8192) == 4096  # one block within the 2**26-logit budget
    assert _block_rows(1024, 50257) == 1024
    assert _block_rows(4096, 50257) == 1024  # 1,335 rows fit: four equal blocks
    assert _block_rows(1024, 50257, weight_grad=False) == 256  # a frozen weight: 2**24 logits, 333 rows fit
    assert _block_rows(10, 2**30) == 10  # at least 64 rows per block, however large the vocabulary


def test_a_frozen_weight_takes_smaller_blocks_with_the_same_loss_and_gradient(monkeypatch):
    from tfcli.accel import fused_loss

    monkeypatch.setattr(fused_loss, "FROZEN_BLOCK_LOGITS", 100 * 1000)  # 100 rows of 1,000 logits
    rows = []
    product = fused_loss.forward_product
    monkeypatch.setattr(fused_loss, "forward_product", lambda h, w, b=None: rows.append(h.shape[0]) or product(h, w, b))
    torch.manual_seed(0)
    hidden, weight, targets = torch.randn(300, 16, requires_grad=True), torch.randn(1000, 16) * 0.3, torch.randint(0, 1000, (300,))
    loss = linear_cross_entropy(hidden, weight, None, targets)
    loss.backward()
    assert rows == [100, 100, 100]
    exact = hidden.detach().double().requires_grad_()
    expected = _reference(exact, weight.double(), None, targets, 0.0)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(hidden.grad, exact.grad.float(), atol=2e-5, rtol=1e-4)
    rows.clear()
    linear_cross_entropy(hidden, weight.requires_grad_(), None, targets)
    assert rows == [300]  # a weight that trains: one block, within 2**26 logits


def test_frozen_weight_gets_no_gradient_and_extreme_logits_stay_finite():
    hidden = torch.tensor([[100.0, 0.0], [0.0, -100.0]], requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])  # frozen
    targets = torch.tensor([1, 0])  # the first row's target has a logit 200 below its best
    loss = linear_cross_entropy(hidden, weight, None, targets)
    expected = _reference(hidden, weight, None, targets, 0.0)
    assert torch.isfinite(loss) and loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    assert weight.grad is None and torch.isfinite(hidden.grad).all()


def test_bf16_autocast_keeps_fp32_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(64, 16, requires_grad=True)
    weight = torch.randn(500, 16, requires_grad=True)
    targets = torch.randint(0, 500, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, None, targets)
    loss.backward()
    assert hidden.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
    assert loss.item() == pytest.approx(_reference(hidden, weight, None, targets, 0.0).item(), rel=2e-2)


def test_the_plain_loss_is_the_cross_entropy_of_the_logits():
    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(30, 8), torch.randn(50, 8), torch.randn(50)
    targets = torch.randint(0, 50, (30,))
    targets[::4] = IGNORE_INDEX
    expected = _reference(hidden, weight, bias, targets, 0.1)
    assert vocabulary_cross_entropy(hidden, weight, bias, targets, 0.1).item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("accelerated", [False, True], ids=["plain", "accelerated"])
@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_model_targets_give_the_loss_of_its_logits(arch, accelerated):
    torch.manual_seed(0)
    config = ModelConfig(arch=arch, vocab_size=97, block_size=32, n_layers=2, n_heads=4, d_model=32, d_ff=64, tie_embeddings=arch != "encoder")
    model = accelerate(Transformer(config)) if accelerated else Transformer(config)
    ids = torch.randint(0, 97, (3, 12))
    targets = torch.randint(0, 97, (3, 12))
    targets[:, :4] = IGNORE_INDEX
    extra = dict(decoder=DecoderInput(ids)) if arch == "encoder-decoder" else {}
    logits = model(ids, **extra).logits
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    expected.backward()
    expected_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    out = model(ids, head=Loss(targets), **extra)
    assert out.logits is None
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    out.loss.backward()
    for name, p in model.named_parameters():
        if name in expected_grads:
            assert torch.allclose(p.grad, expected_grads[name], atol=1e-5), name


def test_no_scored_target_is_a_zero_loss_still_in_the_graph():
    model = Transformer(ModelConfig(vocab_size=50, block_size=8, n_layers=1, n_heads=2, d_model=16))
    ids = torch.randint(0, 50, (2, 8))
    loss = model(ids, head=Loss(torch.full((2, 8), IGNORE_INDEX))).loss
    assert loss.item() == 0.0
    loss.backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() == 0


@pytest.mark.parametrize("smoothing, ignored, block", [(0.0, False, None), (0.1, True, 70)])
def test_a_soft_capped_fused_loss_equals_cross_entropy_of_the_capped_logits(smoothing, ignored, block, monkeypatch):
    if block:
        monkeypatch.setattr("tfcli.accel.fused_loss._block_rows", lambda n, v, weight_grad=True: block)
    torch.manual_seed(0)
    hidden = torch.randn(200, 16, requires_grad=True)
    weight = (torch.randn(3000, 16) * 2.0).requires_grad_()  # logits of +-30 and more: the cap bends them
    bias = torch.randn(3000, requires_grad=True)
    targets = torch.randint(0, 3000, (200,))
    if ignored:
        targets[::3] = IGNORE_INDEX
    exact = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    capped = 30.0 * torch.tanh(F.linear(*exact) / 30.0)
    expected = F.cross_entropy(capped, targets, reduction="sum", label_smoothing=smoothing, ignore_index=IGNORE_INDEX)
    expected_grads = [g.float() for g in torch.autograd.grad(expected, exact)]
    assert vocabulary_cross_entropy(hidden, weight, bias, targets, smoothing, 30.0).item() == pytest.approx(expected.item(), rel=1e-5)
    fused = linear_cross_entropy(hidden, weight, bias, targets, smoothing, 30.0)
    assert fused.item() == pytest.approx(expected.item(), rel=1e-5)
    for got, want in zip(torch.autograd.grad(fused, (hidden, weight, bias)), expected_grads):
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        assert linear_cross_entropy(hidden, weight, bias, targets, smoothing, 30.0).item() == pytest.approx(expected.item(), rel=1e-5)
    uncapped = linear_cross_entropy(hidden.detach(), weight.detach(), bias.detach(), targets, smoothing)
    assert abs(uncapped.item() - expected.item()) > 1.0  # the cap changed the loss: the test would see it ignored


def test_an_accelerated_soft_capped_model_gives_the_plain_models_loss_and_gradients():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=97, block_size=32, n_layers=2, n_heads=4, d_model=32, d_ff=64, logit_softcap=5.0)
    plain, fast = Transformer(config), accelerate(Transformer(config))
    fast.load_state_dict(plain.state_dict())
    ids, targets = torch.randint(0, 97, (3, 12)), torch.randint(0, 97, (3, 12))
    for model in (plain, fast):
        model(ids, head=Loss(targets)).loss.backward()
    assert plain(ids, head=Loss(targets)).loss.item() == pytest.approx(fast(ids, head=Loss(targets)).loss.item(), rel=1e-5)
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), name
