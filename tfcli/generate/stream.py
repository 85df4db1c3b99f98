"""A completion's text as it is made: the tokenizer's own decoder run incrementally after the prompt
(`tokenizer/detokenize.py`: a character split across tokens shows once complete, never as U+FFFD), and stop
strings cut off before they are shown. The chunks a completion streams concatenate to exactly its final text,
which is decode(prompt + new ids) less decode(prompt). Torch-free.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.detokenize import IncrementalDecoder


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
    """One completion's text, built token by token after its context (the prompt's ids, or nothing for an
    encoder-decoder's target).

    `add(token_id)` returns the text that is now safe to show (possibly ""); `finish()` returns the rest.
    A stop string ends the text where it begins (`stopped` becomes True and the stop string is dropped).
    `pieces` holds the text each token added (joined: the text before any stop string was cut).
    """

    def __init__(self, tokenizer: TextTokenizer, context: Sequence[int] = (), stops: Sequence[str] = ()) -> None:
        self.decoder = IncrementalDecoder(tokenizer, context)
        self.stops = tuple(stops)
        self.longest_stop = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.pieces: list[str] = []
        self.shown = 0  # characters of `text` already returned
        self.stopped = False

    def fork(self) -> CompletionText:
        """A copy that goes on independently (beam search extends one hypothesis into several)."""
        twin = copy.copy(self)
        twin.decoder = self.decoder.copy()
        twin.pieces = self.pieces[:]
        return twin

    def add(self, token_id: int) -> str:
        if self.stopped:
            return ""
        piece = self.decoder.extend([token_id])
        self.pieces.append(piece)
        return self._extend(piece)

    def finish(self) -> str:
        """The end of the completion (end-of-text, a length limit): flush what is held back."""
        if self.stopped:
            return ""
        rest = self.decoder.finish()  # an unfinished character comes out as the decoder writes it (U+FFFD)
        if rest and self.pieces:
            self.pieces[-1] += rest
        chunk = self._extend(rest)
        if self.stopped:
            return chunk
        tail = self.text[self.shown :]
        self.shown = len(self.text)
        return chunk + tail

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
