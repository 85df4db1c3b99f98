"""Documents: a corpus streamed as documents in bounded pieces (for shards and evaluation), or as batches of
lines and record texts (for tokenizer training).

A text file's documents are its paragraphs, its non-blank lines or the whole file; a record's text is one
document. Nothing here holds a whole document in memory: a long one comes in pieces of at most about
MAX_PIECE_CHARS characters.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Literal

from tfcli.corpus.reader import (
    MAX_PIECE_CHARS,
    READ_BLOCK_BYTES,
    Corpus,
    ReadStats,
    decode_blocks,
    iter_record_texts,
    line_blocks,
    open_corpus_file,
    split_long,
)
from tfcli.errors import TfcliError

DocumentBoundary = Literal["paragraph", "line", "file"]
DOCUMENT_BOUNDARIES: tuple[str, ...] = ("paragraph", "line", "file")

# A paragraph ends at a line break followed by one or more blank (whitespace-only) lines.
_LINE_BREAK = r"(?:\r\n|\r(?!\n)|\n)"
_TRAILING_BLANK_LINE = re.compile(_LINE_BREAK + r"[^\S\r\n]*\Z")
_PARAGRAPH_BREAK = re.compile(_LINE_BREAK + r"(?:[^\S\r\n]*" + _LINE_BREAK + ")+")
_LEADING_BLANK_LINES = re.compile(r"\A(?:[^\S\r\n]*" + _LINE_BREAK + ")+")


@dataclasses.dataclass(frozen=True)
class DocumentPiece:
    """A bounded piece of one document; `ends_document` marks its last piece."""

    text: str
    ends_document: bool


def iter_document_pieces(corpus: Corpus, boundary: DocumentBoundary, stats: ReadStats, limit: int = MAX_PIECE_CHARS) -> Iterator[DocumentPiece]:
    """Stream the corpus as documents, each in pieces of at most about `limit` characters.

    Text files, by `boundary`: "paragraph": a blank line ends a document; "line": every non-blank line is
    one; "file": every file is one. A document's trailing line break is dropped (the end-of-text id
    takes its place). JSON lines, CSV / TSV and Parquet: the text of each record (`corpus.field`) is one
    document, as it is. Empty documents are never produced.
    """
    for corpus_file in corpus.files:
        with open_corpus_file(corpus_file, stats) as opened:
            if opened.format != "text":
                for text in iter_record_texts(opened, corpus.field, stats):
                    yield from _bounded(text, limit, ends=True)
            elif boundary == "file":
                yield from _file_document(decode_blocks(opened, stats), limit)
            elif boundary == "paragraph":
                yield from _paragraph_documents(decode_blocks(opened, stats), limit)
            else:
                yield from _line_documents(decode_blocks(opened, stats), limit)
        stats.files_done += 1


def iter_text_batches(corpus: Corpus, stats: ReadStats, limit: int = MAX_PIECE_CHARS) -> Iterator[list[str]]:
    """The corpus as lists of strings of about a read block each, for tokenizer training: the lines of
    text files (with their line endings), the texts of records; nothing longer than `limit`."""
    for corpus_file in corpus.files:
        with open_corpus_file(corpus_file, stats) as opened:
            if opened.format == "text":
                yield from line_blocks(decode_blocks(opened, stats), limit)
            else:
                batch: list[str] = []
                chars = 0
                for text in iter_record_texts(opened, corpus.field, stats):
                    if len(text) > limit:
                        batch.extend(split_long(text, limit))
                    else:
                        batch.append(text)
                    chars += len(text)
                    if chars >= READ_BLOCK_BYTES:
                        yield batch
                        batch, chars = [], 0
                if batch:
                    yield batch
        stats.files_done += 1


def empty_corpus_error(corpus: Corpus, stats: ReadStats) -> TfcliError:
    """The error for a corpus that gave no text: which records were skipped, if any, and why."""
    if stats.skipped_records:
        return TfcliError(
            f"no record in the corpus has text in {corpus.field!r}: {stats.skipped_records:,} skipped (the first: {stats.skipped_examples[0]})",
            hint="name the field or column that holds the text with --field",
        )
    return TfcliError("the corpus is empty (no text in any file)", hint="pass files that hold text")


def _file_document(blocks: Iterator[str], limit: int) -> Iterator[DocumentPiece]:
    held = ""
    sent = False
    for block in blocks:
        held += block
        if len(held) > limit:
            *ready, held = split_long(held, limit)
            for piece in ready:
                yield DocumentPiece(piece, False)
                sent = True
    held = held.rstrip("\r\n")
    if held or sent:
        yield DocumentPiece(held, True)


def _paragraph_documents(blocks: Iterator[str], limit: int) -> Iterator[DocumentPiece]:
    """Documents separated by blank lines; the splitting runs once per read block, in C."""
    held = ""  # the start of a paragraph whose end has not been read yet
    continued = False  # pieces of that paragraph were already sent
    for block in blocks:
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


def _line_documents(blocks: Iterator[str], limit: int) -> Iterator[DocumentPiece]:
    """Every non-blank line is a document; a line longer than `limit` arrives (and leaves) in pieces."""
    open_piece: str | None = None  # a piece of a long line, held until we know whether the line goes on
    for lines in line_blocks(blocks, limit):
        for line in lines:
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
