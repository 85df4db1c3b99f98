"""Input formats: plain text, JSON lines, CSV / TSV and Parquet, each possibly compressed (gzip, zstd, xz,
bzip2), told by extension or by magic bytes; `-` is standard input.

This module tells a file's format and opens it; it never holds a whole file: bytes come through a
decompressing stream, and a Parquet file is handed to pyarrow (spooled to a temporary file first when it
comes compressed or through a pipe). Parsing the records is `tfcli.corpus.records`. pyarrow and zstandard
are optional and imported only when a file needs them.
"""

from __future__ import annotations

import bz2
import codecs
import contextlib
import dataclasses
import gzip
import importlib
import io
import lzma
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tfcli.errors import TfcliError
from tfcli.limits import DECOMPRESSION_FREE, DECOMPRESSION_RATIO

STDIN = "-"
SNIFF_BYTES = 8192
SPOOL_BLOCK_BYTES = 1 << 20

COMPRESSION_SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".xz": "xz", ".bz2": "bzip2"}
FORMAT_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}
INPUT_FORMATS: tuple[str, ...] = ("auto", "text", "jsonl", "csv", "tsv", "parquet")
RECORD_FORMATS: tuple[str, ...] = ("jsonl", "csv", "tsv", "parquet")
FORMAT_NAMES = {"text": "text", "jsonl": "JSON lines", "csv": "CSV", "tsv": "TSV", "parquet": "Parquet"}
INSTALL_HINT = "pip install {package} (or pip install 'tfcli[data]')"


def display_name(path: Path | str) -> str:
    return "standard input" if str(path) == STDIN else str(path)


def require(module: str, package: str, why: str):
    """Import an optional dependency, or stop with one line that says what to install."""
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


# Byte-order marks of the Unicode encodings other than UTF-8 (UTF-32's first: its little-endian mark starts with UTF-16's)
BYTE_ORDER_MARKS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def unicode_encoding_of(head: bytes) -> str:
    """The encoding a file's byte-order mark names (the codec that reads the mark and drops it), else UTF-8's
    (which drops a UTF-8 mark). Example: b"\\xff\\xfeh\\x00" -> "utf-16"; b"hello" -> "utf-8-sig"."""
    return next((encoding for mark, encoding in BYTE_ORDER_MARKS if head.startswith(mark)), "utf-8-sig")


def as_utf8(head: bytes) -> bytes:
    """The first bytes of a file in UTF-8, whatever Unicode encoding its byte-order mark names (so that the
    format and NUL checks look at characters, not at UTF-16's zero bytes)."""
    encoding = unicode_encoding_of(head)
    if encoding == "utf-8-sig":
        return head
    return codecs.getincrementaldecoder(encoding)(errors="replace").decode(head).encode("utf-8")


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
    head = as_utf8(content_head(compression) if compression else raw_head)
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

    def __init__(self, raw: BinaryIO, count: Callable[[int], None] | None, prefix: bytes = b"", on_data: Callable[[bytes], None] | None = None) -> None:
        self.raw, self.count, self.prefix, self.consumed, self.on_data = raw, count, prefix, 0, on_data

    def read(self, n: int = -1) -> bytes:
        if self.prefix:
            data = self.prefix if n is None or n < 0 else self.prefix[:n]
            self.prefix = self.prefix[len(data) :]
        else:
            data = self.raw.read(n)
        self.consumed += len(data)
        if self.count:
            self.count(len(data))
        if self.on_data:
            self.on_data(data)
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
    frames = ZstdFrames() if compression == "zstd" else None
    counted = _CountingReader(raw, None, on_data=frames.feed if frames else None)
    if compression == "gzip":
        stream: Any = gzip.GzipFile(fileobj=counted, mode="rb")
    elif compression == "bzip2":
        stream = bz2.BZ2File(counted, "rb")
    elif compression == "xz":
        stream = lzma.LZMAFile(counted, "rb")
    elif compression == "zstd":
        zstandard = require("zstandard", "zstandard", f"{where} is zstd-compressed")
        stream = zstandard.ZstdDecompressor().stream_reader(counted, read_across_frames=True, closefd=False)
    else:  # pragma: no cover - COMPRESSION_SUFFIXES and compression_of name only the four above
        raise AssertionError(compression)
    try:
        yield _Guarded(stream, counted, frames, where)
    finally:
        stream.close()


class _Guarded:
    """A decompressed stream that stops a bomb (more out than limits.DECOMPRESSION_RATIO times what came in,
    past the first DECOMPRESSION_FREE bytes) and, for zstd, a file cut inside a frame (the library reads
    such a file up to the cut and says nothing)."""

    def __init__(self, stream: Any, source: _CountingReader, frames: ZstdFrames | None, where: str) -> None:
        self.stream, self.source, self.frames, self.where = stream, source, frames, where
        self.ratio, self.out = DECOMPRESSION_RATIO.value, 0

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n if n is not None and n >= 0 else READ_ALL_BLOCK)
        self.out += len(data)
        if self.out > DECOMPRESSION_FREE and self.out > self.ratio * max(self.source.consumed, 1):
            raise TfcliError(
                f"{self.where} decompresses to more than {self.ratio:,}x its compressed size (a decompression bomb?), the limit on {DECOMPRESSION_RATIO.what}",
                hint=DECOMPRESSION_RATIO.how_to_raise(),
            )
        if not data and n != 0 and self.frames is not None and not self.frames.complete():
            raise EOFError("the file ends inside a frame")
        return data

    def close(self) -> None:
        self.stream.close()


READ_ALL_BLOCK = 1 << 20


class ZstdFrames:
    """Follows the frames and blocks of a zstd stream from its compressed bytes (headers only, nothing
    decompressed), to tell whether it ended where a frame ends. Example: a whole file -> complete() True;
    its first half -> False."""

    def __init__(self) -> None:
        self.pending = bytearray()  # header bytes not yet parsed
        self.skip = 0  # bytes of content to pass over
        self.state = "magic"
        self.checksum = False
        self.broken = False
        self.frames = 0

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while len(view) and not self.broken:
            if self.skip:
                taken = min(self.skip, len(view))
                self.skip -= taken
                view = view[taken:]
                continue
            need = {"magic": 4, "skippable": 4, "descriptor": 1, "block": 3}[self.state]
            taken = min(need - len(self.pending), len(view))
            self.pending += view[:taken]
            view = view[taken:]
            if len(self.pending) == need:
                header, self.pending = bytes(self.pending), bytearray()
                self._parsed(header)

    def _parsed(self, header: bytes) -> None:
        value = int.from_bytes(header, "little")
        if self.state == "magic":
            if value == 0xFD2FB528:
                self.state = "descriptor"
            elif value & 0xFFFFFFF0 == 0x184D2A50:
                self.state = "skippable"
            else:
                self.broken = True  # the decompressor reports it
        elif self.state == "skippable":
            self.skip, self.state = value, "magic"
            self.frames += 1
        elif self.state == "descriptor":
            single_segment, dictionary = value >> 5 & 1, value & 3
            content_size = (0 if not single_segment else 1, 2, 4, 8)[value >> 6]
            self.checksum = bool(value >> 2 & 1)
            self.skip = (0 if single_segment else 1) + (0, 1, 2, 4)[dictionary] + content_size
            self.state = "block"
        else:  # a block header: last-block flag, type, size
            kind, size = value >> 1 & 3, value >> 3
            if kind == 3:
                self.broken = True
                return
            self.skip = 1 if kind == 1 else size
            if value & 1:
                self.skip += 4 if self.checksum else 0
                self.state = "magic"
                self.frames += 1

    def complete(self) -> bool:
        return self.broken or (self.state == "magic" and not self.pending and not self.skip and self.frames > 0)


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
        raise TfcliError(f"{where} is not a readable Parquet file ({first_line(exc)})", hint="check the file; a download cut short looks like this") from exc


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
