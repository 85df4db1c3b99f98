"""The linear layer over block-quantized weights that the loader puts in an nn.Linear's place for decoding: the
same `y = x W^T + b`, W held as its block bytes. Its product is `kernel` where tfcli.accel attached one (C code
for the format, chosen by measurement), else W dequantized for the call and F.linear (the reference)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.quant.tensors import Blocks

Kernel = Callable[[torch.Tensor, "QuantLinear"], torch.Tensor]  # (x (..., in), layer) -> (..., out), no bias
Expand = Callable[[Blocks], torch.Tensor]  # blocks -> their float32 matrix


class QuantLinear(nn.Module):
    """nn.Linear's product over quantized weights: `blocks` (uint8 buffer, out_features x bytes per row) in
    `format`; `bias` a float parameter or None. `weight` reads as the dequantized matrix (made on each read:
    for code that needs the whole matrix, as the loss over the vocabulary does), never stored."""

    def __init__(self, blocks: Blocks, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = blocks.shape
        self.format = blocks.format
        self.register_buffer("blocks", blocks.data)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.kernel: Kernel | None = None
        self.expand: Expand | None = None  # a faster dequantizer tfcli.accel attached (C), else NumPy's

    def dequantized(self) -> torch.Tensor:
        """The weight as float32 (out_features, in_features)."""
        blocks = Blocks(self.blocks.cpu(), self.format, (self.out_features, self.in_features))
        return (self.expand(blocks) if self.expand is not None else blocks.dequantized()).to(self.blocks.device)

    @property
    def weight(self) -> torch.Tensor:
        return self.dequantized()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and x.dtype == torch.float32 and x.device.type == "cpu" and not torch.is_grad_enabled():
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
