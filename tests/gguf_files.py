"""GGUF files the tests write by hand, through llama.cpp's own `gguf` writer: a new file from the keys and
tensors a test adds, or a copy of a file with keys dropped, changed or added and tensors replaced."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np


@contextlib.contextmanager
def new_gguf(path: Path, arch: str) -> Iterator[Any]:
    """A `gguf.GGUFWriter` for a new file at `path`: the block adds keys and tensors to it, then the file is
    written (header, metadata, tensors) and closed. Nothing is written if the block raises."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    yield writer
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@contextlib.contextmanager
def gguf_copy(
    src: Path,
    dst: Path,
    *,
    arch: str | None = None,
    drop: Collection[str] = (),
    drop_prefixes: tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
    tensor: Callable[[Any], tuple[np.ndarray, Any]] | None = None,
) -> Iterator[Any]:
    """A copy of the GGUF file `src` written at `dst`. Every metadata key is kept with its type (GGUF.* and
    general.architecture are the writer's own) but those in `drop` or starting with one of `drop_prefixes`;
    `values` gives kept keys new values of the same type; with `arch`, the copy is of that architecture and
    its keys are renamed to it. The block adds keys (after the kept ones) to the writer it gets; the tensors
    follow, as they were or as `tensor(reader_tensor)` gives them: (data, raw dtype).
    Example: with gguf_copy(a, b, drop={"llama.context_length"}) as writer: writer.add_uint32("llama.context_length", 8)"""
    import gguf

    reader = gguf.GGUFReader(src)
    old_arch = reader.fields["general.architecture"].contents()
    with new_gguf(dst, arch or old_arch) as writer:
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture" or key in drop or (drop_prefixes and key.startswith(drop_prefixes)):
                continue
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            renamed = key.replace(f"{old_arch}.", f"{arch}.", 1) if arch else key
            writer.add_key_value(renamed, (values or {}).get(key, field.contents()), field.types[0], sub_type=sub)
        yield writer
        for item in reader.tensors:
            data, raw_dtype = tensor(item) if tensor else (np.asarray(item.data), item.tensor_type)
            writer.add_tensor(item.name, data, raw_dtype=raw_dtype)


def copied_gguf(src: Path, dst: Path, **changes: Any) -> Path:
    """`gguf_copy` with no keys added; returns `dst`."""
    with gguf_copy(src, dst, **changes):
        pass
    return dst
