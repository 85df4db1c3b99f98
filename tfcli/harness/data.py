"""A local JSON-lines task scored with --limit N reads the first rows of its files, not all of them: the
harness's loader (`datasets.load_dataset("json", data_files=...)`) parses a whole file into an Arrow cache
before the first document is scored, and `split="test[:N]"` still builds the whole cache first. Used only
when --limit is given and every data file is local JSON lines; anything else goes to the harness as it is."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tfcli.corpus.formats import compression_of
from tfcli.limits import RECORD, capped_lines

JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")
_ALLOWED_KWARGS = {"data_files", "trust_remote_code"}  # the harness drops trust_remote_code before it loads
_PATTERN = set("*?[{")  # a glob: datasets expands it, so the files are not named here


@dataclasses.dataclass(frozen=True)
class FirstRows:
    """What a task's `datasets.load_dataset("json", data_files=...)` call may read: for each split, its
    files (in order) and the rows needed, or None where the harness uses the whole split."""

    data_files: dict[str, list[str]]
    rows: dict[str, int | None]


def first_rows_plan(config: dict[str, Any], limit: int | None, num_fewshot: int | None) -> FirstRows | None:
    """The rows of each split a task needs with --limit `limit`, or None where the harness must read its data
    itself: no --limit, data that is not local JSON lines, or a `process_docs` (it may filter or reorder, so
    the first N documents need not be the first N rows). A split gets `limit` rows, except the one few-shot
    examples are drawn from, which the harness samples from whole (so it is read whole when shots > 0).

    Example: data_files {train: a.jsonl, test: b.jsonl}, test_split test, fewshot_split train, 3 shots,
    --limit 5 -> rows {train: None, test: 5}"""
    if limit is None or config.get("dataset_path") != "json" or config.get("dataset_name") is not None:
        return None
    kwargs = config.get("dataset_kwargs") or {}
    fewshot_config = config.get("fewshot_config") or {}
    if not isinstance(kwargs, dict) or not isinstance(fewshot_config, dict) or set(kwargs) - _ALLOWED_KWARGS:
        return None
    if config.get("custom_dataset") is not None or config.get("process_docs") is not None or fewshot_config.get("process_docs") is not None:
        return None
    files = kwargs.get("data_files")
    by_split = files if isinstance(files, dict) else {"train": files}  # datasets' own name for unnamed data files
    data_files: dict[str, list[str]] = {}
    for split, value in by_split.items():
        paths = [value] if isinstance(value, str) else value
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and _local_json_lines(p) for p in paths):
            return None
        data_files[str(split)] = paths
    shots = num_fewshot if num_fewshot is not None else (config.get("num_fewshot") or 0)
    fewshot_split = fewshot_config.get("split") or config.get("fewshot_split")
    if fewshot_split is None and fewshot_config.get("samples") is None:
        fewshot_split = config.get("training_split") or config.get("validation_split")  # the harness's fallback
    rows = {split: None if shots and split == fewshot_split else limit for split in data_files}
    if all(n is None for n in rows.values()):
        return None
    return FirstRows(data_files, rows)


def _local_json_lines(path: str) -> bool:
    """A JSON-lines file on this machine, named as datasets reads it (from the current folder when
    relative): no URL, no glob, no `~`. Its name and kind only: nothing of it is read before the harness's
    load_dataset call, so an --include-path folder's data checks (`trust.data_inside`) come first."""
    if "://" in path or "::" in path or path.startswith("~") or _PATTERN.intersection(path):
        return False
    return path.lower().endswith(JSON_LINES_SUFFIXES) and os.path.isfile(path)


def _compressed(path: str) -> bool:
    """Whether a file's first bytes announce a compression (datasets would decompress it; this reader does not)."""
    with open(path, "rb") as handle:
        return compression_of(handle.read(16)) is not None


def _first_lines(paths: list[str], count: int, out: Path) -> None:
    """The first `count` non-blank lines of `paths`, read in order (one file after another, as datasets joins
    them), written to `out`. Only those lines and the block they end in are read; a line past
    TFCLI_MAX_RECORD_CHARS is the one line naming that limit."""
    kept = 0
    with open(out, "wb") as sink:
        for path in paths:
            if kept == count:
                return
            with open(path, "rb") as handle:
                for _, line in capped_lines(handle, RECORD.value, lambda n, p=path: RECORD.exceeded(f"{p} line {n:,}")):
                    if line.strip():  # the JSON reader skips blank lines: they are no row
                        sink.write(line + b"\n")
                        kept += 1
                        if kept == count:
                            break


@contextlib.contextmanager
def first_rows_only(plan: FirstRows | None) -> Iterator[None]:
    """While it lasts, the harness's `datasets.load_dataset("json", data_files=plan.data_files)` reads each
    split's first rows only: they are copied to a temporary file and given to datasets' own JSON reader in
    the same one call (the same types: an ISO date is a timestamp as before, and every split takes the first
    split's columns, as datasets makes them), kept in memory, and the temporary folder removed. Whole splits
    are read from their own files. Any other call goes through unchanged."""
    if plan is None:
        yield
        return
    import datasets
    import datasets.load

    original = datasets.load_dataset
    signature = inspect.signature(datasets.load.load_dataset)  # the real one's, whatever wraps it now

    @functools.wraps(original)  # its signature too: data_inside, wrapped around this, binds the call's arguments with it
    def first_rows_load_dataset(*args, **kwargs):
        try:
            arguments = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            return original(*args, **kwargs)
        extra = set(arguments) - {"path", "name", "data_files"}
        if arguments.get("path") != "json" or arguments.get("name") is not None or extra or not _same_files(arguments.get("data_files"), plan):
            return original(*args, **kwargs)
        if any(_compressed(p) for split, paths in plan.data_files.items() if plan.rows[split] is not None for p in paths):
            return original(*args, **kwargs)  # a .jsonl that is gzip inside: datasets reads it whole, as before
        with tempfile.TemporaryDirectory(prefix="tfcli-first-rows-") as folder:
            files: dict[str, list[str] | str] = {}
            for number, (split, paths) in enumerate(plan.data_files.items()):
                count = plan.rows[split]
                if count is None:
                    files[split] = paths
                else:
                    files[split] = str(Path(folder) / f"split{number}.jsonl")  # numbered: a split's name may be any text
                    _first_lines(paths, count, Path(files[split]))
            return original(path="json", data_files=files, cache_dir=str(Path(folder) / "cache"), keep_in_memory=True)

    datasets.load_dataset = first_rows_load_dataset
    try:
        yield
    finally:
        datasets.load_dataset = original


def _same_files(data_files: Any, plan: FirstRows) -> bool:
    """Whether a load_dataset call's data_files are the ones the plan was made for."""
    by_split = data_files if isinstance(data_files, dict) else {"train": data_files}
    try:
        return {str(k): [v] if isinstance(v, str) else list(v) for k, v in by_split.items()} == plan.data_files
    except TypeError:
        return False
