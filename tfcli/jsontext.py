"""JSON text that always round-trips: written as UTF-8 whatever a string holds, read without a RecursionError
whatever a file holds. Below every module that reads or writes JSON; imports nothing of tfcli."""

from __future__ import annotations

import json
from typing import Any


def dumps_json(value: Any, **options: Any) -> str:
    """Strict JSON text (NaN and infinities refused), non-ASCII kept as it is, and each lone surrogate (a
    byte of a file name that is not UTF-8, as Python decodes it) written as its \\u escape, so the text
    always encodes as UTF-8 and reads back the same. Example: dumps_json("caf\\udce9") -> '"caf\\\\udce9"'"""
    return escape_surrogates(json.dumps(value, ensure_ascii=False, allow_nan=False, **options))


def escape_surrogates(text: str) -> str:
    """JSON text with each lone surrogate written as its \\u escape (only a string can hold one)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def loads_json(text: str | bytes, *, finite: bool = True) -> Any:
    """json.loads, with nesting too deep for Python's parser reported as the JSONDecodeError it is (json
    raises RecursionError, which no caller expects from a file), and, where `finite`, NaN and infinities
    (which Python's parser takes though JSON has none) refused with the key that holds one.
    Example: loads_json('{"eps": NaN}') raises JSONDecodeError("eps is NaN, which JSON does not allow")"""
    try:
        value = json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text if isinstance(text, str) else "", 0) from None
    if finite:
        where = _non_finite(value, "")
        if where is not None:
            key, number = where
            raise json.JSONDecodeError(f"{key or 'the value'} is {number!r}, which JSON does not allow", text if isinstance(text, str) else "", 0)
    return value


def _non_finite(value: Any, key: str) -> tuple[str, float] | None:
    """The first NaN or infinity in parsed JSON, with its key path. Example: {"a": [1, nan]} -> ("a[1]", nan)"""
    stack = [(value, key)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and (item != item or item in (float("inf"), float("-inf"))):
            return where, item
        if isinstance(item, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None
