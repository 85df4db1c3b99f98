"""Token shards: a corpus encoded into `train.bin` / `val.bin` (flat little-endian ids) and `meta.json`.

Documents are separated by the end-of-text id; each document goes whole to train or to validation, by a
seeded draw. Input and output stream in bounded batches, so peak memory does not grow with the corpus.
The trainer memory-maps the .bin files (`open_shard`); it never loads them whole.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tfcli.corpus.documents import DocumentBoundary, DocumentPiece, empty_corpus_error, iter_document_pieces
from tfcli.corpus.reader import Corpus, ReadStats
from tfcli.errors import TfcliError
from tfcli.fsutil import LOCK_FILE, artifact_kind, commit_staged, discard_staged, exclusive_lock, prepare_output_dir, sha256_file, stage_json
from tfcli.schema import JsonRecord
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.fast import fast_encoder

SHARD_FORMAT_VERSION = 1
META_FILE = "meta.json"
SPLITS = ("train", "val")
BATCH_CHARS = 1 << 20  # text handed to one encode_batch call

EncodeProgress = Callable[[int, int, int], None]  # (bytes read, total bytes, tokens written)


def shard_dtype_name(vocab_size: int) -> str:
    """uint16 while every id fits in 16 bits, else uint32. Example: 65_536 -> "uint16", 65_537 -> "uint32"."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


@dataclasses.dataclass
class ShardSource(JsonRecord):
    path: str
    bytes: int


@dataclasses.dataclass
class ShardCheck(JsonRecord):
    """What a .bin file held when it was encoded: its sha256 (the whole file, for a full check), the sha256 of
    SAMPLE_BLOCKS blocks spread over it (a cheap check at every start) and its modification time."""

    sha256: str
    sample_sha256: str
    mtime_ns: int


SAMPLE_BLOCKS, SAMPLE_BYTES = 64, 4096  # 256 KiB read per split at a start: every byte of a smaller file


def sample_sha256(path: Path) -> str:
    """sha256 of the file's size and SAMPLE_BLOCKS blocks at evenly spread offsets (the whole file when small)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        if size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
            digest.update(handle.read())
        else:
            for i in range(SAMPLE_BLOCKS):
                handle.seek((size - SAMPLE_BYTES) * i // (SAMPLE_BLOCKS - 1))
                digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()


@dataclasses.dataclass
class ShardMeta(JsonRecord):
    """meta.json of a shard folder: what the .bin files hold and where they came from."""

    format_version: int
    dtype: str
    vocab_size: int
    eos_id: int
    tokenizer_sha256: str
    train_tokens: int
    val_tokens: int
    train_documents: int
    val_documents: int
    val_fraction: float
    seed: int
    document_boundary: str
    sources: list[ShardSource]
    invalid_utf8_bytes: int = 0
    invalid_utf8_files: int = 0
    skipped_binary_files: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    tokenizer_path: str = ""  # where the tokenizer.json was when encoding (absolute), for training to find it
    field: str = ""  # the text field of JSON lines, CSV and Parquet sources ("" when all are plain text)
    skipped_records: int = 0  # records whose field was missing or not a string
    skipped_record_examples: list[str] = dataclasses.field(default_factory=list)  # the first few, by file and line or row
    encoder: str = "tokenizers"  # what computed the ids: tokenizers, or tiktoken where it gives the same ids
    checks: dict[str, ShardCheck] | None = None  # per split (None in shards encoded before tfcli kept them)

    def tokens(self, split: str) -> int:
        return self.train_tokens if split == "train" else self.val_tokens


class ShardWriter:
    """Appends token ids to a temp file beside `path`; `finish` makes it durable, for `commit_staged` to
    rename into place."""

    def __init__(self, path: Path, dtype: str) -> None:
        self.path = path
        self.tmp_path = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.tokens = 0
        self.documents = 0
        self._handle: BinaryIO = open(self.tmp_path, "wb")
        self._digest = hashlib.sha256()

    def write(self, ids: np.ndarray) -> None:
        data = ids.astype(self.dtype, copy=False).tobytes()
        self._handle.write(data)
        self._digest.update(data)
        self.tokens += int(ids.size)

    def check(self) -> ShardCheck:
        """The finished file's fingerprint (its name stays the same through the rename, and so does its mtime)."""
        return ShardCheck(sha256=self._digest.hexdigest(), sample_sha256=sample_sha256(self.tmp_path), mtime_ns=self.tmp_path.stat().st_mtime_ns)

    def finish(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()

    def discard(self) -> None:
        if not self._handle.closed:
            self._handle.close()
        self.tmp_path.unlink(missing_ok=True)


def _batches(pieces: Iterator[DocumentPiece]) -> Iterator[list[DocumentPiece]]:
    """Group pieces into batches of about BATCH_CHARS characters (the last piece may overshoot by one piece)."""
    limit = BATCH_CHARS
    batch: list[DocumentPiece] = []
    chars = 0
    for piece in pieces:
        batch.append(piece)
        chars += len(piece.text)
        if chars >= limit:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


class _DocumentSplits:
    """The train and validation writers, and the seeded draw that sends each document whole to one of them
    (an end-of-text id after each document)."""

    def __init__(self, out_dir: Path, dtype: str, eos_id: int, seed: int, val_fraction: float, check_ids: Callable[[int], None]) -> None:
        self.check_ids = check_ids
        self.writers = {split: ShardWriter(out_dir / f"{split}.bin", dtype) for split in SPLITS}
        self.eos_id, self.val_fraction = eos_id, val_fraction
        self._draw = random.Random(seed).random
        self.split = self._pick()  # the split of the document still open

    def _pick(self) -> str:
        return "val" if self._draw() < self.val_fraction else "train"

    @property
    def tokens(self) -> int:
        return self.writers["train"].tokens + self.writers["val"].tokens

    def write(self, batch: list[DocumentPiece], ids_per_piece) -> None:
        """Append a batch's ids (lists from tokenizers, arrays from tiktoken); a new draw picks the split of
        each next document."""
        eos = np.array([self.eos_id], dtype=np.uint32)
        parts: dict[str, list] = {"train": [], "val": []}
        for piece, ids in zip(batch, ids_per_piece):
            target = parts[self.split]
            target.append(np.asarray(ids, dtype=np.uint32))
            if piece.ends_document:
                target.append(eos)
                self.writers[self.split].documents += 1
                self.split = self._pick()
        for name, arrays in parts.items():
            if arrays:
                ids = np.concatenate(arrays)
                self.check_ids(int(ids.max()))  # tiktoken's arrays too: an id past the vocabulary would be cut to the shard's dtype
                self.writers[name].write(ids)

    def refuse_empty(self, corpus: Corpus, stats: ReadStats) -> None:
        """No document at all, or none left for training, is an error."""
        train, val = self.writers["train"], self.writers["val"]
        if train.documents + val.documents == 0:
            raise empty_corpus_error(corpus, stats)
        if train.documents == 0:
            raise TfcliError(
                f"every document went to validation ({val.documents} in all)",
                hint="lower --val-fraction, or pass --documents line/paragraph to get more documents",
            )

    def finish(self) -> list[tuple[Path, Path]]:
        """Make both shards durable; (temporary path, final path) of each, for `commit_staged`."""
        for writer in self.writers.values():
            writer.finish()
        return [(writer.tmp_path, writer.path) for writer in self.writers.values()]

    def discard(self) -> None:
        for writer in self.writers.values():
            writer.discard()


def freed_memory_giver() -> Callable[[], None]:
    """What hands the memory freed since the last call back to the system (glibc's malloc_trim; elsewhere nothing).
    glibc raises its mmap threshold to the largest block freed, after which the megabyte blocks each batch frees
    come from the heap and stay there: encoding's peak then grew with the input (170 MB for a 200 MB file, 83 MB
    for 20 MB); trimmed after each batch it stays flat, with no lasting setting left in the process."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0)


def _encode_pipelined(batches: Iterator[list[DocumentPiece]], encode_batch: Callable, write: Callable, report: Callable[[], None]) -> None:
    """Encode each batch and `write` its ids, in order; `report()` after each write and at the end. One worker
    thread encodes batch k+1 (the encoder releases the GIL and uses every core) while this thread writes batch
    k and reads batch k+2."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfcli-encode") as pool:
        pending = None
        for batch in batches:
            submitted = (batch, pool.submit(encode_batch, [p.text for p in batch]))
            if pending is not None:
                write(pending[0], pending[1].result())
                report()
            pending = submitted
        if pending is not None:
            write(pending[0], pending[1].result())
    report()


def encode_corpus(
    corpus: Corpus,
    tokenizer: TextTokenizer,
    out_dir: Path,
    val_fraction: float = 0.05,
    seed: int = 0,
    boundary: DocumentBoundary = "paragraph",
    progress: EncodeProgress | None = None,
) -> ShardMeta:
    """Encode `corpus` into OUT_DIR/{train,val}.bin and OUT_DIR/meta.json; return the meta.

    Files already in OUT_DIR stay untouched until the new ones are complete. A run directory is never written
    into, and a second encode into OUT_DIR while one is at work there is refused (the folder's lock).
    """
    if not 0.0 <= val_fraction < 1.0:
        raise TfcliError(f"--val-fraction must be in [0, 1), not {val_fraction}")
    if corpus.total_bytes == 0 and not corpus.has_stdin:
        raise TfcliError("the corpus is empty (every file has 0 bytes)", hint="pass files that hold text")
    kind = artifact_kind(out_dir) if Path(out_dir).is_dir() else None
    if kind not in (None, "a token-shard folder", "a tokenizer folder"):  # shards replace shards; a tokenizer's folder may hold its shards
        raise TfcliError(f"{out_dir} is {kind}; the shards would be written into it", hint="pass a new or empty folder with -o")
    eos_id = tokenizer.require("eos")
    out_dir = prepare_output_dir(out_dir, "shard output")
    own_lock_file = not (out_dir / LOCK_FILE).exists()
    with exclusive_lock(out_dir, "encoding into"):
        try:
            return _encode_into(corpus, tokenizer, eos_id, out_dir, val_fraction, seed, boundary, progress)
        finally:
            if own_lock_file:  # a shard folder holds its shards and meta.json only; removed while still held
                (out_dir / LOCK_FILE).unlink(missing_ok=True)


def _encode_into(
    corpus: Corpus,
    tokenizer: TextTokenizer,
    eos_id: int,
    out_dir: Path,
    val_fraction: float,
    seed: int,
    boundary: DocumentBoundary,
    progress: EncodeProgress | None,
) -> ShardMeta:
    started = time.perf_counter()
    dtype = shard_dtype_name(tokenizer.vocab_size)
    # tiktoken where it provably gives the ids tokenizers gives (byte-level BPE with GPT-2's regex): faster
    fast, _ = fast_encoder(tokenizer)
    encode_batch = fast.encode_batch if fast else tokenizer.encode_batch
    splits = _DocumentSplits(out_dir, dtype, eos_id, seed, val_fraction, tokenizer.check_ids)
    staged: list[tuple[Path, Path]] = []
    stats = ReadStats()

    give_back = freed_memory_giver()

    def report() -> None:
        give_back()
        if progress:
            progress(stats.bytes_read, corpus.total_bytes, splits.tokens)

    try:
        _encode_pipelined(_batches(iter_document_pieces(corpus, boundary, stats)), encode_batch, splits.write, report)
        splits.refuse_empty(corpus, stats)
        train, val = splits.writers["train"], splits.writers["val"]
        staged = splits.finish()
        meta = ShardMeta(
            format_version=SHARD_FORMAT_VERSION,
            dtype=dtype,
            vocab_size=tokenizer.vocab_size,
            eos_id=eos_id,
            tokenizer_sha256=tokenizer.sha256,
            tokenizer_path=str(Path(tokenizer.path).resolve()) if tokenizer.path else "",
            train_tokens=train.tokens,
            val_tokens=val.tokens,
            train_documents=train.documents,
            val_documents=val.documents,
            val_fraction=val_fraction,
            seed=seed,
            document_boundary=boundary,
            sources=[ShardSource(path=str(f.path), bytes=stats.stdin_bytes if f.is_stdin else f.size) for f in corpus.files],
            field=corpus.field if any(f.format != "text" for f in corpus.files) else "",
            skipped_records=stats.skipped_records,
            skipped_record_examples=list(stats.skipped_examples),
            encoder=fast.name if fast else "tokenizers",
            invalid_utf8_bytes=stats.invalid_bytes,
            invalid_utf8_files=len(stats.files_with_invalid_utf8),
            skipped_binary_files=[str(p) for p in corpus.skipped_binary],
            seconds=round(time.perf_counter() - started, 3),
            checks={split: writer.check() for split, writer in splits.writers.items()},
        )
        # Everything is written and fsynced before the first rename, and a signal waits for the last one;
        # meta.json goes last, so a crash between the renames leaves sizes that load_shard_meta refuses.
        staged.append((stage_json(out_dir / META_FILE, meta.to_json()), out_dir / META_FILE))
        commit_staged(staged)
        return meta
    finally:
        if fast:
            fast.close()
        splits.discard()
        discard_staged(staged)


def load_shard_meta(shard_dir: Path) -> ShardMeta:
    """Read and check DIR/meta.json and the sizes of the .bin files it describes."""
    shard_dir = Path(shard_dir)
    meta_path = shard_dir / META_FILE
    if shard_dir.is_file():
        raise TfcliError(
            f"{shard_dir} is a file, not a folder of token shards",
            hint=f"encode it first: tfcli tokenize encode {shard_dir} -t TOKENIZER -o SHARDS, then pass SHARDS",
        )
    if not shard_dir.exists():
        raise TfcliError(f"{shard_dir} does not exist", hint="pass a folder of token shards, as `tfcli tokenize encode` writes")
    if not meta_path.is_file():
        raise TfcliError(f"{shard_dir} has no {META_FILE}", hint="encode a corpus into it with `tfcli tokenize encode`")
    meta = ShardMeta.load(meta_path)
    if meta.format_version != SHARD_FORMAT_VERSION:
        raise TfcliError(f"{meta_path} has shard format {meta.format_version}; this tfcli reads {SHARD_FORMAT_VERSION}", hint="re-encode the corpus")
    if meta.dtype not in ("uint16", "uint32"):
        raise TfcliError(f"{meta_path}: dtype must be uint16 or uint32, not {meta.dtype!r}")
    for name in ("train_tokens", "val_tokens", "train_documents", "val_documents"):
        if getattr(meta, name) < 0:
            raise TfcliError(
                f"{meta_path}: {name} is {getattr(meta, name)}, less than 0", hint="the file was edited or damaged; re-run `tfcli tokenize encode`"
            )
    if not 0 <= meta.eos_id < meta.vocab_size:
        raise TfcliError(
            f"{meta_path}: eos_id {meta.eos_id} is outside the vocabulary of {meta.vocab_size:,}",
            hint="the file was edited or damaged; re-run `tfcli tokenize encode`",
        )
    itemsize = 2 if meta.dtype == "uint16" else 4
    for split in SPLITS:
        path = shard_dir / f"{split}.bin"
        expected = meta.tokens(split) * itemsize
        actual = path.stat().st_size if path.is_file() else -1
        if actual != expected:
            raise TfcliError(
                f"{path} holds {max(actual, 0)} bytes but {META_FILE} promises {expected}",
                hint="the shards are incomplete or mixed up; re-run `tfcli tokenize encode`",
            )
    return meta


def verify_shards(shard_dir: Path, meta: ShardMeta, full: bool = False) -> None:
    """The .bin files are the ones meta.json describes, byte for byte as far as the check reads: a file whose
    size and mtime are as encoded passes; another (copied, touched, or shuffled in place) has its sampled
    blocks hashed; `full` hashes every byte. Shards encoded before tfcli kept checks are not checked."""
    if not meta.checks:
        return
    for split, check in meta.checks.items():
        path = Path(shard_dir) / f"{split}.bin"
        if split not in SPLITS or not path.is_file():
            continue
        if full:
            same, how = sha256_file(path) == check.sha256, "its sha256 differs"
        elif path.stat().st_mtime_ns == check.mtime_ns:
            continue
        else:
            same, how = sample_sha256(path) == check.sample_sha256, "its sampled blocks differ"
        if not same:
            raise TfcliError(
                f"{path} is not the file {META_FILE} describes ({how}: its token ids changed since it was encoded)",
                hint="re-run `tfcli tokenize encode`, or restore the shards the run was trained on",
            )


def open_shard(shard_dir: Path, split: str) -> np.ndarray:
    """Memory-map one split's token ids (read-only); nothing is loaded until it is indexed."""
    if split not in SPLITS:
        raise TfcliError(f"unknown split {split!r}", hint=f"use one of {', '.join(SPLITS)}")
    meta = load_shard_meta(shard_dir)
    if meta.tokens(split) == 0:
        return np.zeros(0, dtype=np.dtype(meta.dtype).newbyteorder("<"))
    return np.memmap(Path(shard_dir) / f"{split}.bin", dtype=np.dtype(meta.dtype).newbyteorder("<"), mode="r")
