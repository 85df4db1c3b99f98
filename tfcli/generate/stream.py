"""From token ids to text as it is made: an incremental UTF-8 decoder over each token's bytes (a character
split across tokens shows when its last byte arrives, never as U+FFFD), and stop strings that are cut off
before they are shown. The chunks a completion streams concatenate to exactly its final text. Torch-free.
"""

from __future__ import annotations

import codecs
import copy
from collections.abc import Sequence

from tfcli.tokenizer.core import TextTokenizer


class TokenBytes:
    """token id -> the bytes it stands for, memoised (the decoding loop asks for the same ids often)."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self.tokenizer.token_bytes(token_id)
        return found


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of `text` could be the start of a stop string (so must not be shown yet).

    Example: held_back("Hello wor", ["world", "x"]) -> 3
    """
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class CompletionText:
    """One completion's text, built token by token.

    `add(token_id)` returns the text that is now safe to show (possibly ""); `finish()` returns the rest.
    A stop string ends the text where it begins (`stopped` becomes True and the stop string is dropped).
    """

    def __init__(self, token_bytes: TokenBytes, stops: Sequence[str] = ()) -> None:
        self.token_bytes = token_bytes
        self.stops = tuple(stops)
        self.longest_stop = max((len(s) for s in self.stops), default=0)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.shown = 0  # characters of `text` already returned
        self.stopped = False

    def fork(self) -> CompletionText:
        """A copy that goes on independently (beam search extends one hypothesis into several)."""
        twin = copy.copy(self)
        twin._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        twin._utf8.setstate(self._utf8.getstate())
        return twin

    def add(self, token_id: int) -> str:
        if self.stopped:
            return ""
        return self._extend(self._utf8.decode(self.token_bytes(token_id)))

    def finish(self) -> str:
        """The end of the completion (end-of-text, a length limit): flush what is held back."""
        if self.stopped:
            return ""
        chunk = self._extend(self._utf8.decode(b"", final=True))  # an unfinished character becomes U+FFFD here
        if self.stopped:
            return chunk
        rest = self.text[self.shown :]
        self.shown = len(self.text)
        return chunk + rest

    def _extend(self, new: str) -> str:
        if not new:
            return ""
        old_length = len(self.text)
        self.text += new
        if self.stops:
            search_from = max(0, old_length - self.longest_stop + 1)
            hits = [i for i in (self.text.find(s, search_from) for s in self.stops) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                chunk = self.text[self.shown :]
                self.shown = len(self.text)
                return chunk
        safe = len(self.text) - held_back(self.text, self.stops)
        if safe <= self.shown:
            return ""
        chunk = self.text[self.shown : safe]
        self.shown = safe
        return chunk


def text_of(token_bytes: TokenBytes, ids: Sequence[int]) -> str:
    """The text of token ids, decoded the way streaming decodes them (bytes joined, then UTF-8)."""
    return b"".join(token_bytes(i) for i in ids).decode("utf-8", errors="replace")
