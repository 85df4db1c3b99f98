"""What a task folder given with --include-path may do unless --trust-remote-code is given: hold templates
and data, never code, and read data only inside itself. tfcli's own tasks and the harness's registry are trusted.

Code is what lm-eval would import or call from a task file: a `!function` tag, a `class:` entry, a metric
that is not one of the harness's own (HF `evaluate` imports it, a local .py file included). The YAML files
are read here, with `!function` kept as a marker, before lm-eval reads them. Data paths (`data_files`,
`data_dir`, a local `dataset_path`) are checked where `datasets` opens them, after symlinks, so no route
through the harness (a task, a group, a tag) reads past the folders."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from tfcli.errors import TfcliError

TRUST_HINT = "pass --trust-remote-code if you trust the folder's code"
DATA_HINT = "keep a task's data files inside its folder, or pass --trust-remote-code if you trust the folder"
_IGNORED_FOLDERS = {"__pycache__", ".ipynb_checkpoints"}  # as lm-eval's index skips them
_REMOTE = ("http://", "https://", "hf://")  # data files named by URL: fetched (offline: from the cache), never local files


class _Tagged:
    """A YAML value written with a tag lm-eval would act on (`!function utils.fn`, `!!python/name:os.system`)."""

    def __init__(self, tag: str, text: str) -> None:
        self.tag, self.text = tag, text


def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node, *, prefix: str) -> _Tagged:
    text = loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else "..."
    return _Tagged(prefix + suffix, str(text))


class _MarkingLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # lm-eval's own base where libyaml is there
    """A safe loader that reads every `!tag` and `!!python/...` tag as a marker, never as a call."""


_MarkingLoader.add_multi_constructor("!", lambda loader, suffix, node: _tagged(loader, suffix, node, prefix="!"))
_MarkingLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: _tagged(loader, suffix, node, prefix="!!python/"))


def _inside(path: str | Path, roots: Sequence[Path]) -> bool:
    """Whether `path`, symlinks followed, is one of `roots` (already real paths) or below one."""
    real = Path(os.path.realpath(path))
    return any(real == root or root in real.parents for root in roots)


def check_task_folder(folder: Path, trusted: Sequence[Path]) -> None:
    """Every task file lm-eval would index in `folder` (its *.yaml files, as the harness globs them) and every
    file they include: no code, and nothing outside `folder` but files in `trusted` folders (tfcli's tasks,
    the harness's registry). A refused file is a TfcliError naming it and what it holds."""
    import lm_eval.api.metrics  # noqa: F401  registers the harness's metrics
    from lm_eval.api.registry import metric_registry

    root = Path(os.path.realpath(folder))
    trusted_roots = [Path(os.path.realpath(t)) for t in trusted]
    seen: set[Path] = set()
    files = sorted((p for p in Path(folder).glob("**/*.yaml") if not _IGNORED_FOLDERS.intersection(p.parts)), key=lambda p: p.as_posix())
    for path in files:
        _check_file(path, None, root, trusted_roots, seen, metric_registry)


def _check_file(path: Path, included_by: Path | None, root: Path, trusted: Sequence[Path], seen: set[Path], metrics) -> None:
    real = Path(os.path.realpath(path))
    if real in seen:
        return
    seen.add(real)
    named = f"{path} (included by {included_by})" if included_by else str(path)
    if not _inside(real, [root]):
        if _inside(real, trusted):
            return
        raise TfcliError(f"task file {named} leads outside the task folder {root}", hint=TRUST_HINT)
    if not real.is_file():  # missing, a folder, a pipe: lm-eval reads nothing from it either
        return
    try:
        with open(real, "rb") as handle:
            config = yaml.load(handle, Loader=_MarkingLoader)  # noqa: S506  a safe loader: tags become markers
    except (yaml.YAMLError, OSError, UnicodeDecodeError, RecursionError):
        return  # lm-eval cannot read it either: its index skips it, and a task asked from it fails to load
    problem = _code_in(config, metrics)
    if problem:
        raise TfcliError(f"task file {named} {problem}, code from the task folder that tfcli does not run by default", hint=TRUST_HINT)
    includes = config.get("include") if isinstance(config, dict) else None
    for include in includes if isinstance(includes, list) else [includes] if includes is not None else []:
        if isinstance(include, str):
            _check_file(real.parent / include, path, root, trusted, seen, metrics)  # as lm-eval resolves it


def _code_in(config: Any, metrics) -> str | None:
    """What in a parsed task file lm-eval would import or call, said for a message; None when nothing.

    Example: {"process_docs": _Tagged("!function", "utils.fix")} -> "holds `!function utils.fix`" """
    stack, visited = [config], set()
    while stack:
        item = stack.pop()
        if id(item) in visited:  # YAML aliases share nodes: each is walked once (a "billion laughs" file included)
            continue
        visited.add(id(item))
        if isinstance(item, _Tagged):
            return f"holds `{_shown(item)}`"
        if isinstance(item, dict):
            if "class" in item:
                return f"names a Python task class (`class: {_shown(item['class'])}`)"
            metric = item.get("metric")
            if isinstance(metric, str) and (metric not in metrics or item.get("hf_evaluate") is True):
                return f"asks for the metric {_shown(metric)!r}, which is not one of the harness's own (HF evaluate would import its code)"
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def _shown(value: Any) -> str:
    """A value from a task file, for a one-line message: whitespace runs as one space, 80 characters at most."""
    text = f"{value.tag} {value.text}" if isinstance(value, _Tagged) else str(value)
    return " ".join(text.split())[:80]


@contextlib.contextmanager
def data_inside(folders: Sequence[Path]) -> Iterator[None]:
    """While it lasts, every dataset the harness opens reads local files only inside `folders`: the harness
    calls `datasets.load_dataset(path=..., **dataset_kwargs)` as it builds a task, so that one function is
    wrapped here, checked first, and put back afterwards. A read outside is a TfcliError."""
    import datasets

    roots = [Path(os.path.realpath(f)) for f in folders]
    original = datasets.load_dataset
    signature = inspect.signature(original)

    def checked_load_dataset(*args, **kwargs):
        try:
            arguments = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            return original(*args, **kwargs)  # refused by datasets itself, before it reads anything
        check_data_reads(arguments, roots)
        return original(*args, **kwargs)

    datasets.load_dataset = checked_load_dataset
    try:
        yield
    finally:
        datasets.load_dataset = original


def check_data_reads(arguments: dict[str, Any], roots: Sequence[Path]) -> None:
    """The local files `datasets.load_dataset(**arguments)` would read all lie inside `roots`, read as
    datasets reads them: a packaged builder (json, csv, ...) reads data_files from data_dir or the current
    folder; a local folder as dataset_path reads from it; a dataset on the Hub reads its own files."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    path, data_dir, data_files = arguments.get("path"), arguments.get("data_dir"), arguments.get("data_files")
    cwd = Path.cwd()
    if arguments.get("cache_dir") is not None:
        _require_inside("cache_dir", arguments["cache_dir"], cwd, roots)
    if not isinstance(path, str) or path.startswith("hf://"):
        return
    if path in _PACKAGED_DATASETS_MODULES:
        base = cwd
    elif os.path.isdir(path):
        _require_inside("dataset_path", path, cwd, roots)
        base = Path(path)
    else:
        return  # a dataset on the Hub (offline: its cached copy): data_files name files in its repository
    if data_dir is not None:
        _require_inside("data_dir", data_dir, base, roots)
        base = base / os.path.expanduser(str(data_dir))
    elif data_files is None and path in _PACKAGED_DATASETS_MODULES:
        _check_tree("data_files", f"(none: {cwd}, the current folder)", cwd, roots)
    for value in _strings(data_files):
        _require_inside("data_files", value, base, roots)


def _strings(value: Any) -> Iterator[str]:
    """Every path a data_files value names: a string, a list, or a mapping of splits to either."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)
    elif value is not None:
        yield str(value)


def _require_inside(what: str, value: Any, base: Path, roots: Sequence[Path]) -> None:
    """`value` (a path relative to `base`, a glob pattern, or a URL) names nothing outside `roots`."""
    text = str(value)
    if text.startswith(_REMOTE) and "::" not in text:
        return
    if "://" in text or "::" in text:  # file://, zip://...::/path and other fsspec routes to local files
        raise TfcliError(f"{what} {text!r} is outside the task folder", hint=DATA_HINT)
    target = Path(os.path.expanduser(text))
    target = target if target.is_absolute() else base / target
    parts = target.parts
    fixed = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
    _check_tree(what, repr(text), Path(*parts[:fixed]) if fixed else Path("."), roots)  # a glob: all below its fixed part may match


def _check_tree(what: str, shown: str, target: Path, roots: Sequence[Path]) -> None:
    """`target`, symlinks followed, lies inside `roots`, and so does every link below it when it is a folder."""
    if not _inside(target, roots):
        raise TfcliError(f"{what} {shown} is outside the task folder", hint=DATA_HINT)
    if os.path.isdir(target):
        for folder, subfolders, names in os.walk(target):  # walk does not follow links: each is checked here
            for name in (*subfolders, *names):
                entry = os.path.join(folder, name)
                if os.path.islink(entry) and not _inside(entry, roots):
                    raise TfcliError(f"{what} {shown} holds {entry}, a link outside the task folder", hint=DATA_HINT)
