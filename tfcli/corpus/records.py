"""Records of JSON lines, CSV / TSV and Parquet: each record's number (its line or row), the values of the
fields asked for, and why a record cannot be read (a bad line after the first, a missing field).

Rows come one at a time from text blocks (JSON lines, CSV) or from record batches read row group by row group
(Parquet, only the columns asked for); nothing holds a whole file.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from tfcli.corpus.formats import first_line
from tfcli.errors import TfcliError
from tfcli.jsontext import loads_json
from tfcli.limits import RECORD

PARQUET_BATCH_ROWS = 1024
CSV_FIELD_LIMIT = 1 << 27  # characters: csv's default (128 Ki) is smaller than many real documents; a broken quote stops here


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # a field the record does not have


class Row(NamedTuple):
    """One record: where it is (`number`, a line or a row, see `tfcli.corpus.reader.record_unit`), the values of the
    fields asked for (MISSING where absent) and, when it cannot be read at all, why (`problem`)."""

    number: int
    values: tuple
    problem: str | None = None


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


def _shown(columns: Sequence[str]) -> str:
    """The first twelve column names, quoted. Example: ["a", "b"] -> "'a', 'b'"."""
    return ", ".join(repr(c) for c in columns[:12]) + (", ..." if len(columns) > 12 else "")


def _first_missing(fields: Sequence[str], values: Sequence) -> str | None:
    """The first of `fields` whose value is MISSING, or None."""
    return next((field for field, value in zip(fields, values) if value is MISSING), None)


def record_lines(blocks: Iterator[str], where: str = "the file") -> Iterator[str]:
    """Lines of a stream of text blocks, cut at "\\n" only (a JSON string or a quoted CSV field may hold
    other line separators), each with its "\\n"; a line longer than a block is joined from its parts, up to
    the cap on one record (limits.RECORD), past which it is the one line naming the cap."""
    cap = RECORD.value
    held: list[str] = []
    held_chars = 0
    number = 0
    for block in blocks:
        if "\n" not in block:
            held.append(block)
            held_chars += len(block)
            if held_chars > cap:
                raise RECORD.exceeded(f"{where} line {number + 1:,}")
            continue
        lines = block.split("\n")
        if held:
            lines[0] = "".join(held) + lines[0]
            held, held_chars = [], 0
        last = lines.pop()
        for line in lines:
            number += 1
            if len(line) > cap:
                raise RECORD.exceeded(f"{where} line {number:,}")
            yield line + "\n"
        if last:
            held.append(last)
            held_chars = len(last)
    if held:
        yield "".join(held)


TABLE_DELIMITERS = {"CSV": ",", "TSV": "\t"}


def csv_header_kind(line: str) -> str | None:
    """The table a line reads as the header of, "CSV" or "TSV" (two or more names, each one word, not starting a
    JSON value), else None. Example: "text,label" -> "CSV"; '{"text": 1}' -> None; "hello world, again" -> None."""
    line = line.removeprefix("\ufeff").strip("\r\n")
    if not line or line.lstrip()[:1] in ("{", "["):
        return None
    for kind, delimiter in TABLE_DELIMITERS.items():
        try:
            names = next(csv.reader([line], delimiter=delimiter))
        except csv.Error:
            continue
        if len(names) >= 2 and all(0 < len(name.strip()) <= 64 and len(name.strip().split()) == 1 for name in names):  # prose has spaces
            return kind
    return None


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
            record = loads_json(line, finite=False)  # a corpus's other fields may hold NaN (pandas writes it)
        except json.JSONDecodeError as exc:
            if first or strict:
                what = "is not valid JSON" if not first else "is not valid JSON, so the file is not JSON lines"
                hint = "pass JSON lines: one object per line" + ("" if strict else ", or --input-format text to read it as text")
                message = f"{where} line {number} {what} ({exc.msg})"
                if first and (table := csv_header_kind(line)):
                    names = next(csv.reader([line.strip()], delimiter=TABLE_DELIMITERS[table]))
                    message += f": it looks like a {table} header ({_shown(names)})"
                    hint = f"name the file .{table.lower()}" + ("" if strict else f" or pass --input-format {table.lower()}") + ", or convert it to JSON lines"
                raise TfcliError(message, hint=hint) from exc
            yield Row(number, (MISSING,) * len(fields), f"is not valid JSON ({exc.msg})")
            continue
        first = False
        if not isinstance(record, dict):
            if strict:
                raise TfcliError(f"{where} line {number} is not a JSON object")
            yield Row(number, (MISSING,) * len(fields), "is not a JSON object")
            continue
        values = tuple(lookup(record, f) for f in fields)
        missing = _first_missing(fields, values)
        yield Row(number, values, None if missing is None else f"has no {missing!r} field (it has {_keys(record)})")


def _other_delimiter(header: list[str], delimiter: str) -> str | None:
    """The separator a one-column header seems to use instead of `delimiter`, or None.

    Example: (["text;label"], ",") -> ";"; (["text"], ",") -> None
    """
    if len(header) != 1:
        return None
    return next((d for d in (",", "\t", ";", "|") if d != delimiter and d in header[0]), None)


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
            other = _other_delimiter(header, delimiter)
            if other is None:
                raise TfcliError(f"{where} has no column {field!r} (its header: {_shown(header)})", hint=hint)
            kind = next((k for k, d in TABLE_DELIMITERS.items() if d == other), None)
            raise TfcliError(
                f"{where} has no column {field!r}: its header {_shown(header)} seems to separate columns with {other!r}, not {delimiter!r}",
                hint=f"name the file .{kind.lower()} or pass --input-format {kind.lower()}"
                if kind
                else "tfcli reads CSV with commas and TSV with tabs: convert the file to one of them",
            )
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
        missing = _first_missing(fields, values)
        yield Row(start, values, None if missing is None else f"has no value for the column {missing!r} ({len(row)} of {len(header)} columns)")


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
            raise TfcliError(f"{where} has no column {field!r} (its columns: {_shown(names)})", hint=hint)
        tops.append(top)
    wanted = list(dict.fromkeys(tops))
    total = parquet.metadata.num_rows
    number = 0
    batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=wanted, use_threads=False)
    while True:
        try:
            batch = next(batches, None)
        except (pyarrow.ArrowException, OSError) as exc:
            raise TfcliError(f"{where} is damaged near row {number + 1} ({first_line(exc)})", hint="fetch it again, or leave it out") from exc
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
            missing = _first_missing(fields, values)
            yield Row(number, values, None if missing is None else f"has no {missing!r} field")
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
