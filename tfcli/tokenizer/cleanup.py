"""transformers' `clean_up_tokenization_spaces`: the spaces a decode takes out before punctuation and English
contractions (" ." -> ".", " n't" -> "n't"), and how much of a cleaned text is settled while more text may
follow it (for streaming). Pure string functions; whether a tokenizer asks for them is `TextTokenizer`'s.
"""

from __future__ import annotations

# transformers' PreTrainedTokenizerBase.clean_up_tokenization, replacement by replacement, in its order
REPLACEMENTS: tuple[tuple[str, str], ...] = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def clean_up_spaces(text: str) -> str:
    """The text as transformers' decode leaves it with clean_up_tokenization_spaces on.

    Example: "don ' t stop , ok ?" -> "don't stop, ok?"
    """
    for old, new in REPLACEMENTS:
        text = text.replace(old, new)
    return text


def settled_length(text: str) -> int:
    """How many characters at the start of clean_up_spaces(text) stay as they are whatever text comes after
    `text`: each replacement runs as a stream over what the one before it has settled, holding back a tail
    that could begin a match. (A text that ends in " n" may yet go on "'t", whose space goes.)

    Example: "a , b n" -> 4 (clean_up_spaces gives "a, b n"; " n" waits)
    """
    for old, new in REPLACEMENTS:
        text = _settled_replace(text, old, new)
    return len(text)


def _settled_replace(text: str, old: str, new: str) -> str:
    """The start of text.replace(old, new) that no text after `text` changes: str.replace matches leftmost
    first without overlaps, so past its last match only a tail that is the start of `old` can still become one.

    Example: _settled_replace("a . b ", " .", ".") -> "a. b"
    """
    parts = []
    start = 0
    while (found := text.find(old, start)) != -1:
        parts += [text[start:found], new]
        start = found + len(old)
    rest = text[start:]
    cut = next((k for k in range(max(0, len(rest) - len(old) + 1), len(rest)) if old.startswith(rest[k:])), len(rest))
    parts.append(rest[:cut])
    return "".join(parts)
