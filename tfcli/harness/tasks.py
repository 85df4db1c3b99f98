"""Finding lm-eval tasks by name: tfcli's shipped tasks (`tasks/`), the user's --include-path folders, then the
harness's own registry; loading them offline, checked, so a broken task is one clear line before any scoring.

A relative `data_files` path in a task file is read beside the task file when it is there (the harness itself
reads it from the current folder, which still works with --trust-remote-code): a task folder can be moved or
shipped whole. An --include-path folder is checked first (`trust.py`): without --trust-remote-code it holds no
code and reads no data outside itself. With --limit, a task whose data is local JSON lines reads only the rows
it scores (`data.py`)."""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta

from tfcli.errors import TfcliError
from tfcli.harness.data import first_rows_only, first_rows_plan
from tfcli.harness.sandbox import sandboxed_templates, template_refused
from tfcli.harness.trust import check_task_folder, data_inside

SHIPPED_TASKS = Path(__file__).parent / "tasks"
SHIPPED_NAMES = ("tfcli_story_choice", "tfcli_last_word", "tfcli_dates")
REQUIRED_FIELDS = ("task", "dataset_path", "doc_to_text", "doc_to_target")
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
QUIET = {"TQDM_DISABLE": "1"}  # the harness's progress bars; tfcli says what it scores in one line
# datasets' words, offline, for a dataset on the Hub it has not cached
_HUB_MISS = re.compile(r"Couldn't reach '([^']+)' on the Hub|Couldn't reach the Hugging Face Hub for dataset '([^']+)'")
_NAME_LIKE = re.compile(r"[A-Za-z0-9_][\w\-.]*")
# a top-level `tag: x`, `"task": "y"` or `tag:` and the block list below it
_TOP_KEY = re.compile(r"""^["']?(task|group|tag)["']?[ \t]*:[ \t]*([^#\n]*?)[ \t]*(?:#[^\n]*)?$((?:\n[ \t]*-[ \t]+[^\n]*)*)""", re.MULTILINE)
_LIST_ITEM = re.compile(r"^[ \t]*-[ \t]+([^#\n]*?)[ \t]*(?:#[^\n]*)?$", re.MULTILINE)


def go_offline() -> None:
    """Everything the harness reads comes from this machine: the Hub and dataset downloads are off."""
    os.environ.update(OFFLINE)
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    import datasets

    datasets.config.HF_DATASETS_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()


def split_names(tasks: str) -> list[str]:
    """'a, b,a' -> ['a', 'b']: the names of --tasks in order, each once."""
    names = [n.strip() for n in tasks.split(",") if n.strip()]
    if not names:
        raise TfcliError("--tasks names no task", hint="e.g. --tasks tfcli_story_choice,tfcli_last_word")
    return list(dict.fromkeys(names))


@functools.lru_cache(maxsize=1)
def _registry_words() -> tuple[frozenset[str], frozenset[str]]:
    """(every name-like word, the task, group and tag names) of the harness's own task files, read in half a
    second where indexing the registry properly takes many. The words are a superset of the registry's names
    (a name not among them is not there); the names, read from each file's top-level `task:`, `group:` and
    `tag:` lines (tags from the templates a file includes too), are what a "did you mean" offers."""
    import lm_eval.tasks

    words: set[str] = set()
    names: set[str] = set()
    for folder, _, files in os.walk(Path(lm_eval.tasks.__file__).parent):
        for name in files:
            if "yaml" in name:  # task files (*.yaml) and the templates they include (_default_template_yaml)
                with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
                    text = handle.read()
                if name.endswith((".yaml", ".yml")):
                    words.update(_NAME_LIKE.findall(text))
                names.update(_top_level_names(text, tags_only=not name.endswith(".yaml")))
    return frozenset(words), frozenset(n for n in names if _NAME_LIKE.fullmatch(n))


def _top_level_names(text: str, *, tags_only: bool = False) -> set[str]:
    """The names a task file gives the registry: its `group:` (or else its `task:`, when one name) and its
    `tag:` values, a scalar, a [flow] list or a block list. Example: "tag:\\n  - a\\ntask: b\\n" -> {"a", "b"}"""
    found: dict[str, list[str]] = {}
    for match in _TOP_KEY.finditer(text):
        key, value, block = match.group(1), match.group(2).strip(), match.group(3)
        items = value.strip("[]").split(",") if value.startswith("[") else [value] if value else _LIST_ITEM.findall(block)
        found.setdefault(key, []).extend(item.strip().strip("'\"") for item in items)
    names = set(found.get("tag", []))
    if not tags_only:
        if "group" in found:
            names.update(found["group"][:1])
        elif len(found.get("task", [])) == 1:  # a group's `task:` lists its members, named where they are defined
            names.update(found["task"])
    return names


def task_manager(names: Sequence[str], include_paths: Sequence[Path], *, trust_remote_code: bool = False):
    """A TaskManager that knows every name: tfcli's and the include paths' alone where that is enough, the
    harness's whole registry too where a name is not among them. An unknown name is a TfcliError; so is code
    in an include path's task files, unless `trust_remote_code`."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    for path in include_paths:
        if not Path(path).is_dir():
            raise TfcliError(f"--include-path {path} is not a folder", hint="pass a folder of task .yaml files")
    if not trust_remote_code:
        for path in include_paths:  # before lm-eval reads a file of it
            check_task_folder(Path(path), trusted=[SHIPPED_TASKS, Path(lm_eval.tasks.__file__).parent])
    paths = [str(SHIPPED_TASKS), *(str(p) for p in include_paths)]
    manager = TaskManager(include_path=paths, include_defaults=False)
    missing = [n for n in names if n not in manager.task_index]
    if not missing:
        return manager
    words, registry_names = _registry_words()
    if all(n in words for n in missing):
        manager = TaskManager(include_path=paths, include_defaults=True)
        missing = [n for n in missing if n not in manager.task_index]
    if missing:
        known = sorted(set(manager.task_index) | registry_names)  # the registry's names too, indexed or not
        close = difflib.get_close_matches(missing[0], known, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"tfcli's own tasks: {', '.join(SHIPPED_NAMES)}; a folder of your own: --include-path DIR"
        raise TfcliError(f"unknown task {missing[0]!r}", hint=hint)
    return manager


def _resolve_data_files(config: dict[str, Any], folder: Path, *, beside: bool = False) -> None:
    """Relative data_files found beside the task file become absolute paths to them; with `beside`, every
    relative data_files (when no data_dir) and data_dir is read beside the task file, found there or not, never
    from the current folder."""
    kwargs = config.get("dataset_kwargs") or {}
    data_dir = kwargs.get("data_dir")
    if beside and isinstance(data_dir, str) and _relative_path(data_dir):
        kwargs["data_dir"] = str(folder / data_dir)
    files = kwargs.get("data_files")
    if files is None:
        return
    beside = beside and data_dir is None  # datasets reads data_files relative to data_dir where there is one

    def resolved(value):
        if isinstance(value, str) and _relative_path(value) and (beside or (folder / value).exists()):
            return str(folder / value)
        if isinstance(value, list):
            return [resolved(v) for v in value]
        return value

    kwargs["data_files"] = {split: resolved(v) for split, v in files.items()} if isinstance(files, dict) else resolved(files)


def _relative_path(value: str) -> bool:
    return not Path(value).is_absolute() and not value.startswith("~") and "://" not in value and "::" not in value


def _checked_config(name: str, path: Path, *, confined: bool = False) -> dict[str, Any]:
    """The task file's whole configuration (includes followed), its required fields there, data paths resolved
    (all beside the task file when `confined`: a task from an --include-path folder not trusted)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        config = load_yaml(path, resolve_func=True)
    except Exception as exc:  # yaml's errors, a missing include, an import in a !function
        raise TfcliError(f"task {name} ({path}) cannot be read: {_first_line(exc)}") from None
    needed = [*REQUIRED_FIELDS, "doc_to_choice"] if config.get("output_type") == "multiple_choice" else REQUIRED_FIELDS
    for field in needed:
        if field == "dataset_path" and config.get("custom_dataset") is not None:
            continue
        if config.get(field) is None:
            raise TfcliError(f"task {name} ({path}) has no {field}", hint="every task file names task, dataset_path, doc_to_text and doc_to_target")
    if not (config.get("test_split") or config.get("validation_split")):
        raise TfcliError(f"task {name} ({path}) has no test_split or validation_split", hint="name the split to evaluate on")
    _resolve_data_files(config, path.parent, beside=confined)
    return config


def load_tasks(manager, names: Sequence[str], data_folders: Sequence[Path] | None = None, *, limit: int | None = None, num_fewshot: int | None = None) -> list:
    """The harness's Task objects (and Group names) for `names`, tasks built from their checked files; a data
    file that is missing or broken is a TfcliError naming the task, and so is a dataset on the Hub that is not
    in the local cache. With `data_folders` (an --include-path not trusted, and tfcli's tasks), every local
    file a task reads lies in one of them. With `limit` (--limit), a task whose data is local JSON lines reads
    only the rows that many documents and `num_fewshot` examples need (`data.py`)."""
    from lm_eval.tasks._index import Kind

    specs: list[Any] = []
    for name in names:
        entry = manager.task_index[name]
        members = sorted(entry.tags) if entry.kind == Kind.TAG else [name]
        for member in members:
            task_entry = manager.task_index[member]
            if task_entry.kind == Kind.TASK and task_entry.yaml_path is not None:
                specs.append(_checked_config(member, Path(task_entry.yaml_path), confined=data_folders is not None))
            else:
                specs.append(member)  # a group or a Python task: the harness builds it as it is
    built = []
    with sandboxed_templates():  # the harness reads a task's data and renders its first document as it builds it
        for spec in specs:
            name = spec["task"] if isinstance(spec, dict) else spec
            plan = first_rows_plan(spec, limit, num_fewshot) if isinstance(spec, dict) else None
            guard = data_inside(data_folders) if data_folders is not None else contextlib.nullcontext()
            try:
                with first_rows_only(plan), guard:  # in this order: the guard checks a read before it is made
                    loaded = manager.load([spec])
            except TfcliError as exc:  # a data path outside the task folders, a record past its limit
                raise TfcliError(f"task {name}: {exc.message}", hint=exc.hint) from None
            except jinja2.exceptions.SecurityError as exc:  # a template the sandbox stopped
                raise template_refused(name, exc) from None
            except Exception as exc:  # datasets' errors for a missing or malformed file, offline misses, bad fields
                raise _data_error(name, spec, exc) from None
            built.extend(loaded["tasks"].values() if isinstance(spec, dict) else [spec])
    return built


def check_tasks(tasks: list, num_fewshot: int | None, limit: int | None) -> None:
    """Each task can make its prompts: every document it will read has the fields its templates use, and
    it has enough examples for the few-shot count asked."""
    with sandboxed_templates():
        _check_tasks(tasks, num_fewshot, limit)


def _check_tasks(tasks: list, num_fewshot: int | None, limit: int | None) -> None:
    for task in tasks:
        if isinstance(task, str):
            continue
        name = task.config.task
        shots = num_fewshot if num_fewshot is not None else (task.config.num_fewshot or 0)
        if shots:
            pool = task.fewshot_docs()
            available = len(pool) if pool is not None else 0
            if task.fewshot_cfg.split == task.config.test_split:
                available -= 1  # the document asked about is never its own example
            if shots > available:
                raise TfcliError(
                    f"task {name} has {max(available, 0):,} examples for few-shot prompts, fewer than --num-fewshot {shots}",
                    hint=f"use --num-fewshot {max(available, 0)} or less, or give the task a larger fewshot_split",
                )
        docs = list(task.eval_docs)[: limit or None]
        if not docs:
            raise TfcliError(f"task {name} has no documents to evaluate", hint="check its test_split and data_files")
        pools = [("evaluated", docs)]
        if shots:
            pools.append(("few-shot", list(task.fewshot_docs())))
        fields = _template_fields(task.config)
        for kind, pool in pools:
            for number, doc in enumerate(pool, start=1):
                absent = [f for f in fields if f in doc and doc[f] is None]  # the JSON reader fills a missing field with null
                if absent:
                    raise TfcliError(
                        f"task {name}: {kind} document {number} has no {absent[0]!r}", hint="every record needs the fields the task's templates use"
                    )
                try:
                    task.doc_to_text(doc)
                    task.doc_to_target(doc)
                    if task.config.output_type == "multiple_choice":
                        task.doc_to_choice(doc)
                except jinja2.exceptions.SecurityError as exc:
                    raise template_refused(name, exc) from None
                except Exception as exc:  # jinja2's UndefinedError for a missing field, a KeyError, a TypeError
                    raise TfcliError(
                        f"task {name}: {kind} document {number} cannot be read: {_first_line(exc)}",
                        hint="every record needs the fields the task's templates use",
                    ) from None


def _template_fields(config) -> set[str]:
    """The document fields the task's prompt, target and choices read: a field named alone, or the variables
    of a Jinja template. Example: "{{context}} {{choices[0]}}" -> {"context", "choices"}."""
    environment = jinja2.Environment()
    fields: set[str] = set()
    for template in (config.doc_to_text, config.doc_to_target, config.doc_to_choice):
        if not isinstance(template, str):
            continue
        if "{{" not in template and "{%" not in template:
            fields.add(template)
            continue
        try:
            fields |= jinja2.meta.find_undeclared_variables(environment.parse(template))
        except jinja2.TemplateSyntaxError as exc:
            raise TfcliError(f"task {config.task}: the template {template!r} is not valid Jinja ({exc.message})") from None
    return fields


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _data_error(name: str, spec: Any, exc: BaseException) -> TfcliError:
    """The one line for a task whose data did not load: for a dataset on the Hub that this machine has not
    cached (offline, datasets says "Couldn't reach 'org/name' on the Hub"), where it is and how to get it."""
    text = str(exc)
    hub = _HUB_MISS.search(text)
    if hub is None:
        return TfcliError(f"task {name} cannot load its data: {_first_line(exc)}", hint=_data_hint(exc))
    path = hub.group(1) or hub.group(2)
    config = spec.get("dataset_name") if isinstance(spec, dict) and spec.get("dataset_path") == path else None
    arguments = ", ".join(repr(a) for a in (path, config) if a is not None)
    return TfcliError(
        f"task {name}: its dataset {path} is on the Hugging Face Hub and not in this machine's cache (tfcli eval runs offline)",
        hint=f'download it once with network: python -c "import datasets; datasets.load_dataset({arguments})", then run tfcli eval again',
    )


def _data_hint(exc: BaseException) -> str:
    text = str(exc)
    if "offline" in text.lower() or "couldn't reach" in text.lower() or "connection" in text.lower():
        return "tfcli eval runs offline: use a task with local data (dataset_path: json, dataset_kwargs.data_files)"
    return "check the task's dataset_path and data_files"
