import pytest
import torch
import torch.nn.functional as F

from tfcli.model import kernels
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer

pytestmark = pytest.mark.skipif(kernels._onednn_linear() is None, reason="this torch build has no oneDNN")


@pytest.fixture
def onednn_calls(monkeypatch):
    """Send every fp32 CPU product through oneDNN, however small, and count the calls."""
    calls = []
    op = kernels._onednn_linear()

    def counted(*args):
        calls.append(args[0].shape)
        return op(*args)

    monkeypatch.setattr(kernels, "_op", counted)
    monkeypatch.setattr(kernels, "ONEDNN_MIN_MACS", 0)
    return calls


@pytest.mark.parametrize("shape", [(7, 12), (3, 5, 12)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_matches_torch_in_value_and_gradients(onednn_calls, shape, with_bias):
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    weight = torch.randn(9, 12, requires_grad=True)
    bias = torch.randn(9, requires_grad=True) if with_bias else None
    leaves = [x, weight] + ([bias] if with_bias else [])
    upstream = torch.randn(*shape[:-1], 9)

    y = kernels.linear(x, weight, bias)
    grads = torch.autograd.grad(y, leaves, upstream)
    assert len(onednn_calls) == 3  # forward, input gradient, weight gradient
    expected = F.linear(x, weight, bias)
    expected_grads = torch.autograd.grad(expected, leaves, upstream)
    assert torch.allclose(y, expected, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4)


def test_frozen_weight_gets_no_gradient(onednn_calls):
    x = torch.randn(4, 6, requires_grad=True)
    weight = torch.randn(3, 6)
    kernels.linear(x, weight).sum().backward()
    assert x.grad is not None and weight.grad is None
    assert len(onednn_calls) == 2  # no weight-gradient product


@pytest.mark.parametrize("a_shape,b_shape", [((20, 3), (20, 11)), ((20, 11), (20, 3))])
def test_weight_gradient_product_in_either_orientation(onednn_calls, a_shape, b_shape):
    a, b = torch.randn(*a_shape), torch.randn(*b_shape)
    assert torch.allclose(kernels.matmul_tn(a, b), a.t() @ b, atol=1e-5)
    assert torch.allclose(kernels.matmul(a.t(), b), a.t() @ b, atol=1e-5)


def test_small_products_other_dtypes_and_autocast_keep_torch_kernels():
    w = torch.randn(64, 64)
    assert not kernels.use_onednn(torch.randn(1, 64), w)  # 4K multiply-adds: oneDNN's fixed cost would dominate
    assert kernels.use_onednn(torch.randn(1024, 64), w)  # 4M multiply-adds
    assert kernels.use_onednn(torch.randn(1, 768), torch.randn(768, 768))  # batch 1, a weight worth streaming
    big = torch.randn(1024, 64)
    assert not kernels.use_onednn(big.double(), w.double())
    assert not kernels.use_onednn(big.bfloat16(), w.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not kernels.use_onednn(big, w)
        assert kernels.linear(big, w).dtype == torch.bfloat16  # autocast still applies


def test_model_trains_the_same_through_either_kernel(monkeypatch):
    config = ModelConfig(vocab_size=50, block_size=16, n_layers=2, n_heads=2, d_model=16, d_ff=32, dropout=0.0, bias=True)
    ids = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(1))

    def loss_and_grads():
        torch.manual_seed(0)
        model = Transformer(config)
        loss = model(ids[:, :-1], targets=ids[:, 1:]).loss
        loss.backward()
        return loss.item(), {name: p.grad for name, p in model.named_parameters()}

    monkeypatch.setattr(kernels, "ONEDNN_MIN_MACS", 2**62)
    monkeypatch.setattr(kernels, "ONEDNN_MIN_WEIGHT", 2**62)
    torch_loss, torch_grads = loss_and_grads()
    monkeypatch.setattr(kernels, "ONEDNN_MIN_MACS", 0)
    calls = []
    op = kernels._onednn_linear()
    monkeypatch.setattr(kernels, "_op", lambda *args: calls.append(1) or op(*args))
    onednn_loss, onednn_grads = loss_and_grads()
    assert len(calls) > 20  # every layer's projections, forward and backward, and the loss's
    assert onednn_loss == pytest.approx(torch_loss, rel=1e-5)
    for name, grad in torch_grads.items():
        assert torch.allclose(onednn_grads[name], grad, atol=1e-5), name
