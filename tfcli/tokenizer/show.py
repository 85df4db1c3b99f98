"""Tokens of a text as a person should see them: each token's text, with control characters escaped.

Token text is data, never markup or terminal control: `visible` turns every control or format character
into an escape (`\\x1b`, `\\n`, `\\u202e`), and bytes that are part of a character split across tokens
show as `\\xe2`. A WordPiece token shows as its vocabulary entry, marked when it continues a word (`##ing`).
"""

from __future__ import annotations

import dataclasses
import unicodedata

from tfcli.tokenizer.core import TextTokenizer

_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def visible(text: str) -> str:
    """Escape every control (Cc), format (Cf), separator-line/paragraph (Zl, Zp) and surrogate character.

    Example: "a\\x1b]0;x\\x07b\\n" -> "a\\\\x1b]0;x\\\\x07b\\\\n"
    """
    out = []
    for ch in text:
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


@dataclasses.dataclass(frozen=True)
class TokenView:
    id: int
    token: str  # the vocabulary entry, as stored (e.g. "Ġcat")
    text: str  # what it stands for, escaped for display (e.g. " cat")
    raw: bytes = dataclasses.field(default=b"", compare=False, repr=False)  # the bytes it stands for (part of a character, maybe)
    continuation: bool = False  # a WordPiece token that continues the word before it (vocabulary entry "##ing", text "ing")

    @property
    def label(self) -> str:
        """How tables and pictures name the token: its text, a WordPiece continuation marked (`##ing`)."""
        return f"##{self.text}" if self.continuation else self.text

    def to_json(self) -> dict:
        return {"id": self.id, "token": self.token, "text": self.text, "continuation": self.continuation}


def token_views(tokenizer: TextTokenizer, text: str) -> list[TokenView]:
    """The tokens of `text` (special-token text encoded as ordinary text), ready to display. A WordPiece
    token's text is its vocabulary entry without the `##` (which `continuation` records) and without the
    space `token_bytes` puts before a word."""
    return id_views(tokenizer, tokenizer.encode(text))


def id_views(tokenizer: TextTokenizer, ids: list[int]) -> list[TokenView]:
    """`token_views` of ids already encoded (a served conversation's prompt and reply)."""
    prefix = tokenizer.continuation_prefix
    views = []
    for token_id in ids:
        token = tokenizer.hf.id_to_token(token_id) or ""
        raw = tokenizer.token_bytes(token_id)
        shown = raw.decode("utf-8", errors="backslashreplace")
        continuation = False
        if prefix is not None:
            continuation = token.startswith(prefix) and len(token) > len(prefix)
            shown = shown.removeprefix(" ")
        views.append(TokenView(id=token_id, token=token, text=visible(shown), raw=raw, continuation=continuation))
    return views
