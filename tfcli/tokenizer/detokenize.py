"""Token ids to text, always through the tokenizer's own decoder (`tokenizers`), as serving engines detokenize:
a completion's text is decode(context + new ids) less decode(context) off the front, so a decoder that strips
the first space of a text (SentencePiece's `Strip`, Metaspace) never eats the space before the first new word.

`IncrementalDecoder` gives that text as the ids arrive, at a constant cost per id: it decodes a short window
of recent ids (a few already given out, for the decoder's start-of-text rules, then the new ones) and gives
out what the window's text adds, as vLLM and TGI do with their prefix and read offsets. It holds back

- a last character U+FFFD (a character whose bytes are split across tokens: it shows once complete),
- an unfinished run of byte-fallback tokens (`<0xE4>`): the `ByteFallback` decoder turns a whole run into
  U+FFFD when any byte of it is invalid, so a run's text is final only when a token that is not a byte ends it
  (special tokens left out of the text do not: the bytes on either side of one join), and
- where the tokenizer cleans up spaces (tokenizer_config.json's clean_up_tokenization_spaces: " ." -> "."),
  a tail the clean-up may still change (" n" may yet go on "'t", and its space go: `cleanup.settled_length`),

so the pieces it gives out join to exactly the text of a single decode. (`tokenizers.decoders.DecodeStream`
does the same windowing, but shows a byte run early, then fails with "Invalid prefix" when the run turns out
invalid, and has no way to flush what it holds when the text ends.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tfcli.tokenizer.cleanup import clean_up_spaces, settled_length

if TYPE_CHECKING:
    from tfcli.tokenizer.core import TextTokenizer

REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not (yet) a whole UTF-8 character
CONTEXT_TOKENS = 4  # ids kept before the new ones: the decoder's start-of-text rules act on those, not on new text
WINDOW_TOKENS = 16  # past this many ids the window is cut back to CONTEXT_TOKENS (one extra decode)


class IncrementalDecoder:
    """The text that ids add after a context, given out piece by piece.

    `extend(ids)` returns the text that is final now (possibly ""); `finish()` the rest (a character left
    unfinished comes out as the decoder writes it, U+FFFD). The pieces join to
    `tokenizer.decode(context + ids)` less `tokenizer.decode(context)` (but where the tokenizer cleans up spaces
    and the clean-up takes out a space at the end of the context's text, which was given out with it).

    Example (a Llama-2 tokenizer, whose decoder strips the first space of a text):
        d = IncrementalDecoder(tok, tok.encode("Once upon a time"))
        d.extend([id("▁there")]) -> " there";  d.extend([id("<0xE4>")]) -> "";  ...
    """

    def __init__(self, tokenizer: TextTokenizer, context: Sequence[int] = (), *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        # ids after which a byte run may go on: its bytes, and the special tokens a decode leaves out between them
        runs = tokenizer.byte_fallback_ids
        self._run_ids = runs | tokenizer.skipped_ids if runs and skip_special_tokens else runs
        start = max(0, len(context) - CONTEXT_TOKENS)
        while 0 < start < len(context) and context[-1] in self._run_ids and context[start - 1] in self._run_ids:
            start -= 1  # a byte run the context leaves open is decoded whole, as the new ids may go on with it
        self._window = list(context[start:])
        self._text, settled = self._decode(self._window)  # the window's text as last decoded
        self._given = len(self._text)  # chars of it given out: the context's text is the prompt's, all of it
        self._loose = self._text[settled:]  # the end of what is given that a space clean-up may still change

    def _decode(self, ids: list[int]) -> tuple[str, int]:
        """The text of `ids`, and how much of its start no later id changes by a space clean-up."""
        if not ids:
            return "", 0
        raw = self._tokenizer.library_decode(ids, self._skip)  # TextTokenizer.decode, in its two steps
        if not self._tokenizer.cleans_up_spaces:
            return raw, len(raw)
        return clean_up_spaces(raw), settled_length(raw)

    def copy(self) -> IncrementalDecoder:
        """An independent copy (beam search extends one hypothesis into several)."""
        twin = object.__new__(IncrementalDecoder)
        twin.__dict__.update(self.__dict__)
        twin._window = self._window[:]
        return twin

    def extend(self, ids: Sequence[int]) -> str:
        """Add ids; return the text now final that they add."""
        if not ids:
            return ""
        self._window.extend(ids)
        if ids[-1] in self._run_ids:  # a byte run may still turn to U+FFFD as a whole: no decode until it ends
            return ""
        text, settled = self._decode(self._window)
        if self._loose and not self._place_loose(text, settled):
            return ""
        end = min(settled, len(text) - text.endswith(REPLACEMENT))
        piece = text[self._given : end] if end > self._given else ""
        self._text, self._given = text, max(self._given, end)
        if len(self._window) > WINDOW_TOKENS and self._given <= len(text):
            self._cut_window()
        return piece

    def _place_loose(self, text: str, settled: int) -> bool:
        """Find where the context's loose end (given out, but then still open to the space clean-up) ends in
        `text`, once settled there: its spaces the clean-up took out are not in `text`. False while it is open."""
        end = _end_of(self._loose, text, self._given - len(self._loose))
        if end is None or end > settled:
            return False
        self._given, self._loose = end, ""
        return True

    @property
    def pending(self) -> bool:
        """Whether the ids so far hold text not given out yet (part of a character, an unfinished byte run)."""
        return bool(self._window) and (self._window[-1] in self._run_ids or REPLACEMENT in self._text[self._given :])

    def finish(self) -> str:
        """The text still held back: an unfinished character or byte run, as the decoder writes it."""
        text, _ = self._decode(self._window)
        if self._loose:
            self._place_loose(text, len(text))
            self._loose = ""
        piece = text[self._given :]
        self._text, self._given = text, max(self._given, len(text))
        return piece

    def _cut_window(self) -> None:
        """Keep the last CONTEXT_TOKENS ids, where the text still held back (a character, a tail the space
        clean-up may change) is at the end of their text too, and no more of it open; else wait for a later step."""
        held = self._text[self._given :]
        tail = self._window[-CONTEXT_TOKENS:]
        tail_text, settled = self._decode(tail)
        if len(tail_text) >= len(held) and tail_text.endswith(held) and settled >= len(tail_text) - len(held):
            self._window, self._text, self._given = tail, tail_text, len(tail_text) - len(held)


def _end_of(given: str, text: str, start: int) -> int | None:
    """Where `given`, found in `text` at `start` with none, some or all of its spaces taken out, ends; None
    where it is not there.

    Example: _end_of(" n'", "don't", 2) -> 4 (the context's "do n'" is "don'" now)
    """
    at = start
    for char in given:
        if at < len(text) and text[at] == char:
            at += 1
        elif char != " ":
            return None
    return at


def decode_pieces(tokenizer: TextTokenizer, context: Sequence[int], ids: Sequence[int]) -> list[str]:
    """The text each id adds after `context`, as streaming gives it out: a character split across tokens
    belongs to the token that completes it (the others add ""). The pieces join to the completion's text.

    Example (byte-level BPE, "é" split over two tokens): " café!" -> [" caf", "", "é", "!"]"""
    decoder = IncrementalDecoder(tokenizer, context)
    pieces = [decoder.extend([i]) for i in ids]
    rest = decoder.finish()
    if rest:
        pieces[-1] += rest
    return pieces


def decode_completion(tokenizer: TextTokenizer, context: Sequence[int], ids: Sequence[int]) -> str:
    """The text `ids` add after `context`: decode(context + ids) less decode(context), as streaming gives it."""
    decoder = IncrementalDecoder(tokenizer, context)
    return decoder.extend(list(ids)) + decoder.finish()


def alone_texts(tokenizer: TextTokenizer, ids: Sequence[int]) -> list[str]:
    """The text each id adds after an ordinary word, special tokens' text included: a token as it reads on its
    own, but for the decoder's start-of-text rules (a word keeps the space it carries: " cat", and a WordPiece
    piece that continues a word has none: "ing"). Part of a character comes out as U+FFFD.

    Example (GPT-2): [id("Ġcat"), id("Ċ"), id("<|endoftext|>")] -> [" cat", "\\n", "<|endoftext|>"]"""
    anchor = _ordinary_word(tokenizer)
    prefix = tokenizer.decode(anchor)
    decoded = tokenizer.decode_batch([anchor + [i] for i in ids])
    return [text[len(prefix) :] if text.startswith(prefix) else text for text in decoded]


def _ordinary_word(tokenizer: TextTokenizer) -> list[int]:
    """One id that reads as an ordinary word: the last token of "a", or the first id that is not special where
    "a" does not encode (a vocabulary without "a" whose unknown token is missing makes the library raise)."""
    try:
        found = tokenizer.encode("a")[-1:]
    except Exception:  # the tokenizers library raises a plain Exception
        found = []
    if found:
        return found
    special = set(tokenizer.special_ids.values()) | set(tokenizer.hf.get_added_tokens_decoder())
    return [next((i for i in range(tokenizer.vocab_size) if i not in special), 0)]


def text_byte_lengths(tokenizer: TextTokenizer) -> list[int]:
    """Per id, the bytes of text it stands for (bits per byte divide by their sum): what it adds, in UTF-8, to
    the decoder's text between two ordinary words, so that the space a decoder writes between words counts
    once, with the token that carries it (before a word for byte-level, Metaspace and WordPiece tokens, after
    it for a `</w>` BPE). A token that is only part of a character adds no whole character; it stands for one
    byte per symbol of its vocabulary entry where the decoder maps symbols to bytes (GPT-2's ByteLevel), and
    for one byte as a byte-fallback piece `<0xE6>`."""
    anchor = _ordinary_word(tokenizer)
    base = len(tokenizer.decode(anchor + anchor).encode("utf-8"))
    ids = range(tokenizer.vocab_size)
    texts = tokenizer.decode_batch([anchor + [i] + anchor for i in ids])
    byte_symbols = tokenizer.decodes_byte_symbols
    lengths = []
    for token_id, text in zip(ids, texts):
        if REPLACEMENT not in text:
            lengths.append(len(text.encode("utf-8")) - base)
        elif token_id in tokenizer.byte_fallback_ids:
            lengths.append(1)
        elif byte_symbols:
            lengths.append(len(tokenizer.hf.id_to_token(token_id) or ""))
        else:
            lengths.append(len(text.encode("utf-8")) - base)
    return lengths
