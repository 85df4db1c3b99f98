"""The chat page at `/`: one self-contained file (markup, style and code inline; no network but the server's
own API), its settings put in as JSON escaped for a <script> element."""

from __future__ import annotations

import functools
from importlib import resources

from tfcli.inspect.html import json_for_script


def chat_page(model: str, *, chat: bool, block: int) -> str:
    """The page for one served run: `chat` when it has a chat template (else it continues text)."""
    config = {"model": model, "chat": chat, "max_tokens": max(1, min(128, block // 4)), "context": block}
    return _template().replace("@@CONFIG@@", json_for_script(config))


@functools.cache
def _template() -> str:
    return (resources.files("tfcli.serve") / "assets" / "chat.html").read_text(encoding="utf-8")
