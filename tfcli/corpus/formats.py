"""Input formats: plain text, JSON lines, CSV / TSV and Parquet, each possibly compressed (gzip, zstd, xz,
bzip2), told by extension or by magic bytes; `-` is standard input.

This module opens and parses; it never holds a whole file: bytes come through a decompressing stream,
JSON lines and CSV rows one at a time from text blocks, Parquet in record batches read row group by row
group. pyarrow and zstandard are optional and imported only when a file needs them.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from tfcli.errors import TfcliError
from tfcli.jsontext import loads_json

STDIN = "-"
SNIFF_BYTES = 8192
PARQUET_BATCH_ROWS = 1024
SPOOL_BLOCK_BYTES = 1 << 20
CSV_FIELD_LIMIT = 1 << 27  # characters: csv's default (128 Ki) is smaller than many real documents; a broken quote stops here

COMPRESSION_SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".xz": "xz", ".bz2": "bzip2"}
FORMAT_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}
INPUT_FORMATS: tuple[str, ...] = ("auto", "text", "jsonl", "csv", "tsv", "parquet")
RECORD_FORMATS: tuple[str, ...] = ("jsonl", "csv", "tsv", "parquet")
FORMAT_NAMES = {"text": "text", "jsonl": "JSON lines", "csv": "CSV", "tsv": "TSV", "parquet": "Parquet"}
INSTALL_HINT = "pip install {package} (or pip install 'tfcli[data]')"


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # a field the record does not have


class Row(NamedTuple):
    """One record: where it is (`number`, a line or a row, see `RecordReader.unit`), the values of the
    fields asked for (MISSING where absent) and, when it cannot be read at all, why (`problem`)."""

    number: int
    values: tuple
    problem: str | None = None


def display_name(path: Path | str) -> str:
    return "standard input" if str(path) == STDIN else str(path)


def require(module: str, package: str, why: str):
    """Import an optional dependency, or stop with one line that says what to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TfcliError(f"{why}; reading it needs the {package} package", hint=INSTALL_HINT.format(package=package)) from None


def compression_of(head: bytes) -> str | None:
    """The compression the first bytes of a file announce. Example: b"\\x1f\\x8b\\x08..." -> "gzip"."""
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    # "BZh", the block size digit, then the magic of the first block (or of the end of an empty stream)
    if len(head) >= 10 and head[:3] == b"BZh" and head[3] in b"123456789" and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bzip2"
    return None


def format_of_name(name: str) -> tuple[str | None, str | None]:
    """(format, compression) from a file name's extensions; None where the name does not say.

    Example: "part-0.jsonl.gz" -> ("jsonl", "gzip"); "notes.md" -> (None, None)
    """
    suffixes = [s.lower() for s in Path(name).suffixes]
    compression = COMPRESSION_SUFFIXES.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes.pop()
    return (FORMAT_SUFFIXES.get(suffixes[-1]) if suffixes else None), compression


@dataclasses.dataclass(frozen=True)
class Sniffed:
    format: str
    compression: str | None
    binary: bool  # NUL bytes in the (decompressed) start of a text-like file


def sniff(
    name: str, raw_head: bytes, content_head: Callable[[str | None], bytes], forced: str = "auto", json_by_content: bool = False, where: str | None = None
) -> Sniffed:
    """Tell a file's format and compression from its name, its first bytes and `forced` (--input-format).

    `content_head(compression)` returns the first bytes after decompression. A name that promises a
    compression or a Parquet file the bytes do not show is an error; bytes that show a compression the name
    does not mention win. `json_by_content` (standard input): text that starts with "{" is JSON lines.
    """
    where = where or display_name(name)
    by_name, promised = format_of_name(name) if name != STDIN else (None, None)
    compression = compression_of(raw_head)
    if promised and compression is None:
        raise TfcliError(
            f"{where} is not {promised}-compressed, as its name says (it does not start with {promised}'s magic bytes)",
            hint="rename it, or fetch it again if the download was cut short or replaced by an error page",
        )
    head = content_head(compression) if compression else raw_head
    fmt = forced if forced != "auto" else by_name
    if fmt is None:
        if head.startswith(b"PAR1") and b"\x00" in head:
            fmt = "parquet"
        elif json_by_content and head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
            fmt = "jsonl"
        else:
            fmt = "text"
    if fmt == "parquet":
        if not head.startswith(b"PAR1"):
            raise TfcliError(
                f"{where} is not a Parquet file (it does not start with PAR1)",
                hint="check the file; a download cut short or an error page saved under its name looks like this",
            )
        return Sniffed("parquet", compression, False)
    if fmt == "jsonl" and head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
        raise TfcliError(f"{where} holds a JSON array, not JSON lines (one object per line)", hint=f"convert it first, e.g. jq -c '.[]' {where} > lines.jsonl")
    return Sniffed(fmt, compression, b"\x00" in head)


def sniff_file(path: Path, forced: str = "auto") -> Sniffed:
    """`sniff` for a file on disk (the start is decompressed to look inside)."""
    with open(path, "rb") as handle:
        raw_head = handle.read(SNIFF_BYTES)

    def content_head(compression: str | None) -> bytes:
        with open(path, "rb") as handle, _decompressing(handle, compression, display_name(path)) as stream:
            return read_at_most(stream, SNIFF_BYTES, display_name(path), compression)

    return sniff(path.name, raw_head, content_head, forced, where=str(path))


def read_at_most(stream: BinaryIO, n: int, where: str, compression: str | None) -> bytes:
    """Up to `n` bytes (fewer only at the end of the stream); a damaged compressed stream is a TfcliError."""
    parts, size = [], 0
    while size < n:
        block = read_block(stream, n - size, where, compression)
        if not block:
            break
        parts.append(block)
        size += len(block)
    return b"".join(parts)


def _decompression_errors() -> tuple[type[BaseException], ...]:
    import lzma
    import zlib

    errors: list[type[BaseException]] = [OSError, EOFError, zlib.error, lzma.LZMAError]
    zstandard = sys.modules.get("zstandard")
    if zstandard is not None:
        errors.append(zstandard.ZstdError)
    return tuple(errors)


def read_block(stream: BinaryIO, n: int, where: str, compression: str | None) -> bytes:
    """stream.read(n); a damaged or truncated compressed file becomes one clear line."""
    if compression is None:
        return stream.read(n)
    try:
        return stream.read(n)
    except _decompression_errors() as exc:
        raise TfcliError(f"{where} is damaged or truncated ({compression}: {exc})", hint="fetch it again, or leave it out") from exc


class _CountingReader:
    """A read-only binary stream over `raw` that reports the bytes it reads to `count` and can first
    return bytes already read (`prefix`, for standard input, which cannot seek back)."""

    def __init__(self, raw: BinaryIO, count: Callable[[int], None] | None, prefix: bytes = b"") -> None:
        self.raw, self.count, self.prefix, self.consumed = raw, count, prefix, 0

    def read(self, n: int = -1) -> bytes:
        if self.prefix:
            data = self.prefix if n is None or n < 0 else self.prefix[:n]
            self.prefix = self.prefix[len(data) :]
        else:
            data = self.raw.read(n)
        self.consumed += len(data)
        if self.count:
            self.count(len(data))
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def close(self) -> None:  # the owner closes `raw`
        pass

    @property
    def closed(self) -> bool:
        return False

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def _decompressing(raw: Any, compression: str | None, where: str) -> Iterator[Any]:
    if compression is None:
        yield raw
        return
    if compression == "gzip":
        import gzip

        stream: Any = gzip.GzipFile(fileobj=raw, mode="rb")
    elif compression == "bzip2":
        import bz2

        stream = bz2.BZ2File(raw, "rb")
    elif compression == "xz":
        import lzma

        stream = lzma.LZMAFile(raw, "rb")
    elif compression == "zstd":
        zstandard = require("zstandard", "zstandard", f"{where} is zstd-compressed")
        stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False)
    else:  # pragma: no cover - COMPRESSION_SUFFIXES and compression_of name only the four above
        raise AssertionError(compression)
    try:
        yield stream
    finally:
        stream.close()


@dataclasses.dataclass
class OpenedSource:
    """A corpus file opened for reading: `stream` gives its (decompressed) bytes; a Parquet file comes as
    `parquet` (a pyarrow ParquetFile) instead."""

    path: Path
    format: str
    compression: str | None
    stream: Any = None
    parquet: Any = None
    size: int = 0  # bytes on disk, for progress (0 for standard input)
    reader: _CountingReader | None = None

    @property
    def name(self) -> str:
        return display_name(self.path)

    @property
    def consumed(self) -> int:
        """Bytes read from the file or standard input so far (compressed bytes when compressed)."""
        return self.reader.consumed if self.reader else 0


@contextlib.contextmanager
def open_source(path: Path, fmt: str, compression: str | None, count: Callable[[int], None] | None, size: int = 0) -> Iterator[OpenedSource]:
    """Open a file whose format `sniff_file` told, or standard input (`path` "-", `fmt` "auto" or forced:
    told here from its first bytes). `count(n)` hears of every n bytes read from disk or the pipe."""
    with contextlib.ExitStack() as stack:
        where = display_name(path)
        if fmt == "parquet" and compression is None and str(path) != STDIN:  # pyarrow reads the file itself
            yield OpenedSource(Path(path), fmt, None, parquet=_open_parquet(path, None, None, stack, where), size=size)
            return
        if str(path) == STDIN:
            raw = sys.stdin.buffer
            raw_head = read_at_most(raw, SNIFF_BYTES, "standard input", None)
            # the start is decompressed from what is already read: reading on would consume the pipe
            sniffed = sniff(STDIN, raw_head, lambda kind: _decompressed_start(raw_head, kind), fmt, json_by_content=True)
            if sniffed.binary:
                raise TfcliError("standard input looks like a binary file (it holds NUL bytes)", hint="pipe text into tfcli")
            fmt, compression = sniffed.format, sniffed.compression
            reader = _CountingReader(raw, count, prefix=raw_head)
        else:
            raw = stack.enter_context(open(path, "rb"))
            reader = _CountingReader(raw, count)
        stream = stack.enter_context(_decompressing(reader, compression, where))
        source = OpenedSource(Path(path), fmt, compression, size=size, reader=reader)
        if fmt == "parquet":
            source.parquet = _open_parquet(path, stream, compression, stack, where)
        else:
            source.stream = stream
        yield source


def _decompressed_start(head: bytes, compression: str | None) -> bytes:
    """The first bytes of `head` decompressed, as far as they go (standard input's format sniffing)."""
    import io

    if compression is None:
        return head
    with _decompressing(io.BytesIO(head), compression, "standard input") as stream:
        try:
            return stream.read(SNIFF_BYTES)
        except _decompression_errors():
            return b""  # truncated by the sniff itself; the full read reports real damage


def _open_parquet(path: Path, stream: Any, compression: str | None, stack: contextlib.ExitStack, where: str) -> Any:
    pq = require("pyarrow.parquet", "pyarrow", f"{where} is a Parquet file")
    import pyarrow

    if compression is not None or str(path) == STDIN:
        # Parquet keeps its index at the end of the file, so a stream is spooled to a temporary file (on
        # disk, not in memory) before pyarrow reads it.
        import tempfile

        spool = stack.enter_context(tempfile.TemporaryFile(prefix="tfcli-parquet-"))
        while block := read_block(stream, SPOOL_BLOCK_BYTES, where, compression):
            spool.write(block)
        spool.seek(0)
        target: Any = spool
    else:
        target = str(path)
    try:
        return pq.ParquetFile(target, buffer_size=1 << 20, pre_buffer=False)
    except (pyarrow.ArrowException, OSError, ValueError) as exc:
        raise TfcliError(f"{where} is not a readable Parquet file ({_first_line(exc)})", hint="check the file; a download cut short looks like this") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def lookup(record: Any, field: str) -> Any:
    """A field of a JSON object, by name or by a dotted path into nested objects and lists; MISSING if absent.

    Example: lookup({"meta": {"body": "hi"}}, "meta.body") -> "hi"; lookup({"a": [1, 2]}, "a.1") -> 2
    """
    if isinstance(record, dict) and field in record:
        return record[field]
    value = record
    for part in field.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return MISSING
    return value


def _keys(record: dict) -> str:
    keys = list(record)
    shown = ", ".join(map(repr, keys[:8]))
    return shown + (f" and {len(keys) - 8} more" if len(keys) > 8 else "") if keys else "no fields"


def record_lines(blocks: Iterator[str]) -> Iterator[str]:
    """Lines of a stream of text blocks, cut at "\\n" only (a JSON string or a quoted CSV field may hold
    other line separators), each with its "\\n"; a line longer than a block is joined from its parts."""
    held: list[str] = []
    for block in blocks:
        if "\n" not in block:
            held.append(block)
            continue
        lines = block.split("\n")
        if held:
            lines[0] = "".join(held) + lines[0]
            held = []
        last = lines.pop()
        for line in lines:
            yield line + "\n"
        if last:
            held.append(last)
    if held:
        yield "".join(held)


def jsonl_rows(lines: Iterator[str], where: str, fields: Sequence[str], strict: bool) -> Iterator[Row]:
    """The fields of each JSON line. A first line that is not JSON means the file is not JSON lines (an
    error); later bad lines come back with a `problem`, or are errors too when `strict`."""
    first = True
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if first:
            line = line.removeprefix("\ufeff")
        try:
            record = loads_json(line)
        except json.JSONDecodeError as exc:
            if first or strict:
                what = "is not valid JSON" if not first else "is not valid JSON, so the file is not JSON lines"
                hint = "pass JSON lines: one object per line" + ("" if strict else ", or --input-format text to read it as text")
                raise TfcliError(f"{where} line {number} {what} ({exc.msg})", hint=hint) from exc
            yield Row(number, (MISSING,) * len(fields), f"is not valid JSON ({exc.msg})")
            continue
        first = False
        if not isinstance(record, dict):
            if strict:
                raise TfcliError(f"{where} line {number} is not a JSON object")
            yield Row(number, (MISSING,) * len(fields), "is not a JSON object")
            continue
        values = tuple(lookup(record, f) for f in fields)
        problem = None
        for field, value in zip(fields, values):
            if value is MISSING:
                problem = f"has no {field!r} field (it has {_keys(record)})"
                break
        yield Row(number, values, problem)


def csv_rows(lines: Iterator[str], where: str, fields: Sequence[str], delimiter: str, hint: str) -> Iterator[Row]:
    """The named columns of each CSV / TSV row after the header; a quoted field may span lines. `number`
    is the line the row starts on."""
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise TfcliError(f"{where} line 1 is not valid {'TSV' if delimiter == chr(9) else 'CSV'} ({exc})") from exc
    if header is None:
        return
    if header:
        header[0] = header[0].removeprefix("\ufeff")
    columns = []
    for field in fields:
        if field not in header:
            shown = ", ".join(repr(h) for h in header[:12]) + (", ..." if len(header) > 12 else "")
            raise TfcliError(f"{where} has no column {field!r} (its header: {shown})", hint=hint)
        columns.append(header.index(field))
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TfcliError(
                f"{where} line {start} is not valid {'TSV' if delimiter == chr(9) else 'CSV'} ({exc})", hint="check the quoting around that line"
            ) from exc
        if not row:
            continue
        values = tuple(row[i] if i < len(row) else MISSING for i in columns)
        problem = None
        for field, value in zip(fields, values):
            if value is MISSING:
                problem = f"has no value for the column {field!r} ({len(row)} of {len(header)} columns)"
                break
        yield Row(start, values, problem)


def parquet_rows(parquet: Any, where: str, fields: Sequence[str], hint: str, progress: Callable[[int, int], None] | None = None) -> Iterator[Row]:
    """The named columns of each row, read in batches of PARQUET_BATCH_ROWS rows, one row group at a time,
    only the columns asked for. A dotted name reaches into a struct column. `progress(rows_done, rows)`
    after each batch."""
    import pyarrow

    names = parquet.schema_arrow.names
    tops = []
    for field in fields:
        top = field if field in names else field.split(".")[0]
        if top not in names:
            shown = ", ".join(repr(n) for n in names[:12]) + (", ..." if len(names) > 12 else "")
            raise TfcliError(f"{where} has no column {field!r} (its columns: {shown})", hint=hint)
        tops.append(top)
    wanted = list(dict.fromkeys(tops))
    total = parquet.metadata.num_rows
    number = 0
    batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=wanted, use_threads=False)
    while True:
        try:
            batch = next(batches, None)
        except (pyarrow.ArrowException, OSError) as exc:
            raise TfcliError(f"{where} is damaged near row {number + 1} ({_first_line(exc)})", hint="fetch it again, or leave it out") from exc
        if batch is None:
            break
        columns = {name: batch.column(i).to_pylist() for i, name in enumerate(wanted)}
        picked = []
        for field, top in zip(fields, tops):
            values = columns[top]
            if field != top:
                rest = field[len(top) + 1 :]
                values = [lookup(v, rest) if isinstance(v, dict) else (None if v is None else MISSING) for v in values]
            picked.append(values)
        for values in zip(*picked):
            number += 1
            problem = None
            for field, value in zip(fields, values):
                if value is MISSING:
                    problem = f"has no {field!r} field"
                    break
            yield Row(number, values, problem)
        if progress:
            progress(number, total)


def value_problem(field: str, value: Any) -> str | None:
    """Why a field's value is not text, or None when it is a string.

    Example: value_problem("text", None) -> "'text' is null"; value_problem("text", 3) -> "'text' is a number, not a string"
    """
    if isinstance(value, str):
        return None
    if value is None:
        return f"{field!r} is null"
    kinds = {bool: "true or false", int: "a number", float: "a number", dict: "an object", list: "a list", bytes: "binary data"}
    kind = next((name for tp, name in kinds.items() if isinstance(value, tp)), type(value).__name__)
    return f"{field!r} is {kind}, not a string"
