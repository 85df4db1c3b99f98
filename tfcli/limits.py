"""The caps on what a reader takes from a file, a pipe or a decompressor, each raised through its environment
variable (docs/limits.md lists them), and readers that stop at the cap. Imports nothing of tfcli but errors."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from tfcli.errors import TfcliError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
READ_BLOCK = 1 << 20  # what a reader of a pipe or a long file takes at a time


@dataclasses.dataclass(frozen=True)
class Limit:
    """One cap: the environment variable that changes it, its default, and what it bounds (for messages)."""

    env: str
    default: int
    what: str
    unit: str = "bytes"

    @property
    def value(self) -> int:
        """The cap in force: the environment variable's value (a whole number, K/M/G suffixes allowed) or the default."""
        raw = os.environ.get(self.env, "").strip()
        if not raw:
            return self.default
        number, suffix = raw.rstrip("KMGTkmgtBb"), raw[len(raw.rstrip("KMGTkmgtBb")) :].upper().rstrip("B").rstrip("I")
        if not number.isdigit() or suffix not in _UNITS or int(number) < 1:
            raise TfcliError(f"{self.env}={raw!r} is not a positive whole number", hint=f"e.g. {self.env}={_env_form(self.default)}")
        return int(number) * _UNITS[suffix]

    def how_to_raise(self) -> str:
        return f"set {self.env} to raise it (the default is {shown(self.default, self.unit)}; docs/limits.md)"

    def exceeded(self, subject: str) -> TfcliError:
        """The one line for `subject` (e.g. "prompts.txt line 3") going past this cap."""
        bigger = "is larger than" if self.unit == "bytes" else "is longer than" if self.unit == "characters" else "goes past"
        return TfcliError(f"{subject} {bigger} {shown(self.value, self.unit)}, the limit on {self.what}", hint=self.how_to_raise())


def _env_form(n: int) -> str:
    """A cap as the environment variable takes it. Example: _env_form(64 << 20) -> "64M" """
    for suffix in ("T", "G", "M", "K"):
        if n >= _UNITS[suffix] and n % _UNITS[suffix] == 0:
            return f"{n // _UNITS[suffix]}{suffix}"
    return str(n)


def shown(n: int, unit: str = "bytes") -> str:
    """A cap as a person reads it. Example: shown(64 << 20) -> "64 MiB"; shown(200, "x") -> "200x" """
    if unit != "bytes":
        return f"{n:,}{'x' if unit == 'x' else ' ' + unit}"
    for suffix, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size:,} {suffix}"
    return f"{n:,} bytes"


JSON_FILE = Limit("TFCLI_MAX_JSON_BYTES", 64 << 20, "a JSON file tfcli reads (config.json, tokenizer_config.json, state.json, meta.json)")
TOKENIZER_FILE = Limit("TFCLI_MAX_TOKENIZER_BYTES", 512 << 20, "a tokenizer.json")
PROMPT_FILE = Limit("TFCLI_MAX_PROMPT_FILE_BYTES", 64 << 20, "a prompt file or the prompts on standard input")
RECORD = Limit("TFCLI_MAX_RECORD_CHARS", 64 << 20, "one line of JSON lines or CSV (one record)", "characters")
DECOMPRESSION_RATIO = Limit("TFCLI_MAX_DECOMPRESSION_RATIO", 200, "how much a compressed file may grow when decompressed", "x")
DECOMPRESSION_FREE = 16 << 20  # bytes any compressed file may give before its ratio is looked at
TOML_DEPTH = Limit("TFCLI_MAX_TOML_DEPTH", 64, "the nesting of a --config TOML file", "levels")
CHAT_TEMPLATE_FILE = Limit("TFCLI_MAX_CHAT_TEMPLATE_BYTES", 1 << 20, "a chat template file")
CHAT_TEMPLATE_OUTPUT = Limit("TFCLI_MAX_CHAT_TEMPLATE_CHARS", 16 << 20, "what a chat template renders", "characters")
# A GGUF file's metadata: real tokens are at most a few hundred bytes (llama.cpp's loader sets no cap of its own),
# real metadata strings (a chat template, an embedded tokenizer.json) a few megabytes
GGUF_TOKEN = Limit("TFCLI_MAX_GGUF_TOKEN_BYTES", 64 << 10, "one token of a GGUF file's vocabulary")
GGUF_STRING = Limit("TFCLI_MAX_GGUF_STRING_BYTES", 64 << 20, "one string of a GGUF file's metadata")
# and its counts: real files have at most tens of thousands of tensors (an old-style MoE file, each expert its own: 46,080
# for DeepSeek-V3) and a few hundred keys
GGUF_TENSORS = Limit("TFCLI_MAX_GGUF_TENSORS", 1 << 18, "the tensors of a GGUF file", "tensors")
GGUF_KEYS = Limit("TFCLI_MAX_GGUF_KEYS", 1 << 16, "the metadata keys of a GGUF file", "keys")


def read_capped(handle: BinaryIO, limit: Limit, subject: str) -> bytes:
    """All of `handle`, or the one line naming `limit` once it holds more; never more than the cap plus a
    block in memory. A regular file is read at its size (a small file costs its size, not the cap's), and
    one larger than the cap is refused before it is read; a pipe a block at a time."""
    cap = limit.value
    size = _regular_file_size(handle)
    if size is not None and size > cap:
        raise limit.exceeded(subject)
    wanted = READ_BLOCK if size is None else size + 1  # + 1: a file that grew since it was looked at
    blocks: list[bytes] = []
    total = 0
    while block := handle.read(min(wanted, cap + 1 - total)):
        blocks.append(block)
        total += len(block)
        if total > cap:
            raise limit.exceeded(subject)
        wanted = 1 if size is not None and total <= size else READ_BLOCK  # a file read to its size: one byte more finds its end
    return b"".join(blocks)


def _regular_file_size(handle: BinaryIO) -> int | None:
    """The bytes left to read in `handle` where it is a regular file; None for a pipe or an in-memory stream."""
    try:
        status = os.fstat(handle.fileno())
        position = handle.tell()
    except (OSError, AttributeError, ValueError):  # io.BytesIO has no file number (io.UnsupportedOperation)
        return None
    return max(status.st_size - position, 0) if stat.S_ISREG(status.st_mode) else None


def read_file_capped(path: Path, limit: Limit) -> bytes:
    """A file's bytes, at most `limit`'s; a larger file is the one line naming the cap (read no further)."""
    with open(path, "rb") as handle:
        return read_capped(handle, limit, str(path))


def read_text_capped(path: Path, limit: Limit = JSON_FILE) -> str:
    """A UTF-8 file's text (a byte-order mark kept, as read_text keeps it), at most `limit`'s bytes."""
    return read_file_capped(path, limit).decode("utf-8")


def nesting_depth(text: str | bytes, stop: int) -> int:
    """How deep JSON/TOML brackets nest, counted without parsing (strings' brackets counted too, so an
    overestimate, which is what a cap wants), up to `stop`. Example: nesting_depth("[[1], {}]", 10) -> 2"""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest >= stop:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


PROMPTS = Limit("TFCLI_MAX_PROMPTS", 100_000, "the prompts of one generate call", "prompts")
TEXT_TOKENS = Limit("TFCLI_MAX_TEXT_TOKENS", 32 << 20, "the tokens eval and train sae hold of a text file (shards are read from disk as they go)", "tokens")
BYTES_PER_TOKEN = 128  # a prompt line past context x this many bytes cannot all be used: no token is longer


def within_context(text: str, block_size: int, what: str, *, crop: bool = False, hint: str = "shorten it") -> str:
    """`text` as a command that looks at one window may tokenize it: a text longer than `block_size` tokens of
    BYTES_PER_TOKEN bytes can be is refused, or with `crop` cut to that length, before it is tokenized (the
    tokens and their views take many times the text's memory). Example: 10 MB for a 128-token model -> refused."""
    cap = (block_size + 1) * BYTES_PER_TOKEN
    if len(text) <= cap:
        return text
    if crop:
        return text[:cap]
    raise TfcliError(f"the {what} is {len(text):,} characters, more than the model's block size ({block_size:,} tokens) can hold", hint=hint)


def read_prompt_lines(handle: BinaryIO, where: str, line_cap: int, context: str) -> list[bytes]:
    """The non-blank lines of a prompt file or a pipe, read a block at a time and stopped as soon as a cap
    is passed: a line longer than `line_cap` bytes (more than the context, described by `context`, can use),
    more than PROMPTS lines, or more than PROMPT_FILE bytes in all. A NUL byte in the first block is a
    binary file. Example: b"a\\n\\n b\\r\\n" -> [b"a", b" b"]"""
    total_cap, count_cap = PROMPT_FILE.value, PROMPTS.value
    lines: list[bytes] = []
    pending = b""
    total = number = 0
    first = True
    while True:
        block = handle.read(READ_BLOCK)
        if first and b"\x00" in block[:8192]:
            raise TfcliError(f"{where} looks like a binary file (it holds NUL bytes)", hint="pass a text file with one prompt per line")
        first = False
        total += len(block)
        if total > total_cap:
            raise PROMPT_FILE.exceeded(where)
        parts = (pending + block).split(b"\n")
        pending = parts.pop() if block else b""
        for line in parts:  # at the end (no block), the last line without its newline
            number += 1
            line = line.removesuffix(b"\r")
            if len(line) > line_cap:
                raise _long_line(where, number, line_cap, context)
            if line.strip():
                lines.append(line)
                if len(lines) > count_cap:
                    raise TfcliError(f"{where} holds more than {count_cap:,} prompts, the limit on {PROMPTS.what}", hint=PROMPTS.how_to_raise())
        if len(pending) > line_cap:
            raise _long_line(where, number + 1, line_cap, context)
        if not block:
            return lines


def _long_line(where: str, number: int, line_cap: int, context: str) -> TfcliError:
    return TfcliError(
        f"{where} line {number:,} is longer than {shown(line_cap)}, more than {context} can use ({BYTES_PER_TOKEN} bytes a token at most)",
        hint="shorten the prompt to its end (the part the model continues)",
    )


def capped_lines(handle: BinaryIO, line_cap: int, too_long: Callable[[int], TfcliError]) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a binary stream, each line without its "\\n" (nor a "\\r" before it), read a block
    at a time; a line longer than `line_cap` bytes raises `too_long(its number)` as soon as the cap is passed,
    without reading the rest of it, so memory stays a block plus the cap whatever the stream holds.
    Example: b"a\\r\\n\\nb" -> (1, b"a"), (2, b""), (3, b"b")"""
    held: list[bytes] = []  # the start of a line whose end has not been read yet
    held_bytes = number = 0
    while True:
        block = handle.read(READ_BLOCK)
        if not block:
            if held:
                yield number + 1, b"".join(held).removesuffix(b"\r")
            return
        parts = block.split(b"\n")
        tail = parts.pop()
        if parts and held:
            parts[0] = b"".join(held) + parts[0]
            held, held_bytes = [], 0
        for line in parts:
            number += 1
            line = line.removesuffix(b"\r")
            if len(line) > line_cap:
                raise too_long(number)
            yield number, line
        if tail:
            held.append(tail)
            held_bytes += len(tail)
            if held_bytes > line_cap + 1:  # + 1: a "\r" the line may end with
                raise too_long(number + 1)


ALL = (
    JSON_FILE,
    TOKENIZER_FILE,
    PROMPT_FILE,
    PROMPTS,
    RECORD,
    DECOMPRESSION_RATIO,
    TOML_DEPTH,
    CHAT_TEMPLATE_FILE,
    CHAT_TEMPLATE_OUTPUT,
    GGUF_TOKEN,
    GGUF_STRING,
    GGUF_TENSORS,
    GGUF_KEYS,
)  # docs/limits.md lists them
