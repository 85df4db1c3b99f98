"""Tokens of a text as a person should see them: each token's text through the tokenizer's own decoder, the
same for every family (a byte-fallback `<0x0A>` reads as the newline it stands for), with control characters
escaped.

Token text is data, never markup or terminal control: `visible` turns every control or format character
into an escape (`\\x1b`, `\\n`, `\\u202e`). A token holding part of a character split across tokens shows
that character. A WordPiece token shows as its vocabulary entry, marked when it continues a word (`##ing`).

Labels (tables, pictures, `tokenize show`) mark what a reader could not see, the same for every family
(`label_text`): a space at either end of a token as ␣, a newline as ↵. JSON keeps the text unmarked.
"""

from __future__ import annotations

import dataclasses
import unicodedata

from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.detokenize import REPLACEMENT, IncrementalDecoder, alone_texts

_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
# U+2423 OPEN BOX, the typesetters' sign for a space: one mark for every family, found in no vocabulary (unlike
# SentencePiece's ▁ or GPT-2's Ġ, which would make every label read as one family's raw vocabulary entry)
SPACE_MARK = "\u2423"
NEWLINE_MARK = "\u21b5"  # ↵
DOTTED_CIRCLE = "\u25cc"  # ◌, the base Unicode's charts draw a combining mark on when it stands alone


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


def label_text(text: str) -> str:
    """A token's text as a label shows it: each space at either end as ␣ (a space between two characters
    reads as one), each newline as ↵, other control characters escaped as `visible` escapes them, a combining
    mark at the start drawn on ◌.

    Example: " cat" -> "␣cat"; "  " -> "␣␣"; "\\n" -> "↵"; "\\t" -> "\\\\t"; "New York" -> "New York"; "\\u0301" -> "◌\\u0301"
    """
    inner = text.strip(" ")
    lead = len(text) - len(text.lstrip(" "))
    trail = len(text) - lead - len(inner)
    shown = on_a_base(NEWLINE_MARK.join(visible(line) for line in inner.split("\n")))
    return SPACE_MARK * lead + shown + SPACE_MARK * trail


def on_a_base(text: str, prefix: str = "") -> str:
    """`text` with a combining mark at its start (after `prefix`, WordPiece's ##) drawn on ◌: printed bare, it
    would sit on whatever comes before it (a space, a #). Example: "\\u0301" -> "◌\\u0301"; ("##\\u0301", "##") -> "##◌\\u0301"."""
    body = text[len(prefix) :] if prefix and text.startswith(prefix) else text
    if body and unicodedata.category(body[0]) in ("Mn", "Mc", "Me"):
        return text[: len(text) - len(body)] + DOTTED_CIRCLE + body
    return text


@dataclasses.dataclass(frozen=True)
class TokenView:
    id: int
    token: str  # the vocabulary entry, as stored (e.g. "Ġcat", "▁cat", "<0x0A>")
    text: str  # what it reads as, escaped for display (e.g. " cat", "\\n"); a part of a character: that character
    piece: str = dataclasses.field(default="", compare=False, repr=False)  # the text it adds, as the decoder writes it (unescaped)
    part: str = dataclasses.field(default="", compare=False, repr=False)  # the character it holds part of, completed by a later token
    continuation: bool = False  # a WordPiece token that continues the word before it (vocabulary entry "##ing", text "ing")

    @property
    def readable(self) -> str:
        """The token's text as labels show it (`label_text`: " cat" -> "␣cat", "\\n" -> "↵"); a byte that is
        no character (U+FFFD) as its vocabulary entry (`<0x80>`); a token with no text as `text` has it."""
        shown = self.piece + self.part
        if not shown:
            return self.text
        return visible(self.token) if REPLACEMENT in shown else label_text(shown)

    @property
    def label(self) -> str:
        """How tables and pictures name the token: `readable`, a WordPiece continuation marked (`##ing`)."""
        return f"##{self.readable}" if self.continuation else self.readable

    def to_json(self) -> dict:
        return {"id": self.id, "token": self.token, "text": self.text, "continuation": self.continuation}


def token_views(tokenizer: TextTokenizer, text: str) -> list[TokenView]:
    """The tokens of `text` (special-token text encoded as ordinary text), ready to display."""
    return views_of_ids(tokenizer, tokenizer.encode(text))


def views_of_ids(tokenizer: TextTokenizer, ids: list[int]) -> list[TokenView]:
    """Token ids as they read in their text, through the tokenizer's own decoder (`IncrementalDecoder`): each
    token's text is what it adds to the text so far. A character split across tokens belongs to the token
    that completes it; the tokens before hold a part of it (`part`) and show that character. A WordPiece
    token's text is its vocabulary entry without the `##` (which `continuation` records) and without the
    space the decoder puts before a word.

    Example (GPT-2, "a 東" as "a" "Ġæ" "Ŀ" "±"): pieces "a", " ", "", "東"; texts "a", " 東", "東", "東"
    """
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=False)
    pieces, pending = [], []
    for token_id in ids:
        pieces.append(decoder.extend([token_id]))
        pending.append(decoder.pending)
    if pieces:
        pieces[-1] += decoder.finish()
    for k in _split_byte_runs(tokenizer, ids, pieces):
        pending[k] = not pieces[k]  # a byte of a run holds part of a character unless one ends at it
    prefix = tokenizer.continuation_prefix
    views = []
    upcoming = ""  # the first character given out after each position, read backwards
    parts = [""] * len(ids)
    for position in range(len(ids) - 1, -1, -1):
        if pending[position] and position + 1 < len(ids):
            parts[position] = upcoming
        if pieces[position]:
            upcoming = pieces[position][0]
    for token_id, piece, part in zip(ids, pieces, parts):
        token = tokenizer.hf.id_to_token(token_id) or ""
        shown = piece + part
        continuation = False
        if prefix is not None:
            continuation = token.startswith(prefix) and len(token) > len(prefix)
            shown = shown.removeprefix(" ")
        views.append(TokenView(id=token_id, token=token, text=visible(shown), piece=piece, part=part, continuation=continuation))
    return views


def _split_byte_runs(tokenizer: TextTokenizer, ids: list[int], pieces: list[str]) -> list[int]:
    """Give each token of a byte-fallback run its own characters (streaming gives the run's text whole to the
    token that ends it). The decoder reads a run prefix as text exactly where it ends on a character boundary;
    the characters completed there go to that token, and the tokens before it hold parts. A run with an
    invalid byte is U+FFFD per byte, one to each token. Returns the positions it gave characters to."""
    runs = tokenizer.byte_fallback_ids
    split: list[int] = []
    start = 0
    while runs and start < len(ids):
        if ids[start] not in runs:
            start += 1
            continue
        end = start
        while end < len(ids) and ids[end] in runs:
            end += 1
        whole = tokenizer.decode(ids[start:end])
        owner = end if end < len(ids) else end - 1  # the token whose piece holds the run's text
        if pieces[owner].startswith(whole):
            rest = pieces[owner][len(whole) :]
            invalid = whole == REPLACEMENT * (end - start)
            done = ""
            for k in range(start, end):
                text = whole[: k - start + 1] if invalid else tokenizer.decode(ids[start : k + 1])
                pieces[k] = ""
                if REPLACEMENT not in text or invalid or k == end - 1:
                    pieces[k], done = text[len(done) :], text
            pieces[owner] = rest if owner >= end else pieces[owner] + rest
            split += range(start, end)
        start = end
    return split


def _alone_text(tokenizer: TextTokenizer, token_id: int) -> tuple[str, bool]:
    """The text a token adds after a word, or its vocabulary entry where that is only part of a character;
    and whether it is that entry."""
    (text,) = alone_texts(tokenizer, [token_id])
    if REPLACEMENT in text:
        return tokenizer.hf.id_to_token(token_id) or text, True
    return text, False


def token_text(tokenizer: TextTokenizer, token_id: int) -> str:
    """One token's text on its own (a prediction, in JSON): the text it adds after a word, through the
    decoder, escaped; a token that is only part of a character (its text U+FFFD) shows as its vocabulary
    entry ("<0xE6>", GPT-2's "æ")."""
    return visible(_alone_text(tokenizer, token_id)[0])


def token_label(tokenizer: TextTokenizer, token_id: int) -> str:
    """One token's name on its own in a table or picture: `token_text` with its spaces and newlines marked
    (`label_text`). Example (GPT-2): "Ġcat" -> "␣cat", "Ċ" -> "↵", "æ" (part of a character) -> "æ".
    """
    text, entry = _alone_text(tokenizer, token_id)
    return visible(text) if entry else label_text(text)
