"""LoRA (Hu et al., 2021): a frozen linear layer W plus a trained low-rank update, y = W x + (alpha / r) B A x,
with A (r, in) and B (out, r). B starts at zero, so step 0 computes exactly the base model; A starts as
PEFT starts it (Kaiming-uniform). Only A and B (and the modules trained whole, such as a new
classification head) take gradients and optimizer state.

`apply_lora` wraps a built model's linear layers in place. The wrapper holds the original layer as
`base_layer` (PEFT's name), whatever its class: tfcli.accel's `products.Linear` (the same parameters, a
faster product) works under it as nn.Linear does, before or after the wrapping. For inference an adapter
is merged into the weights (W + (alpha / r) B A), which leaves a plain model.

Over a quantized base (QLoRA: `tfcli.quant.linear.QuantLinear`, its blocks frozen as they are) the adapter wraps
the quantized layer the same way; it cannot be merged into the blocks without quantizing again, so it stays a
low-rank product beside them, in training and in decoding alike.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tfcli.adapters import PEFT_PREFIX, AdapterRecord
from tfcli.errors import TfcliError
from tfcli.meta_device import on_meta_device
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.quant.linear import QuantLinear

BASE_LINEARS = (nn.Linear, QuantLinear)  # the layers an adapter wraps: plain (or accel's) and quantized (QLoRA)

# Each group's linear layers, by the end of their module name (tfcli/model/attention.py, layers.py).
TARGET_GROUPS: dict[str, tuple[str, ...]] = {
    "qkv": ("attn.qkv", "cross_attn.q", "cross_attn.kv"),  # the query/key/value projections (self and cross)
    "out": ("attn.out", "cross_attn.out"),  # the attention output projections
    "mlp": ("mlp.fc", "mlp.proj"),  # the MLP's up (gate + up with SwiGLU) and down projections
}


class LoraLinear(nn.Module):
    """A linear layer with a low-rank update: base_layer(x) + scaling * lora_B(lora_A(dropout(x)))."""

    def __init__(self, base_layer: nn.Linear | QuantLinear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.base_layer = base_layer
        if isinstance(base_layer, QuantLinear):  # its weight is made on each read: float32 adapters beside the blocks
            device, dtype = base_layer.blocks.device, torch.float32
        else:
            device, dtype = base_layer.weight.device, base_layer.weight.dtype
        self.lora_A = nn.Linear(base_layer.in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, base_layer.out_features, bias=False, device=device, dtype=dtype)
        self.lora_dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.scaling = alpha / rank
        if device.type != "meta":
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # PEFT's init_lora_weights=True
            nn.init.zeros_(self.lora_B.weight)

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    @property
    def weight(self) -> torch.Tensor:
        """The frozen base weight (code that reads a layer's weight sees the base model's)."""
        return self.base_layer.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base_layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """base_layer(x) + scaling * lora_B(lora_A(dropout(x))), with the scaling on the r-wide side and
        B's product added in the same call (addmm): no extra pass over the layer's output."""
        result = self.base_layer(x)
        a = self.lora_A(self.lora_dropout(x)) * self.scaling  # (..., r)
        flat = torch.addmm(result.reshape(-1, result.shape[-1]), a.reshape(-1, a.shape[-1]), self.lora_B.weight.t())
        return flat.view(result.shape)

    def delta(self) -> torch.Tensor:
        """The update to the weight, scaling * B @ A, shape (out, in)."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling


def target_modules(model: nn.Module, groups: tuple[str, ...] | list[str]) -> list[tuple[str, nn.Module]]:
    """The linear layers the groups name, in the model's order (already wrapped ones included)."""
    unknown = [g for g in groups if g not in TARGET_GROUPS]
    if unknown:
        raise TfcliError(f"unknown LoRA target group {unknown[0]!r}", hint=f"the groups are {', '.join(TARGET_GROUPS)}")
    suffixes = tuple(s for g in groups for s in TARGET_GROUPS[g])
    found = []
    for name, module in model.named_modules():
        if isinstance(module, (*BASE_LINEARS, LoraLinear)) and any(name == s or name.endswith("." + s) for s in suffixes):
            found.append((name, module))
    return found


def check_rank(config: ModelConfig, rank: int, groups: tuple[str, ...] | list[str]) -> list[str]:
    """The names of the layers LoRA would wrap; a clear error when there are none or the rank is larger
    than the smallest of them (a rank past min(in, out) adds parameters and nothing else)."""
    with on_meta_device():
        targets = target_modules(Transformer(config), groups)
    if not targets:
        raise TfcliError(f"the model has no linear layers in the LoRA groups {', '.join(groups)}")
    name, smallest = min(targets, key=lambda item: min(item[1].in_features, item[1].out_features))
    limit = min(smallest.in_features, smallest.out_features)
    if rank > limit:
        raise TfcliError(
            f"--lora-rank {rank} is larger than the smallest targeted layer ({name}: {smallest.in_features} -> {smallest.out_features})",
            hint=f"use a rank of at most {limit}",
        )
    return [n for n, _ in targets]


def apply_lora(model: nn.Module, record: AdapterRecord) -> nn.Module:
    """Freeze `model`, wrap the record's modules with adapters (B = 0: the model computes what it did),
    make the record's modules_to_save trainable, and attach the record as `model.lora`; in place."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for name in record.modules:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        layer = getattr(parent, leaf)
        if isinstance(layer, LoraLinear) or not isinstance(layer, BASE_LINEARS):
            raise ValueError(f"{name} is not a plain linear layer to wrap")
        setattr(parent, leaf, LoraLinear(layer, record.rank, record.alpha, record.dropout))
    for name in record.modules_to_save:
        for parameter in model.get_submodule(name).parameters():
            parameter.requires_grad_(True)
    model.lora = record
    return model


def attached(model: nn.Module) -> AdapterRecord | None:
    """The adapter record `apply_lora` attached, or None for a plain model."""
    record = getattr(model, "lora", None)
    return record if isinstance(record, AdapterRecord) else None


def adapter_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """What an adapter run saves, keyed as PEFT keys it: each wrapped layer's lora_A and lora_B, and the
    modules_to_save whole."""
    record = attached(model)
    assert record is not None
    tensors = {}
    for name in record.modules:
        layer = model.get_submodule(name)
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = layer.lora_A.weight
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = layer.lora_B.weight
    for name in record.modules_to_save:
        for key, tensor in model.get_submodule(name).state_dict().items():
            tensors[f"{PEFT_PREFIX}{name}.{key}"] = tensor
    return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}


def expected_adapter_shapes(config: ModelConfig, record: AdapterRecord) -> dict[str, tuple[int, ...]]:
    """Every tensor an adapter file of this record holds, and its shape."""
    with on_meta_device():
        model = Transformer(config)
    shapes = {}
    for name in record.modules:
        layer = model.get_submodule(name)
        if not isinstance(layer, nn.Linear):
            raise TfcliError(f"the adapter wraps {name}, which is not a linear layer of this model")
        shapes[f"{PEFT_PREFIX}{name}.lora_A.weight"] = (record.rank, layer.in_features)
        shapes[f"{PEFT_PREFIX}{name}.lora_B.weight"] = (layer.out_features, record.rank)
    for name in record.modules_to_save:
        for key, tensor in model.get_submodule(name).state_dict().items():
            shapes[f"{PEFT_PREFIX}{name}.{key}"] = tuple(tensor.shape)
    return shapes


def saved_module_keys(record: AdapterRecord, state_keys) -> set[str]:
    """The model's state-dict keys that the adapter file holds whole (its modules_to_save)."""
    return {k for k in state_keys if any(k.startswith(name + ".") for name in record.modules_to_save)}


def merged_state(state: dict[str, torch.Tensor], record: AdapterRecord, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base model's state with the adapter in the weights: W + scaling * B @ A for each wrapped layer,
    and the modules_to_save replaced by the adapter's."""
    state = dict(state)
    for name in record.modules:
        a, b = tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"], tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"]
        weight = state[f"{name}.weight"]
        state[f"{name}.weight"] = weight + (b.to(weight.dtype) @ a.to(weight.dtype)) * record.scaling
    for key, tensor in tensors.items():
        if not key.endswith((".lora_A.weight", ".lora_B.weight")):  # a module saved whole
            state[key.removeprefix(PEFT_PREFIX)] = tensor
    return state


def load_adapter(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Put saved adapter tensors (PEFT keys) into a model `apply_lora` wrapped."""
    record = attached(model)
    assert record is not None
    with torch.no_grad():
        for name in record.modules:
            layer = model.get_submodule(name)
            layer.lora_A.weight.copy_(tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"])
            layer.lora_B.weight.copy_(tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"])
        for name in record.modules_to_save:
            module = model.get_submodule(name)
            module.load_state_dict({key: tensors[f"{PEFT_PREFIX}{name}.{key}"] for key in module.state_dict()})


def base_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A wrapped model's state under the plain model's names, without the adapters (the frozen base, and
    the modules_to_save as trained)."""
    state = {}
    for key, tensor in model.state_dict().items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        state[key.replace(".base_layer.", ".")] = tensor
    return state
