"""Reading text corpora: resolve files, folders and globs; stream them as text in bounded pieces.

tfcli reads input itself (never through a library's file reader) so that one invalid UTF-8 byte is
replaced and counted instead of aborting a run, and so a line of megabytes without a newline is cut
into bounded pieces. Nothing here holds a whole file in memory.
"""

from __future__ import annotations

import codecs
import dataclasses
import glob
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind

READ_BLOCK_BYTES = 1 << 20
MAX_PIECE_CHARS = 1 << 16
BINARY_SNIFF_BYTES = 8192

DocumentBoundary = Literal["paragraph", "line", "file"]
DOCUMENT_BOUNDARIES: tuple[str, ...] = ("paragraph", "line", "file")

# Bytes that are not valid UTF-8 come back from the "surrogateescape" decoder as lone surrogates
# U+DC80..U+DCFF (one per byte); valid UTF-8 never decodes to them, so they count the bad bytes exactly.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# A paragraph ends at a line break followed by one or more blank (whitespace-only) lines.
_LINE_BREAK = r"(?:\r\n|\r(?!\n)|\n)"
_TRAILING_BLANK_LINE = re.compile(_LINE_BREAK + r"[^\S\r\n]*\Z")
_PARAGRAPH_BREAK = re.compile(_LINE_BREAK + r"(?:[^\S\r\n]*" + _LINE_BREAK + ")+")
_LEADING_BLANK_LINES = re.compile(r"\A(?:[^\S\r\n]*" + _LINE_BREAK + ")+")


@dataclasses.dataclass(frozen=True)
class CorpusFile:
    path: Path
    size: int


@dataclasses.dataclass
class Corpus:
    """The text files a command reads, in a stable order, and the ones skipped while walking folders."""

    files: list[CorpusFile]
    skipped_binary: list[Path] = dataclasses.field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclasses.dataclass
class ReadStats:
    """What reading has seen so far; progress displays poll `bytes_read`."""

    bytes_read: int = 0
    files_done: int = 0
    invalid_bytes: int = 0
    files_with_invalid_utf8: set[Path] = dataclasses.field(default_factory=set)


def replace_lone_surrogates(text: str) -> str:
    """Replace code points no UTF-8 encoder accepts with U+FFFD. Example: "a\\ud800b" -> "a\\ufffdb"."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def looks_binary(head: bytes) -> bool:
    """What makes a file binary to every tfcli command: a NUL byte in its first BINARY_SNIFF_BYTES."""
    return b"\x00" in head[:BINARY_SNIFF_BYTES]


def binary_file_error(path: Path) -> TfcliError:
    """The one line every command gives for a binary file where text was asked for."""
    return TfcliError(f"{path} looks like a binary file (it holds NUL bytes)", hint="pass text files only")


def _looks_binary(path: Path) -> bool:
    with open(path, "rb") as handle:
        return looks_binary(handle.read(BINARY_SNIFF_BYTES))


def _walk(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(Path(root, name) for name in sorted(files) if not name.startswith("."))
    return found


def resolve_corpus(inputs: Sequence[str | Path]) -> Corpus:
    """Expand files, folders (walked recursively, hidden entries skipped) and globs into a Corpus.

    A named file that is missing or binary is an error; a binary file met while walking a folder is
    skipped and listed in `skipped_binary`. The same file named twice is read once.
    """
    if not inputs:
        raise TfcliError("no corpus given", hint="pass one or more text files, folders or globs")
    candidates: list[tuple[Path, bool]] = []  # (path, named explicitly)
    for raw in inputs:
        text = str(raw)
        if glob.has_magic(text) and not Path(text).exists():
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise TfcliError(f"no file matches {text}", hint="check the pattern, or quote it so the shell leaves it to tfcli")
            for match in matches:
                p = Path(match)
                candidates.extend([(f, False) for f in _walk(p)] if p.is_dir() else [(p, False)])
            continue
        path = Path(text)
        if not path.exists():
            raise TfcliError(f"{path} does not exist", hint="check the path")
        kind = artifact_kind(path)
        if kind:
            raise TfcliError(f"{path} is {kind}, not text", hint="pass text files, or folders of them")
        if path.is_dir():
            files = _walk(path)
            if not files:
                raise TfcliError(f"folder {path} holds no files (hidden ones are skipped)", hint="pass a folder with text files in it")
            candidates.extend((f, False) for f in files)
        else:
            candidates.append((path, True))

    seen: set[Path] = set()
    corpus = Corpus(files=[])
    for path, explicit in candidates:
        key = path.resolve()
        if key in seen or not path.is_file():
            continue
        seen.add(key)
        try:
            binary = _looks_binary(path)
            size = path.stat().st_size
        except OSError as exc:
            raise TfcliError(f"cannot read {path}: {exc.strerror}", hint="check its permissions") from exc
        if binary:
            if explicit:
                raise binary_file_error(path)
            corpus.skipped_binary.append(path)
            continue
        corpus.files.append(CorpusFile(path=path, size=size))
    if not corpus.files:
        raise TfcliError("the corpus holds no text files (only binary ones)", hint="pass text files, folders or globs")
    return corpus


def read_text_blocks(path: Path, stats: ReadStats, block_bytes: int | None = None) -> Iterator[str]:
    """Yield the file's text in blocks of about `block_bytes` (default READ_BLOCK_BYTES); invalid UTF-8
    bytes become U+FFFD, counted."""
    block_bytes = block_bytes or READ_BLOCK_BYTES
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    bad_in_file = 0
    with open(path, "rb") as handle:
        while True:
            block = handle.read(block_bytes)
            final = not block
            text = decoder.decode(block, final=final)
            stats.bytes_read += len(block)
            if text:
                if _ESCAPED_BYTE.search(text):
                    text, bad = _ESCAPED_BYTE.subn("\ufffd", text)
                    bad_in_file += bad
                yield text
            if final:
                break
    if bad_in_file:
        stats.invalid_bytes += bad_in_file
        stats.files_with_invalid_utf8.add(path)
    stats.files_done += 1


def split_long(text: str, limit: int = MAX_PIECE_CHARS) -> list[str]:
    """Cut `text` into pieces of at most `limit` characters, preferring to cut just before a space
    so that pre-tokenization (which starts a word at its leading space) sees the same words.

    Example: split_long("aaa bbb ccc", 5) -> ["aaa", " bbb", " ccc"]
    """
    pieces = []
    start = 0
    while len(text) - start > limit:
        end = start + limit
        cut = text.rfind(" ", start + 1, end)
        while cut > start + 1 and text[cut - 1] == " ":  # keep a run of spaces with the word after it
            cut -= 1
        if cut <= start:
            cut = end
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def iter_line_blocks(path: Path, stats: ReadStats, limit: int = MAX_PIECE_CHARS) -> Iterator[list[str]]:
    """Yield the file's lines, with their line endings, a read block's worth at a time; a line longer
    than `limit` comes in pieces. Lists rather than single lines keep Python's per-line cost off the
    hot path of tokenizer training."""
    pending = ""
    for block in read_text_blocks(path, stats):
        lines = (pending + block).splitlines(keepends=True)
        pending = lines.pop() if lines and not lines[-1].endswith(("\n", "\r")) else ""
        if len(pending) > limit:  # a huge line without a newline yet: release all but the tail
            *head, pending = split_long(pending, limit)
            lines.extend(head)
        if any(len(line) > limit for line in lines):
            lines = [piece for line in lines for piece in (split_long(line, limit) if len(line) > limit else (line,))]
        if lines:
            yield lines
    if pending:
        yield split_long(pending, limit)


def iter_lines(path: Path, stats: ReadStats, limit: int = MAX_PIECE_CHARS) -> Iterator[str]:
    """Yield the file's lines with their line endings; a line longer than `limit` comes in pieces."""
    for lines in iter_line_blocks(path, stats, limit):
        yield from lines


@dataclasses.dataclass(frozen=True)
class DocumentPiece:
    """A bounded piece of one document; `ends_document` marks its last piece."""

    text: str
    ends_document: bool


def iter_document_pieces(
    corpus: Corpus, boundary: DocumentBoundary, stats: ReadStats, limit: int = MAX_PIECE_CHARS
) -> Iterator[DocumentPiece]:
    """Stream the corpus as documents, each in pieces of at most about `limit` characters.

    boundary "paragraph": a blank line ends a document; "line": every non-blank line is one;
    "file": every file is one. A document's trailing line break is dropped (the end-of-text id
    takes its place). Empty documents are never produced.
    """
    for corpus_file in corpus.files:
        if boundary == "file":
            yield from _file_document(corpus_file.path, stats, limit)
        elif boundary == "paragraph":
            yield from _paragraph_documents(corpus_file.path, stats, limit)
        else:
            yield from _line_documents(corpus_file.path, stats, limit)


def _file_document(path: Path, stats: ReadStats, limit: int) -> Iterator[DocumentPiece]:
    held = ""
    sent = False
    for block in read_text_blocks(path, stats):
        held += block
        if len(held) > limit:
            *ready, held = split_long(held, limit)
            for piece in ready:
                yield DocumentPiece(piece, False)
                sent = True
    held = held.rstrip("\r\n")
    if held or sent:
        yield DocumentPiece(held, True)


def _paragraph_documents(path: Path, stats: ReadStats, limit: int) -> Iterator[DocumentPiece]:
    """Documents separated by blank lines; the splitting runs once per read block, in C."""
    held = ""  # the start of a paragraph whose end has not been read yet
    continued = False  # pieces of that paragraph were already sent
    for block in read_text_blocks(path, stats):
        *complete, held = _PARAGRAPH_BREAK.split(held + block)
        for paragraph in complete:
            if not continued:
                paragraph = _LEADING_BLANK_LINES.sub("", paragraph)
            if paragraph.strip() or continued:
                yield from _bounded(paragraph, limit, ends=True)
            continued = False
        if len(held) > limit:  # a paragraph longer than the limit: send all but its tail
            *ready, held = split_long(held, limit)
            for piece in ready:
                if not continued:
                    piece = _LEADING_BLANK_LINES.sub("", piece)
                if continued or piece.strip():
                    yield DocumentPiece(piece, False)
                    continued = True
    held = _TRAILING_BLANK_LINE.sub("", held)
    held = held.rstrip("\r\n") if continued else _LEADING_BLANK_LINES.sub("", held).rstrip("\r\n")
    if held.strip() or continued:
        yield from _bounded(held, limit, ends=True)


def _bounded(text: str, limit: int, ends: bool) -> Iterator[DocumentPiece]:
    pieces = split_long(text, limit) if len(text) > limit else [text]
    for i, piece in enumerate(pieces):
        yield DocumentPiece(piece, ends and i == len(pieces) - 1)


def _line_documents(path: Path, stats: ReadStats, limit: int) -> Iterator[DocumentPiece]:
    """Every non-blank line is a document; a line longer than `limit` arrives (and leaves) in pieces."""
    open_piece: str | None = None  # a piece of a long line, held until we know whether the line goes on
    for line in iter_lines(path, stats, limit):
        body = line.rstrip("\r\n")
        ends_line = len(body) < len(line)
        if open_piece is not None:
            yield DocumentPiece(open_piece, False)
            open_piece = None
        elif not body.strip():
            continue
        if ends_line:
            yield DocumentPiece(body, True)
        else:
            open_piece = body
    if open_piece is not None:
        yield DocumentPiece(open_piece, True)
