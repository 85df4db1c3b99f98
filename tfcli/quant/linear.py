"""The linear layer over block-quantized weights that the loader puts in an nn.Linear's place for decoding: the
same `y = x W^T + b`, W held as its block bytes. Its product is `kernel` where tfcli.accel attached one (C code
for the format, chosen by measurement), else W dequantized for the call and F.linear (the reference).

Trained over (QLoRA: LoRA adapters on a frozen quantized base), W stays frozen and its blocks stay as they are:
the gradient reaches the layer's input through `_FrozenProduct`, whose forward is `frozen_kernel` where
tfcli.accel attached one (its C product over the blocks where measured faster, else the slabs) and otherwise
dequantizes a slab of W's rows at a time, as the backward does, so no float copy of W outlives one slab of one
product. Each slab is multiplied by `slab_forward` / `slab_backward`: PyTorch's `@`, or the dense products
tfcli.accel chose by measurement."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.quant.tensors import Blocks

Kernel = Callable[[torch.Tensor, "QuantLinear"], torch.Tensor]  # (x (..., in), layer) -> (..., out), no bias
Expand = Callable[[Blocks], torch.Tensor]  # blocks -> their float32 matrix
Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (a, slab) -> a product with one slab of W's rows
SLAB_VALUES = 1 << 22  # a slab of W dequantized at once under autograd: 16 MB of float32


def rows_times_slab(rows: torch.Tensor, slab: torch.Tensor) -> torch.Tensor:
    """rows (N, in) @ slab (S, in)^T -> (N, S): the forward's product with one slab (PyTorch's)."""
    return rows @ slab.t()


def gradient_times_slab(grad: torch.Tensor, slab: torch.Tensor) -> torch.Tensor:
    """grad (N, S) @ slab (S, in) -> (N, in): the input gradient's share from one slab (PyTorch's)."""
    return grad @ slab


class _FrozenProduct(torch.autograd.Function):
    """y = x W^T for a frozen quantized W, differentiable in x only: grad_x = grad_y W, W dequantized again slab
    by slab in the backward (nothing of W is saved for it). Under autocast the product is in autocast's dtype, as
    F.linear's would be."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: QuantLinear) -> torch.Tensor:
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
        ctx.layer, ctx.input_dtype = layer, x.dtype
        rows = x.reshape(-1, layer.in_features).to(dtype)  # (N, in)
        y = layer.frozen_kernel(rows, layer) if layer.frozen_kernel is not None else layer.product(rows)
        return y.view(*x.shape[:-1], layer.out_features)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor) -> tuple[torch.Tensor, None]:
        layer: QuantLinear = ctx.layer
        grad_x = layer.input_gradient(grad_y.reshape(-1, layer.out_features))  # (N, in)
        return grad_x.view(*grad_y.shape[:-1], layer.in_features).to(ctx.input_dtype), None


class QuantLinear(nn.Module):
    """nn.Linear's product over quantized weights: `blocks` (uint8 buffer, out_features x bytes per row) in
    `format`; `bias` a float parameter or None. `weight` reads as the dequantized matrix (made on each read:
    for code that needs the whole matrix, as inspection does), never stored; training goes through `frozen_kernel` (else
    `product`) and `input_gradient`, and the loss over the vocabulary through `slabs`, a slab of rows at a time."""

    def __init__(self, blocks: Blocks, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = blocks.shape
        self.format = blocks.format
        self.register_buffer("blocks", blocks.data)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.kernel: Kernel | None = None
        self.frozen_kernel: Kernel | None = None  # the product under autograd tfcli.accel attached, else `product`
        self.expand: Expand | None = None  # a faster dequantizer tfcli.accel attached (C), else NumPy's
        self.slab_forward: Matmul = rows_times_slab  # tfcli.accel attaches its measured dense products
        self.slab_backward: Matmul = gradient_times_slab

    def dequantized(self) -> torch.Tensor:
        """The weight as float32 (out_features, in_features)."""
        blocks = Blocks(self.blocks.cpu(), self.format, (self.out_features, self.in_features))
        return (self.expand(blocks) if self.expand is not None else blocks.dequantized()).to(self.blocks.device)

    @property
    def slab_rows(self) -> int:
        """Rows of W in one slab: about SLAB_VALUES values."""
        return min(self.out_features, max(1, SLAB_VALUES // self.in_features))

    def slabs(self, dtype: torch.dtype = torch.float32, rows: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """The weight a slab of rows at a time: (first row, `rows` rows (default `slab_rows`; fewer at the end) as `dtype`)."""
        step = rows or self.slab_rows
        for start in range(0, self.out_features, step):
            stop = min(start + step, self.out_features)
            blocks = Blocks(self.blocks[start:stop].cpu(), self.format, (stop - start, self.in_features))
            values = self.expand(blocks) if self.expand is not None else blocks.dequantized()
            yield start, values.to(self.blocks.device, dtype)

    def product(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (N, in) @ W^T -> (N, out) in rows' dtype, no bias, W dequantized a slab of rows at a time."""
        if self.slab_rows == self.out_features:  # one slab: the product as it comes
            _, weight = next(self.slabs(rows.dtype))
            return self.slab_forward(rows, weight)
        y = torch.empty(rows.shape[0], self.out_features, dtype=rows.dtype, device=rows.device)  # (N, out)
        for start, weight in self.slabs(rows.dtype):
            y[:, start : start + weight.shape[0]] = self.slab_forward(rows, weight)
        return y

    def input_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        """grad (N, out) @ W -> (N, in) in grad's dtype: the gradient of `product`'s input, W a slab at a time."""
        grad_x = None
        for start, weight in self.slabs(grad.dtype):
            part = self.slab_backward(grad[:, start : start + weight.shape[0]], weight)  # (N, in)
            grad_x = part if grad_x is None else grad_x.add_(part)
        assert grad_x is not None  # a layer has at least one row, so one slab
        return grad_x

    @property
    def weight(self) -> torch.Tensor:
        return self.dequantized()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # training over the frozen blocks: the gradient reaches x, W is never held whole
            y = _FrozenProduct.apply(x, self)
            return y if self.bias is None else y + self.bias.to(y.dtype)
        if self.kernel is not None and x.dtype == torch.float32 and x.device.type == "cpu":
            y = self.kernel(x, self)  # a new tensor: the bias is added in place
            return y if self.bias is None else y.add_(self.bias)
        return F.linear(x, self.dequantized().to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}, bias={self.bias is not None}"


class QuantEmbedding(nn.Module):
    """nn.Embedding's lookup over quantized rows: `blocks` (uint8 buffer, num_embeddings x bytes per row) in
    `format`; only the rows looked up are dequantized. A tied output head (QuantLinear) shares the buffer.
    `weight` reads as the dequantized matrix (made on each read)."""

    def __init__(self, blocks: Blocks) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = blocks.shape
        self.format = blocks.format
        self.register_buffer("blocks", blocks.data)
        self.expand: Expand | None = None

    def _dequantized(self, blocks: Blocks) -> torch.Tensor:
        return (self.expand(blocks) if self.expand is not None else blocks.dequantized()).to(self.blocks.device)

    @property
    def weight(self) -> torch.Tensor:
        return self._dequantized(Blocks(self.blocks.cpu(), self.format, (self.num_embeddings, self.embedding_dim)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.blocks[ids.reshape(-1)].cpu()  # (N, bytes per row)
        values = self._dequantized(Blocks(rows, self.format, (rows.shape[0], self.embedding_dim)))
        return values.view(*ids.shape, self.embedding_dim)  # (..., d)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, format={self.format}"


def held_tensors(model: nn.Module) -> dict[str, torch.Tensor | Blocks]:
    """A model's state under the plain model's names, each quantized layer's bytes as its weight's Blocks (the
    same storage, not copied), so that a model over the same blocks can be built again. Example:
    {"decoder.blocks.0.attn.qkv.weight": Blocks(uint8 (96, 34), "q8_0", (96, 32)), "decoder.blocks.0.attn.qkv.bias": ...}"""
    quantized = {name: m for name, m in model.named_modules() if isinstance(m, (QuantLinear, QuantEmbedding))}
    held: dict[str, torch.Tensor | Blocks] = {}
    for key, tensor in model.state_dict().items():
        owner, _, leaf = key.rpartition(".")
        layer = quantized.get(owner)
        if layer is None or leaf != "blocks":
            held[key] = tensor
        elif isinstance(layer, QuantLinear):
            held[f"{owner}.weight"] = Blocks(tensor, layer.format, (layer.out_features, layer.in_features))
        else:
            held[f"{owner}.weight"] = Blocks(tensor, layer.format, (layer.num_embeddings, layer.embedding_dim))
    return held


def held_values(model: nn.Module) -> int:
    """How many weights a model holds in blocks, each buffer once (a tied head shares the embedding's bytes): what
    `parameters()` leaves out of a quantized model's size. Example: 2 QuantLinear (96, 32) and (32, 32) -> 4,096."""
    counted: dict[int, int] = {}
    for module in model.modules():
        if isinstance(module, QuantLinear):
            counted[module.blocks.data_ptr()] = module.out_features * module.in_features
        elif isinstance(module, QuantEmbedding):
            counted[module.blocks.data_ptr()] = module.num_embeddings * module.embedding_dim
    return sum(counted.values())
