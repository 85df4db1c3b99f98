"""Words for what was captured, shared by every renderer (terminal, HTML, PNG); nothing here draws."""

from __future__ import annotations

import os
from collections.abc import Sequence

from tfcli.tokenizer.show import visible


def kind_label(capture) -> str:
    """Example: "decoder self-attention", "cross-attention" """
    return f"{capture.kind} self-attention" if capture.self_attention else "cross-attention"


def _cut(text: str, start: int, limit: int) -> str:
    """text[start:] in at most `limit` characters, "…" where something was left out at either end."""
    head = "…" if start > 0 else ""
    rest = text[start:]
    if len(head) + len(rest) <= limit:
        return head + rest
    return head + rest[: limit - len(head) - 1] + "…"


def excerpts(texts: Sequence[str], limit: int = 48) -> list[str]:
    """Short titles for texts shown side by side, never the same for texts that differ.

    Each text is whole when it fits in `limit` characters; else cut at the end when the beginnings already
    tell the texts apart, and otherwise around the first place where they differ, from the start of a word a
    little before it ("…" marks every cut). Runs of whitespace show as one space (unless that is all that
    differs) and control characters escaped, as `visible` does.

    Example: excerpts(["The animal didn't cross the street because it was too tired",
                       "The animal didn't cross the street because it was too wide"], 40)
             -> ["…because it was too tired", "…because it was too wide"]
    """
    flat = [" ".join(text.split()) for text in texts]
    if len(set(flat)) < len(set(texts)):  # they differ only in whitespace: keep it
        flat = list(texts)
    cuts = [_cut(text, 0, limit) for text in flat]
    if len(set(cuts)) < len(set(flat)):
        first = len(os.path.commonprefix(flat))  # where they begin to differ
        target = max(0, first - limit // 3)
        space = flat[0].rfind(" ", 0, target + 1)
        start = space + 1 if space >= 0 and first - space <= limit // 2 else target
        cuts = [_cut(text, start, limit) for text in flat]
    return [visible(cut) for cut in cuts]


def quoted(text: str, limit: int = 60) -> str:
    """A user's word or text inside a message: quoted and escaped (`repr`), cut after `limit` characters with
    its length said, so a megabyte given as a word is not a megabyte of message.

    Example: quoted("fox") -> "'fox'"; quoted("ab" * 50, 4) -> "'abab'… (100 characters)"
    """
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text):,} characters)"
