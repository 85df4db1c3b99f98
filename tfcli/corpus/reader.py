"""Reading corpora: resolve files, folders, globs and standard input; stream them as text in bounded pieces,
and the texts of records. Cutting the text into documents (and into batches for tokenizer training) is
`tfcli.corpus.documents`.

tfcli reads input itself (never through a library's file reader) so that one invalid UTF-8 byte is
replaced and counted instead of aborting a run, and so a line of megabytes without a newline is cut
into bounded pieces. Files may be plain text, JSON lines, CSV / TSV or Parquet, compressed or not
(`tfcli.corpus.formats`); in the record formats each record's text field is one document, and a record
without text there is skipped and counted. Nothing here holds a whole file in memory.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import glob
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from tfcli.corpus import formats, records
from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind

READ_BLOCK_BYTES = 1 << 20
MAX_PIECE_CHARS = 1 << 16
MAX_SKIP_EXAMPLES = 3  # skipped records named in summaries (all are counted)
DEFAULT_FIELD = "text"
_log = logging.getLogger("tfcli.corpus")

# Bytes that are not valid UTF-8 come back from the "surrogateescape" decoder as lone surrogates
# U+DC80..U+DCFF (one per byte); valid UTF-8 never decodes to them, so they count the bad bytes exactly.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE_UNDECODABLE = "tfcli.escape-undecodable"


def _escape_undecodable(error: UnicodeError) -> tuple[str, int]:
    """UTF-16 and UTF-32's bad bytes (a lone surrogate, an odd byte at the end) escaped as surrogateescape
    escapes UTF-8's, one U+DC80 a byte, so they are counted and replaced alike."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return "\udc80" * (error.end - error.start), error.end


codecs.register_error(_ESCAPE_UNDECODABLE, _escape_undecodable)


@dataclasses.dataclass(frozen=True)
class CorpusFile:
    path: Path  # Path("-") for standard input
    size: int  # bytes on disk (compressed size when compressed); 0 for standard input
    format: str = "text"  # text, jsonl, csv, tsv or parquet ("auto" for standard input: told when read)
    compression: str | None = None  # gzip, zstd, xz, bzip2

    @property
    def is_stdin(self) -> bool:
        return str(self.path) == formats.STDIN


@dataclasses.dataclass
class Corpus:
    """The files a command reads, in a stable order, and the ones skipped while walking folders.

    `field` names the text of a record in JSON lines (a dotted path reaches into nested objects), CSV / TSV
    (a header column) and Parquet (a column); plain text files ignore it.
    """

    files: list[CorpusFile]
    skipped_binary: list[Path] = dataclasses.field(default_factory=list)
    field: str = DEFAULT_FIELD
    input_format: str = "auto"

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def has_stdin(self) -> bool:
        return any(f.is_stdin for f in self.files)


@dataclasses.dataclass
class ReadStats:
    """What reading has seen so far; progress displays poll `bytes_read`."""

    bytes_read: int = 0
    files_done: int = 0
    invalid_bytes: int = 0
    files_with_invalid_utf8: set[Path] = dataclasses.field(default_factory=set)
    skipped_records: int = 0  # records whose field is missing or not a string
    skipped_examples: list[str] = dataclasses.field(default_factory=list)  # the first few, by file and line or row
    stdin_bytes: int = 0

    def add_read(self, n: int) -> None:
        self.bytes_read += n

    def skip(self, where: str) -> None:
        self.skipped_records += 1
        if len(self.skipped_examples) < MAX_SKIP_EXAMPLES:
            self.skipped_examples.append(where)


def replace_lone_surrogates(text: str) -> str:
    """Replace code points no UTF-8 encoder accepts with U+FFFD. Example: "a\\ud800b" -> "a\\ufffdb"."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def looks_binary(head: bytes) -> bool:
    """What makes a file binary to every tfcli command: a NUL byte in its first formats.SNIFF_BYTES."""
    return b"\x00" in head[: formats.SNIFF_BYTES]


def binary_file_error(path: Path, head: bytes = b"") -> TfcliError:
    """The one line every command gives for a binary file where text was asked for; `head`, its first bytes, tells
    UTF-16 text that lacks its byte-order mark."""
    utf16 = _utf16_without_mark(head)
    if utf16:
        return TfcliError(
            f"{path} looks like {utf16} text without a byte-order mark (every other byte is NUL)",
            hint=f"convert it to UTF-8: iconv -f {utf16} -t UTF-8 {path} > {Path(path).with_suffix('.utf8' + Path(path).suffix)}",
        )
    return TfcliError(f"{path} looks like a binary file (it holds NUL bytes)", hint="pass text files only")


def _utf16_without_mark(head: bytes) -> str | None:
    """The UTF-16 that `head` seems to be in when its NUL bytes all fall on one side of each byte pair, as in mostly
    Latin text in UTF-16 without its mark: "UTF-16LE" or "UTF-16BE", else None.

    Example: "hi".encode("utf-16-le") -> "UTF-16LE"; a PNG file's first bytes -> None
    """
    pairs = len(head) // 2
    if pairs < 2:
        return None
    odd_nul, even_nul = head[1 : 2 * pairs : 2].count(0), head[0 : 2 * pairs : 2].count(0)
    if odd_nul >= 0.6 * pairs and even_nul == 0:
        return "UTF-16LE"
    if even_nul >= 0.6 * pairs and odd_nul == 0:
        return "UTF-16BE"
    return None


def _walk(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(Path(root, name) for name in sorted(files) if not name.startswith("."))
    return found


def _missing(path: Path) -> TfcliError:
    """The one line for a named path that leads to nothing: missing, a link to a missing file, or a link loop."""
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except FileNotFoundError:
            return TfcliError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist", hint="point it at a file or folder")
        except (OSError, RuntimeError):  # ELOOP (RuntimeError before Python 3.13)
            return TfcliError(f"{path} is a symbolic link that leads back to itself (a loop)", hint="point it at a file or folder")
    return TfcliError(f"{path} does not exist", hint="check the path")


def resolve_corpus(inputs: Sequence[str | Path], field: str = DEFAULT_FIELD, input_format: str = "auto") -> Corpus:
    """Expand files, folders (walked recursively, hidden entries skipped), globs and "-" (standard input)
    into a Corpus, each file's format and compression told by its extension or its first bytes.

    A named file that is missing or binary is an error; a binary file met while walking a folder is
    skipped and listed in `skipped_binary`. A file that is not what its extension says is an error. The
    same file named twice is read once.
    """
    if not inputs:
        raise TfcliError("no corpus given", hint="pass one or more text files, folders or globs")
    if input_format not in formats.INPUT_FORMATS:
        raise TfcliError(f"unknown --input-format {input_format!r}", hint=f"use one of {', '.join(formats.INPUT_FORMATS)}")
    if not field or not field.strip():
        raise TfcliError("--field cannot be empty", hint="name the field or column that holds the text, e.g. --field text")
    candidates: list[tuple[Path, bool]] = []  # (path, named explicitly)
    corpus = Corpus(files=[], field=field, input_format=input_format)
    for raw in inputs:
        text = str(raw)
        if text == formats.STDIN:
            candidates.append((Path(formats.STDIN), True))
            continue
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
            raise _missing(path)
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
    for path, explicit in candidates:
        if str(path) == formats.STDIN:
            if not corpus.has_stdin:
                corpus.files.append(CorpusFile(path, 0, input_format))
            continue
        if not path.is_file():  # a folder, a dangling link or a link loop met while walking (named ones are refused above)
            continue
        try:
            key = path.resolve()
        except (OSError, RuntimeError):  # a loop in a folder above it; Python before 3.13 raises RuntimeError
            continue
        if key in seen:
            continue
        seen.add(key)
        try:
            sniffed = formats.sniff_file(path, input_format)
            size = path.stat().st_size
        except OSError as exc:
            raise TfcliError(f"cannot read {path}: {exc.strerror}", hint="check its permissions") from exc
        if sniffed.binary:
            if explicit:
                with open(path, "rb") as handle:
                    raise binary_file_error(path, handle.read(formats.SNIFF_BYTES))
            corpus.skipped_binary.append(path)
            continue
        if sniffed.format == "parquet":
            formats.require("pyarrow.parquet", "pyarrow", f"{path} is a Parquet file")
        corpus.files.append(CorpusFile(path=path, size=size, format=sniffed.format, compression=sniffed.compression))
    if not corpus.files:
        raise TfcliError("the corpus holds no text files (only binary ones)", hint="pass text files, folders or globs")
    return corpus


@contextlib.contextmanager
def open_corpus_file(source: CorpusFile | Path, stats: ReadStats) -> Iterator[formats.OpenedSource]:
    """Open one corpus file (or standard input) for reading; bytes read from disk count in `stats`."""
    if not isinstance(source, CorpusFile):
        path = Path(source)
        sniffed = formats.sniff_file(path)
        source = CorpusFile(path, path.stat().st_size, sniffed.format, sniffed.compression)
    try:
        with formats.open_source(source.path, source.format, source.compression, stats.add_read, source.size) as opened:
            try:
                yield opened
            finally:
                if source.is_stdin:
                    stats.stdin_bytes += opened.consumed
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError)):
            raise TfcliError(f"cannot read {source.path}: {exc.strerror}", hint="check that it is still there and readable") from exc
        raise


def decode_blocks(opened: formats.OpenedSource, stats: ReadStats, block_bytes: int | None = None) -> Iterator[str]:
    """Yield an opened file's text in blocks of about `block_bytes` (default READ_BLOCK_BYTES): UTF-8, or UTF-16
    or UTF-32 where the file starts with their byte-order mark (a mark is dropped); invalid bytes become U+FFFD,
    counted."""
    block_bytes = block_bytes or READ_BLOCK_BYTES
    block = formats.read_block(opened.stream, block_bytes, opened.name, opened.compression)
    encoding = formats.unicode_encoding_of(block)
    decoder = codecs.getincrementaldecoder(encoding)(errors="surrogateescape" if encoding == "utf-8-sig" else _ESCAPE_UNDECODABLE)
    bad_in_file = 0
    while True:
        final = not block
        text = decoder.decode(block, final=final)
        if text:
            if _ESCAPED_BYTE.search(text):
                text, bad = _ESCAPED_BYTE.subn("\ufffd", text)
                bad_in_file += bad
            yield text
        if final:
            break
        block = formats.read_block(opened.stream, block_bytes, opened.name, opened.compression)
    if bad_in_file:
        stats.invalid_bytes += bad_in_file
        stats.files_with_invalid_utf8.add(opened.path)


def read_text_blocks(path: CorpusFile | Path, stats: ReadStats, block_bytes: int | None = None) -> Iterator[str]:
    """Yield a file's text (decompressed if it is compressed) in blocks of about `block_bytes` (default
    READ_BLOCK_BYTES); invalid UTF-8 bytes become U+FFFD, counted."""
    with open_corpus_file(path, stats) as opened:
        yield from decode_blocks(opened, stats, block_bytes)
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


def iterline_blocks(path: CorpusFile | Path, stats: ReadStats, limit: int = MAX_PIECE_CHARS) -> Iterator[list[str]]:
    """Yield the file's lines, with their line endings, a read block's worth at a time; a line longer
    than `limit` comes in pieces. Lists rather than single lines keep Python's per-line cost off the
    hot path of tokenizer training."""
    return line_blocks(read_text_blocks(path, stats), limit)


def line_blocks(blocks: Iterator[str], limit: int) -> Iterator[list[str]]:
    pending = ""
    for block in blocks:
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


def iter_lines(path: CorpusFile | Path, stats: ReadStats, limit: int = MAX_PIECE_CHARS) -> Iterator[str]:
    """Yield the file's lines with their line endings; a line longer than `limit` comes in pieces."""
    for lines in iterline_blocks(path, stats, limit):
        yield from lines


def iter_records(opened: formats.OpenedSource, fields: Sequence[str], stats: ReadStats, *, strict: bool = False, hint: str = "") -> Iterator[records.Row]:
    """The rows of an opened JSON lines, CSV / TSV or Parquet file, with the values of `fields`.

    `strict`: a line that is not JSON is an error (else it comes back with a `problem`, after the first).
    `hint`: what to say when a file has no such column.
    """
    if opened.format == "parquet":
        size = opened.size
        credited = 0

        def progress(done: int, total: int) -> None:
            nonlocal credited
            target = size * done // total if total else size
            stats.add_read(target - credited)
            credited = target

        yield from records.parquet_rows(opened.parquet, opened.name, fields, hint, progress if size else None)
        return
    lines = records.record_lines(decode_blocks(opened, stats), opened.name)
    if opened.format == "jsonl":
        yield from records.jsonl_rows(lines, opened.name, fields, strict)
    elif opened.format in ("csv", "tsv"):
        yield from records.csv_rows(lines, opened.name, fields, "\t" if opened.format == "tsv" else ",", hint)
    else:  # pragma: no cover - callers dispatch text files elsewhere
        raise AssertionError(opened.format)


def record_unit(opened: formats.OpenedSource) -> str:
    """How a record's place in its file is told: Parquet by row, the others by line."""
    return "row" if opened.format == "parquet" else "line"


def iter_record_texts(opened: formats.OpenedSource, field: str, stats: ReadStats) -> Iterator[str]:
    """The text of each record of an opened record file; a record whose field is missing or not a string
    is skipped and counted in `stats` (the first few by file and line or row), and once the file is read, one
    line says how many (`say_skipped`); blank texts are left out."""
    unit = record_unit(opened)
    json_lines = opened.format == "jsonl"
    hint = "name the column that holds the text with --field"
    rows = skipped = 0
    first = ""
    for row in iter_records(opened, (field,), stats, hint=hint):
        rows += 1
        value = row.values[0]
        if type(value) is not str:
            problem = row.problem or records.value_problem(field, value)
            where = f"{unit} {row.number} {problem}" if row.problem else f"{unit} {row.number}: {problem}"
            stats.skip(f"{opened.name} {where}")
            skipped += 1
            first = first or where
            continue
        if not value or value.isspace():
            continue
        if json_lines:  # JSON escapes can spell lone surrogates, which no UTF-8 encoder takes
            value = replace_lone_surrogates(value)
        yield value
    if skipped:
        say_skipped(opened, field, rows, skipped, first)


def skipped_line(opened: formats.OpenedSource, field: str, rows: int, skipped: int, first: str) -> str:
    """The line that says a file's skipped records. Example: "skipped 2 of 90 rows of a.jsonl that were not JSON
    objects with a string in 'text' (the first: line 4 has no 'text' field (it has 'txt'))" """
    if opened.format == "jsonl":
        what = f"that were not JSON objects with a string in {field!r}"
    else:
        what = f"without a string in the {'column' if opened.format != 'parquet' else 'field'} {field!r}"
    return f"skipped {skipped:,} of {rows:,} rows of {opened.name} {what} (the first: {first})"


_SAID: set[tuple[str, int, int, str]] = set()  # the skips said in this process: a command may read a corpus twice


def say_skipped(opened: formats.OpenedSource, field: str, rows: int, skipped: int, first: str) -> None:
    """Say a file's skipped records in one line, once a process (training a tokenizer, then encoding, reads the
    same file twice): a warning of the `tfcli.corpus` logger, which with no logging set up (the command line
    sets none) is the bare line on stderr; a program using tfcli decides where it goes, as with any library."""
    key = (opened.name, rows, skipped, first)
    if key not in _SAID:
        _SAID.add(key)
        _log.warning("%s", skipped_line(opened, field, rows, skipped, first))
