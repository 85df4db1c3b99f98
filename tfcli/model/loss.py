"""The training loss over the vocabulary: cross-entropy of the logits the output head makes.

Plain PyTorch: all the logits at once, then `F.cross_entropy`. `tfcli.accel` may attach a fused version
that computes the same value and gradients a block of rows at a time, without ever holding the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100  # a target that carries no loss


def vocabulary_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor | nn.Module,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    label_smoothing: float = 0.0,
    softcap: float | None = None,
) -> torch.Tensor:
    """sum_i cross_entropy(hidden[i] @ weight.T + bias, targets[i]) over the rows whose target is not
    IGNORE_INDEX, the logits soft-capped (softcap * tanh(logits / softcap)) where `softcap` is given.
    hidden (N, d), weight (vocab, d), bias (vocab,) or None, targets (N,) long. `weight` may be the head itself
    where it holds no float matrix (a frozen quantized one), which adds its own bias (`bias` None)."""
    logits = (weight(hidden) if isinstance(weight, nn.Module) else F.linear(hidden, weight, bias)).float()  # (N, vocab)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum", label_smoothing=label_smoothing)
