"""JSON artifacts as dataclasses: `to_json` / `from_json` that refuse unknown keys and wrong types.

Every JSON file tfcli writes (shard meta, configs, trainer state) is a dataclass deriving from
`JsonRecord`, so a hand-edited or foreign file fails with a message naming the key, never deep inside.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

from tfcli.errors import TfcliError
from tfcli.jsontext import loads_json
from tfcli.limits import read_text_capped

R = TypeVar("R", bound="JsonRecord")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Check `value` (parsed JSON) against the annotation `tp`; return it, rebuilt into dataclasses."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, where)
            except TfcliError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is typing.Literal:
        if value not in args:
            raise TfcliError(f"{where} must be one of {', '.join(map(repr, args))}, not {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise TfcliError(f"{where} must be a list, not {type(value).__name__}")
        item_type = args[0] if args else Any
        items = [_convert(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise TfcliError(f"{where} must be an object, not {type(value).__name__}")
        value_type = args[1] if len(args) == 2 else Any
        return {str(k): _convert(v, value_type, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, JsonRecord):
        return tp.from_json(value, where=where)
    if tp is bool:
        if not isinstance(value, bool):
            raise TfcliError(f"{where} must be true or false, not {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TfcliError(f"{where} must be an integer, not {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TfcliError(f"{where} must be a number, not {value!r}")
        if not math.isfinite(value):  # JSON has no inf or nan; a setting that is one is a mistake
            raise TfcliError(f"{where} must be a finite number, not {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise TfcliError(f"{where} must be a string, not {value!r}")
        return value
    raise TypeError(f"unsupported annotation {_type_name(tp)} at {where}")  # a bug in a record, not user input


def describe(tp: Any) -> str:
    """An annotation in words, for messages. Example: describe(int | None) -> "an integer" """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args if a is not type(None))  # a setting is never given as null
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "a table"
    return {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}.get(tp, _type_name(tp))


def expect(value: Any, tp: Any, what: str) -> Any:
    """`value` checked against the annotation `tp` as `from_json` checks a field, for a setting the user typed:
    the error names it as they wrote it. Example: expect("abc", int, "--set d_model") raises
    TfcliError("--set d_model: expected an integer, got 'abc'")."""
    try:
        return _convert(value, tp, what)
    except TfcliError:
        raise TfcliError(f"{what}: expected {describe(tp)}, got {value!r}") from None


def _to_plain(value: Any) -> Any:
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


class JsonRecord:
    """Mixin for dataclasses stored as JSON. Subclasses are `@dataclasses.dataclass`es."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: _to_plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls: type[R], data: Any, where: str | None = None) -> R:
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise TfcliError(f"{where} must be a JSON object, not {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise TfcliError(f"{where} has unknown key {unknown[0]!r}", hint="remove it; the file was edited by hand or written by another version of tfcli")
        kwargs = {}
        for name, field in fields.items():
            if name in data:
                kwargs[name] = _convert(data[name], hints[name], f"{where}.{name}")
            elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise TfcliError(f"{where} is missing the key {name!r}")
        return cls(**kwargs)

    @classmethod
    def load(cls: type[R], path: Path) -> R:
        """Read and validate a JSON file; every problem is a TfcliError naming the file."""
        path = Path(path)
        try:
            text = read_text_capped(path)
        except FileNotFoundError as exc:
            raise TfcliError(f"{path} does not exist") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise TfcliError(f"cannot read {path}: {exc}") from exc
        try:
            data = loads_json(text)
        except json.JSONDecodeError as exc:
            raise TfcliError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from exc
        return cls.from_json(data, where=path.name)
