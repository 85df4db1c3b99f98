"""Steering: `tfcli generate RUN --steer SAE:F:COEF` adds COEF times feature F's decoder direction (the
vector the SAE writes when F fires with activation 1) at the SAE's hook point, at every position, while
decoding, through the hook point's edit. A hook is on while steering, so decoding takes the model's own
forward (the C decoding step runs only while no hook point has one)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from tfcli.errors import TfcliError
from tfcli.sae.files import load_sae_for
from tfcli.sae.points import editing


def parse_steer(spec: str) -> tuple[Path, int, float]:
    """ "SAE:F:COEF" -> (the SAE folder, the feature, the coefficient). Example: "runs/sae:12:8" -> (Path("runs/sae"), 12, 8.0)"""
    parts = spec.rsplit(":", 2)
    try:
        if len(parts) != 3 or not parts[0]:
            raise ValueError
        folder, feature, coefficient = Path(parts[0]), int(parts[1]), float(parts[2])
    except ValueError:
        raise TfcliError(
            f"--steer {spec!r} is not SAE:FEATURE:COEF", hint="for example --steer runs/sae:12:8 (feature 12 of the SAE in runs/sae, times 8)"
        ) from None
    if not math.isfinite(coefficient):
        raise TfcliError(f"--steer {spec!r}: the coefficient must be a finite number")
    return folder, feature, coefficient


@contextlib.contextmanager
def steering(model: nn.Module, specs: list[str], run: Path | str | None = None) -> Iterator[None]:
    """Inside the block, each --steer spec adds its feature's direction at its SAE's hook point."""
    with contextlib.ExitStack() as stack:
        for spec in specs:
            folder, feature, coefficient = parse_steer(spec)
            sae, config = load_sae_for(folder, model, run)
            if not 0 <= feature < config.d_sae:
                raise TfcliError(
                    f"--steer {spec!r}: feature {feature} is out of range; the SAE has {config.d_sae} features", hint=f"pick 0 to {config.d_sae - 1}"
                )
            direction = (coefficient * sae.W_dec[feature]).detach()  # (d_in,)

            def add(x: torch.Tensor, direction: torch.Tensor = direction) -> torch.Tensor:
                return x + direction.to(x.dtype)

            stack.enter_context(editing(model, config.hook_name, add))
        yield
