"""Words for what was captured, shared by every renderer (terminal, HTML, PNG); nothing here draws."""

from __future__ import annotations


def kind_label(capture) -> str:
    """Example: "decoder self-attention", "cross-attention" """
    return f"{capture.kind} self-attention" if capture.self_attention else "cross-attention"
