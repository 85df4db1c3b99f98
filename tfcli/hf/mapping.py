"""What every Hugging Face family module provides: how a tfcli tensor is made of the class's tensors."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """One tfcli tensor and the Hugging Face tensors it is made of.

    Example: TensorMap("decoder.blocks.0.attn.qkv.weight", ("model.layers.0.self_attn.q_proj.weight",
    "...k_proj.weight", "...v_proj.weight"), split=(64, 32, 32)): q, k and v stacked row-wise into one.
    """

    ours: str
    theirs: tuple[str, ...]  # their tensors, stacked along the first dimension into ours
    split: tuple[int, ...] = ()  # with several: each one's size along that dimension
    transposed: bool = False  # stored (in, out), as GPT-2's Conv1D: the transpose of ours
    offset: float = 0.0  # ours is theirs + offset: Gemma's RMSNorms scale by 1 + weight, tfcli's by weight (offset 1)


def incompatibility(checks: list[tuple[bool, str]]) -> str | None:
    """The first check that fails, as its sentence, or None."""
    return next((message for ok, message in checks if not ok), None)
