"""How well an SAE reconstructs what it reads, defined once for training, `tfcli eval --sae` and bench:

- L0: features active per vector, averaged;
- explained variance: 1 - sum((x - x_hat)^2) / sum((x - mean x)^2) over a batch of vectors;
- MSE: the mean squared error per element, in the activations' own units;
- CE loss recovered: (L_zero - L_sae) / (L_zero - L_clean), where L_clean is the model's next-token loss,
  L_sae its loss with the SAE's reconstruction spliced in at the hook point and L_zero its loss with the
  hook point's activation set to zero: 1 is a perfect splice, 0 no better than erasing the activation."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tfcli.model.transformer import Loss
from tfcli.sae.model import SparseAutoencoder
from tfcli.sae.points import editing


def reconstruction_stats(x: torch.Tensor, features: torch.Tensor, recon: torch.Tensor) -> dict[str, float]:
    """x, recon (N, d_in), features (N, d_sae) -> l0, explained_variance, mse."""
    residual = (x - recon).pow(2).sum()
    total = (x - x.mean(0)).pow(2).sum().clamp_min(1e-12)
    return {"l0": float((features > 0).sum(-1).float().mean()), "explained_variance": float(1 - residual / total), "mse": float((x - recon).pow(2).mean())}


def next_token_loss(
    model: nn.Module, windows: torch.Tensor, edit: Callable[[torch.Tensor], torch.Tensor] | None = None, name: str = "", batch: int = 8
) -> float:
    """The model's mean next-token loss over windows (N, T+1), with `edit` applied at hook point `name`."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(windows), batch):
            rows = windows[start : start + batch]
            ids, targets = rows[:, :-1], rows[:, 1:]
            if edit is None:
                total += float(model(ids, head=Loss(targets)).loss)
            else:
                with editing(model, name, edit):
                    total += float(model(ids, head=Loss(targets)).loss)
            count += targets.numel()
    return total / count


def ce_loss_recovered(model: nn.Module, sae: SparseAutoencoder, name: str, windows: torch.Tensor) -> dict[str, float]:
    """The clean, spliced and zero-ablated next-token losses over windows (N, T+1) and the share recovered."""
    clean = next_token_loss(model, windows)
    spliced = next_token_loss(model, windows, sae.forward, name)
    zero = next_token_loss(model, windows, torch.zeros_like, name)
    recovered = (zero - spliced) / (zero - clean) if zero != clean else float("nan")
    return {"ce_loss_clean": clean, "ce_loss_spliced": spliced, "ce_loss_zero": zero, "ce_loss_recovered": recovered}
