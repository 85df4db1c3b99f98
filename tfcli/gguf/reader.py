"""Read a GGUF file without trusting it: the header, the metadata and the tensor table are parsed with every
count, length and offset checked against the file's size before anything is allocated or mapped, and
nothing in the file is ever executed. Tensor data is then read one tensor at a time, as float32.

The layout is llama.cpp's (gguf/constants.py names the types): magic "GGUF", version 2 or 3, the tensor
and key counts, the keys (name, type, value), the tensor table (name, dimensions, type, offset), padding to
`general.alignment`, then the tensors' bytes.

A file's size bounds nothing where the file is sparse (2**26 empty strings take no disk), so the metadata is
also bounded by what a vocabulary can be, each cap checked on a length or a count before what it counts is
read: the file holds at most `limits.GGUF_KEYS` keys and `limits.GGUF_TENSORS` tensors, an array at most MAX_VOCAB_SIZE items, a token at most `limits.GGUF_TOKEN` bytes, any other
string `limits.GGUF_STRING`, and the strings of one array together what a tokenizer.json may hold.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize

from tfcli.errors import TfcliError
from tfcli.fsutil import refuse_git_lfs_pointer
from tfcli.limits import GGUF_KEYS, GGUF_STRING, GGUF_TENSORS, GGUF_TOKEN, TOKENIZER_FILE, shown
from tfcli.tokenizer.core import MAX_VOCAB_SIZE

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_NAME_BYTES = 1 << 16  # a key or tensor name (llama.cpp's tensor names are at most 64 bytes)
MAX_DIMENSIONS = 4  # GGML_MAX_DIMS
TOKENS_KEY, MERGES_KEY = "tokenizer.ggml.tokens", "tokenizer.ggml.merges"


def _dequantizable() -> tuple[GGMLQuantizationType, ...]:
    """The float types `gguf.quants.dequantize` handles in the installed gguf package, found by dequantizing one
    zero block of each (a type it does not know raises NotImplementedError; integer types are no weights)."""
    kinds = []
    for kind in GGMLQuantizationType:
        if kind.name.startswith("I") and not kind.name.startswith("IQ"):
            continue  # I8 .. I64: integer tensors, never a model's weights
        try:
            dequantize(np.zeros((1, GGML_QUANT_SIZES[kind][1]), dtype=np.uint8), kind)
        except NotImplementedError:
            continue
        kinds.append(kind)
    return tuple(kinds)


# F32 and F16 read as they are; every other type llama.cpp writes (BF16, Q4_0 .. Q8_0, Q2_K .. Q6_K, IQ*, TQ*,
# MXFP4) dequantized by llama.cpp's own gguf package, which knows them all (a type it cannot dequantize is refused)
READABLE_TYPES = _dequantizable()
_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_NUMPY = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # as torch writes it: ggml's dimensions reversed, (rows, columns) for a matrix
    kind: GGMLQuantizationType
    start: int  # absolute offset of the first byte in the file
    nbytes: int


@dataclasses.dataclass
class GgufFile:
    path: Path
    version: int
    metadata: dict[str, Any]  # key -> value: int, float, bool, str, or a list (numbers as a numpy array)
    tensors: dict[str, TensorInfo]

    def read(self, name: str) -> torch.Tensor:
        """One tensor as float32 (every other type dequantized), shaped as torch writes it."""
        info = self.tensors[name]
        if info.kind not in READABLE_TYPES:
            raise refused_type(self.path, info)
        raw = np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.start, shape=(info.nbytes,))
        if info.kind == GGMLQuantizationType.F32:
            values = np.frombuffer(raw, dtype="<f4").copy()
        elif info.kind == GGMLQuantizationType.F16:
            values = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            block, block_bytes = GGML_QUANT_SIZES[info.kind]
            row_bytes = info.shape[-1] // block * block_bytes
            values = dequantize(np.asarray(raw).reshape(-1, row_bytes), info.kind).astype(np.float32)
        del raw
        return torch.from_numpy(values.reshape(info.shape))

    def read_blocks(self, name: str) -> torch.Tensor:
        """A matrix's bytes as they are in the file, uint8 (rows, bytes per row): its blocks, row by row."""
        info = self.tensors[name]
        raw = np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.start, shape=(info.nbytes,))
        rows = int(np.prod(info.shape[:-1]))
        data = np.array(raw).reshape(rows, info.nbytes // rows)
        del raw
        return torch.from_numpy(data)


def refused_type(path: Path, info: TensorInfo) -> TfcliError:
    return TfcliError(
        f"{path}: tensor {info.name} is {info.kind.name}, which llama.cpp's gguf package cannot dequantize; tfcli reads "
        f"{', '.join(kind.name for kind in READABLE_TYPES)}",
        hint="convert the model to one of those first, e.g. llama-quantize --allow-requantize IN.gguf OUT.gguf Q8_0",
    )


class _Cursor:
    """Reads the header from a file, never past its end: each read says how many bytes it needs first."""

    def __init__(self, stream: BinaryIO, size: int, path: Path) -> None:
        self.stream, self.size, self.path, self.pos = stream, size, path, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise TfcliError(f"{self.path} is truncated or corrupt: {what} runs past the end of the file ({self.size:,} bytes)")
        data = self.stream.read(n)
        if len(data) != n:
            raise TfcliError(f"{self.path} is truncated: {what} runs past the end of the file")
        self.pos += n
        return data

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str, limit: int) -> str:
        n = self.scalar("<Q", what)
        if n > limit:
            raise TfcliError(f"{self.path}: {what} is {n:,} bytes long (the limit is {limit:,})")
        return self.text(n, what)

    def text(self, n: int, what: str) -> str:
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise TfcliError(f"{self.path}: {what} is not UTF-8 text") from None

    def metadata_string_length(self, key: str, cap: int, item: int | None = None) -> int:
        """The length of a string of metadata `key` (item `item` of its array), checked against `cap`
        (`_string_cap`) before a byte of the string is read."""
        n = self.scalar("<Q", f"the length of metadata {key}")
        if n > cap:
            what = f"metadata {key}" if item is None else f"metadata {key} item {item:,}"
            if key == MERGES_KEY and item is not None:
                raise TfcliError(
                    f"{self.path}: {what} is {n:,} bytes long, longer than two tokens of {shown(GGUF_TOKEN.value)} (the limit on {GGUF_TOKEN.what}) and a space",
                    hint=GGUF_TOKEN.how_to_raise(),
                )
            raise (GGUF_TOKEN if key == TOKENS_KEY and item is not None else GGUF_STRING).exceeded(f"{self.path}: {what} ({n:,} bytes)")
        return n

    def strings(self, key: str, count: int) -> list[str]:
        """An array of `count` strings, each length checked before its string is read, and all of them
        together at most what a tokenizer.json may hold (a vocabulary's tokens and merges go into one)."""
        values: list[str] = []
        total, cap, item_cap = 0, TOKENIZER_FILE.value, _string_cap(key, in_array=True)
        for i in range(count):
            n = self.metadata_string_length(key, item_cap, i)
            total += n
            if total > cap:
                raise TfcliError(
                    f"{self.path}: the strings of metadata {key} come to more than {shown(cap)} by item {i:,}, the limit on {TOKENIZER_FILE.what} (which they would go into)",
                    hint=TOKENIZER_FILE.how_to_raise(),
                )
            values.append(self.text(n, f"metadata {key}"))
        return values

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.scalar("<I", what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise TfcliError(f"{self.path}: {what} has the unknown value type {raw}") from None

    def value(self, kind: GGUFValueType, key: str, depth: int = 0) -> Any:
        if kind == GGUFValueType.FLOAT32:  # the shortest decimal that is this float32: 1e-05, not 9.999999747378752e-06
            return float(str(np.float32(self.scalar("<f", f"the value of {key}"))))
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind], f"the value of {key}")
        if kind == GGUFValueType.STRING:
            return self.text(self.metadata_string_length(key, _string_cap(key, in_array=False)), f"the value of {key}")
        if depth:
            raise TfcliError(f"{self.path}: metadata {key} is an array of arrays, which no key tfcli reads is")
        item = self.value_type(f"the item type of {key}")
        count = self.scalar("<Q", f"the length of {key}")
        if count > MAX_VOCAB_SIZE:
            raise TfcliError(
                f"{self.path}: metadata {key} claims {count:,} items, more than the {MAX_VOCAB_SIZE:,} tokens a vocabulary may have (tfcli's limit on any metadata array)"
            )
        if item in _NUMPY:
            width = np.dtype(_NUMPY[item]).itemsize
            if count > (self.size - self.pos) // width:
                raise TfcliError(f"{self.path} is truncated or corrupt: {key} claims {count:,} items, more than the file holds")
            return np.frombuffer(self.take(count * width, key), dtype=_NUMPY[item])
        if count > (self.size - self.pos) // 8:  # every string or array holds at least its 8-byte length
            raise TfcliError(f"{self.path} is truncated or corrupt: {key} claims {count:,} items, more than the file holds")
        if item == GGUFValueType.STRING:
            return self.strings(key, count)
        return [self.value(item, key, depth + 1) for _ in range(count)]


def _string_cap(key: str, in_array: bool) -> int:
    """The most bytes one string of metadata `key` may hold: a token GGUF_TOKEN, a merge two tokens and a space,
    any other string GGUF_STRING."""
    if in_array and key == TOKENS_KEY:
        return GGUF_TOKEN.value
    if in_array and key == MERGES_KEY:
        return 2 * GGUF_TOKEN.value + 1
    return GGUF_STRING.value


def read_gguf(path: Path) -> GgufFile:
    """Parse a GGUF file's metadata and tensor table, checking every tensor lies inside the file."""
    path = Path(path)
    if not path.is_file():
        raise TfcliError(f"{path} is not a file", hint="pass a .gguf file")
    size = path.stat().st_size
    with open(path, "rb") as stream:
        cursor = _Cursor(stream, size, path)
        if size < 4 or stream.read(4) != MAGIC:
            refuse_git_lfs_pointer(path)
            raise TfcliError(f"{path} is not a GGUF file (it does not start with the magic bytes GGUF)")
        cursor.pos = 4
        version = cursor.scalar("<I", "the version")
        if version not in VERSIONS:
            swapped = version and not version & 0xFFFF
            raise TfcliError(
                f"{path} is a big-endian GGUF file; tfcli reads little-endian ones" if swapped else f"{path} is GGUF version {version}; tfcli reads 2 and 3"
            )
        n_tensors = cursor.scalar("<Q", "the tensor count")
        n_keys = cursor.scalar("<Q", "the metadata count")
        if n_keys > (size - cursor.pos) // 12 or n_tensors > (size - cursor.pos) // 24:  # the smallest key and tensor entries
            raise TfcliError(f"{path} is truncated or corrupt: it claims {n_keys:,} metadata keys and {n_tensors:,} tensors, more than its {size:,} bytes hold")
        if n_keys > GGUF_KEYS.value:  # a sparse or crafted file's size bounds nothing: the counts have caps of their own
            raise GGUF_KEYS.exceeded(f"{path}: its {n_keys:,} metadata keys")
        if n_tensors > GGUF_TENSORS.value:
            raise GGUF_TENSORS.exceeded(f"{path}: its {n_tensors:,} tensors")
        metadata: dict[str, Any] = {}
        for i in range(n_keys):
            key = cursor.string(f"metadata key {i}", MAX_NAME_BYTES)
            if key in metadata:
                raise TfcliError(f"{path}: metadata key {key} appears twice")
            metadata[key] = cursor.value(cursor.value_type(f"the type of {key}"), key)
        entries = []
        for i in range(n_tensors):
            name = cursor.string(f"the name of tensor {i}", MAX_NAME_BYTES)
            n_dims = cursor.scalar("<I", f"the dimension count of {name}")
            if not 1 <= n_dims <= MAX_DIMENSIONS:
                raise TfcliError(f"{path}: tensor {name} has {n_dims} dimensions (GGUF allows 1 to {MAX_DIMENSIONS})")
            dims = [cursor.scalar("<Q", f"the dimensions of {name}") for _ in range(n_dims)]
            raw_kind = cursor.scalar("<I", f"the type of {name}")
            offset = cursor.scalar("<Q", f"the offset of {name}")
            try:
                kind = GGMLQuantizationType(raw_kind)
            except ValueError:
                raise TfcliError(f"{path}: tensor {name} has the unknown type {raw_kind}") from None
            entries.append((name, dims, kind, offset))
        alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 20:
            raise TfcliError(f"{path}: metadata general.alignment is {alignment!r}, not a power of two")
        data_start = -(-cursor.pos // alignment) * alignment
    return GgufFile(path, version, metadata, _tensor_table(path, entries, data_start, alignment, size))


def _tensor_table(path: Path, entries: list, data_start: int, alignment: int, size: int) -> dict[str, TensorInfo]:
    """Each tensor's bytes, checked to lie inside the file, aligned, and apart from every other's."""
    tensors: dict[str, TensorInfo] = {}
    for name, dims, kind, offset in entries:
        if name in tensors:
            raise TfcliError(f"{path}: tensor {name} appears twice")
        block, block_bytes = GGML_QUANT_SIZES[kind]
        if any(d < 1 for d in dims) or dims[0] % block:
            raise TfcliError(f"{path}: tensor {name} has dimensions {dims}, which {kind.name} cannot hold (rows in blocks of {block})")
        count = 1
        for d in dims:
            count *= d
            if count > size * block:  # no tensor holds more values than the file has bytes (times a block)
                raise TfcliError(f"{path} is truncated or corrupt: tensor {name} ({dims}) is larger than the file")
        nbytes = count // block * block_bytes
        start = data_start + offset
        if offset % alignment:
            raise TfcliError(f"{path}: tensor {name} starts at offset {offset:,}, not a multiple of the alignment {alignment}")
        if start + nbytes > size:
            raise TfcliError(
                f"{path} is truncated or corrupt: tensor {name} ({nbytes:,} bytes at offset {start:,}) runs past the end of the file ({size:,} bytes)"
            )
        tensors[name] = TensorInfo(name, tuple(reversed(dims)), kind, start, nbytes)
    spans = sorted((t.start, t.start + t.nbytes, t.name) for t in tensors.values())
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise TfcliError(f"{path} is corrupt: tensors {first} and {second} overlap")
    return tensors
