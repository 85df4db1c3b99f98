"""QLoRA's products over the frozen blocks through tfcli.accel (`quant.frozen_product`): under autograd a
QuantLinear's forward takes the C product over its blocks on every SIMD path this processor runs (TFCLI_QUANT_PATH
forces each) and the backward's grad_y W the slabs, each slab through `products`' measured dense product. Held to
the product over the dequantized weight, layer by layer for every format and on a whole LoRA model's loss and
adapter gradients; unforced, the C paths are measured against the slabs and the rounding ones are not candidates."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.helpers import force_quant_path
from tests.test_quant_formats import _random_blocks
from tfcli.accel import accelerate, choices, products, quant
from tfcli.adapters import AdapterRecord
from tfcli.adapters.lora import LoraLinear, apply_lora, check_rank
from tfcli.checkpoint import TIED_KEY, model_from_tensors
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Loss, Transformer
from tfcli.quant import linear
from tfcli.quant.formats import FORMATS, quantize
from tfcli.quant.linear import QuantLinear
from tfcli.quant.tensors import Blocks


@pytest.fixture(params=list(quant.PATHS))
def path(request, monkeypatch):
    return force_quant_path(request.param, monkeypatch)


def attached(layer: QuantLinear) -> QuantLinear:
    quant.attach(nn.Sequential(layer))
    return layer


def random_layer(name: str, n: int, k: int, seed: int) -> QuantLinear:
    fmt = FORMATS[name]
    data = _random_blocks(name, n * k // fmt.block_size, seed=seed).reshape(n, fmt.row_bytes(k))
    return QuantLinear(Blocks(torch.from_numpy(data), name, (n, k)), torch.randn(n, generator=torch.Generator().manual_seed(seed)))


def refuse(*args):
    raise AssertionError("the slabs were used where the C product was forced")


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_path_gives_the_forward_and_the_input_gradient_of_the_dequantized_product(path, name, monkeypatch):
    monkeypatch.setattr(linear, "SLAB_VALUES", 5 * 512)  # the backward in several slabs (13 rows, 5 a slab at k = 512)
    k = 512  # whole blocks of every format
    layer = attached(random_layer(name, 13, k, seed=3))
    layer.product = refuse  # the forward is the C product, never the slabs
    weight = layer.dequantized().double()
    generator = torch.Generator().manual_seed(1)
    for m in (1, 5, 19):  # 19: more rows than the kernels take together
        x = torch.randn(2, m, k, generator=generator, requires_grad=True)
        upstream = torch.randn(2, m, 13, generator=generator)
        y = layer(x)
        (y * upstream).sum().backward()
        seen = quant.rounded_activations(x.detach().reshape(-1, k), name).reshape(x.shape) if quant.rounds(path, name) else x.detach()
        expected = seen.double() @ weight.T + layer.bias.double()
        assert torch.allclose(y.detach().double(), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max())), (path, name, m)
        expected_grad = upstream.double() @ weight  # the slabs' exact grad_y W, whichever path multiplied forward
        assert torch.allclose(x.grad.double(), expected_grad, rtol=1e-5, atol=1e-5 * float(expected_grad.abs().max())), (path, name, m)


def test_unforced_the_fp32_c_paths_are_measured_against_the_slabs(monkeypatch):
    monkeypatch.delenv(quant.FORCE_VARIABLE, raising=False)
    layer = attached(random_layer("q8_0", 40, 256, seed=5))
    x = torch.randn(24, 256, requires_grad=True)
    y = layer(x)
    decision = choices.choices().decisions[f"quant q8_0 frozen t{torch.get_num_threads()} 32x40x256 {quant.KERNELS}"]
    exact = {p for p in quant.PATHS if p not in quant.ROUNDED and quant.kernel(p) is not None}
    assert set(decision.seconds) == {quant.TORCH} | exact  # the slabs and every fp32 C path here, no rounding one
    assert decision.choice in decision.seconds
    expected = x.detach() @ layer.dequantized().T + layer.bias
    torch.testing.assert_close(y.detach(), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_the_slabs_multiply_through_the_measured_dense_products(monkeypatch):
    monkeypatch.setenv(quant.FORCE_VARIABLE, quant.TORCH)
    monkeypatch.setattr(linear, "SLAB_VALUES", 7 * 64)  # 30 rows in slabs of 7
    layer = attached(random_layer("q4_0", 30, 64, seed=9))
    assert layer.slab_forward is products.forward_product and layer.slab_backward is products.input_gradient
    calls = {"forward": 0, "backward": 0}

    def counted(direction, multiply):
        def run(a, w):
            calls[direction] += 1
            return multiply(a, w)

        return run

    layer.slab_forward, layer.slab_backward = counted("forward", layer.slab_forward), counted("backward", layer.slab_backward)
    x = torch.randn(3, 64, requires_grad=True)
    upstream = torch.randn(3, 30)
    (layer(x) * upstream).sum().backward()
    assert calls == {"forward": 5, "backward": 5}  # ceil(30 / 7) slabs each way
    expected = upstream @ layer.dequantized()  # to the sums' order: the chosen dense product may add in another
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def qlora_model(name: str) -> Transformer:
    """A seeded tiny GPT-2-shaped model, its matrices and tied embedding `name` blocks, rank-4 LoRA on every group,
    made ready for training by tfcli.accel; B drawn (not zero) so that every adapter takes a gradient."""
    config = ModelConfig(vocab_size=64, block_size=8, n_layers=1, n_heads=2, d_model=256, d_ff=512)
    torch.manual_seed(0)
    tensors: dict[str, torch.Tensor | Blocks] = {}
    for key, tensor in Transformer(config).state_dict().items():
        if key != TIED_KEY:
            in_blocks = tensor.dim() == 2 and key != "pos_emb.weight"
            tensors[key] = Blocks(torch.from_numpy(quantize(tensor.numpy(), name)), name, tuple(tensor.shape)) if in_blocks else tensor
    model = model_from_tensors(config, tensors)
    groups = ["qkv", "out", "mlp"]
    record = AdapterRecord(
        rank=4, alpha=8.0, targets=groups, modules=check_rank(config, 4, groups), parent="p", parent_path="/p", parent_weights_bytes=0, parent_weights_sha256=""
    )
    model = apply_lora(model, record)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLinear):
                module.lora_B.weight.normal_(0, 0.2)
    return accelerate(model.train())


def dequantized_copy(model: Transformer) -> Transformer:
    """The same model with every QuantLinear a frozen nn.Linear over its dequantized matrix: the reference."""
    reference = copy.deepcopy(model)
    for parent in list(reference.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, QuantLinear):
                plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None).requires_grad_(False)
                plain.weight.copy_(child.dequantized())
                if child.bias is not None:
                    plain.bias.copy_(child.bias)
                setattr(parent, child_name, plain)
    return reference


def test_a_qlora_models_loss_and_adapter_gradients_are_those_over_the_dequantized_weights_on_each_path(path):
    model = qlora_model("q4_K")
    reference = dequantized_copy(model)
    ids, targets = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1)), torch.randint(0, 64, (2, 8))
    loss = model(ids, head=Loss(targets)).loss
    loss.backward()
    expected = reference(ids, head=Loss(targets)).loss
    expected.backward()
    assert all(plan is not None for m in model.modules() if isinstance(m, QuantLinear) for plan in m.__dict__.get("_frozen_plans", {}).values())
    assert any(m.__dict__.get("_frozen_plans") for m in model.modules() if isinstance(m, QuantLinear))  # the C product ran
    # a path that rounds the activations (int8 blocks) is held to the rounding's tolerance, as the decode kernels are
    tolerance = quant.ROUNDING_TOLERANCE if quant.rounds(path, "q4_K") else 1e-5
    assert abs(loss.item() - expected.item()) <= tolerance * abs(expected.item()), (path, loss.item(), expected.item())
    theirs = dict(reference.named_parameters())
    trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert len(trained) == 8 and all(".lora_" in name for name in trained)
    for name, parameter in trained.items():
        assert (parameter.grad - theirs[name].grad).norm() <= tolerance * theirs[name].grad.norm(), (path, name)
