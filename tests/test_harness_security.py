"""`tfcli eval --tasks --include-path DIR`: a task folder is data. Each hostile folder here would create a
marker file (or print a secret) if its code ran or its data path were followed; each is refused in one line,
exit 2, with nothing done. With --trust-remote-code a folder's own functions run, as lm-eval runs them."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import lm_eval  # noqa: F401  CI installs the test extra, which holds the harness: missing, these tests fail
else:
    pytest.importorskip("lm_eval", reason="could not import lm_eval: the eval extra, pip install 'tfcli[eval]'")

RECORDS = [{"question": "The cat sat on the", "choices": ["mat", "sky"], "label": 0}, {"question": "A red", "choices": ["ball", "run"], "label": 0}]
SECRET = "s3cret-do-not-print"
FIELDS = {  # a local multiple-choice task, each value as YAML text
    "task": "mine",
    "dataset_path": "json",
    "dataset_kwargs": "{data_files: {test: data.jsonl}}",
    "output_type": "multiple_choice",
    "test_split": "test",
    "doc_to_text": '"{{question}}"',
    "doc_to_choice": '"{{choices}}"',
    "doc_to_target": "label",
    "metric_list": "[{metric: acc, aggregation: mean, higher_is_better: true}]",  # one of the harness's own metrics: allowed
}


@pytest.fixture(scope="module")
def run(tmp_path_factory, trained_tokenizer) -> Path:
    """A tiny decoder run (untrained: these tests are about what runs, not about scores)."""
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    torch.manual_seed(0)
    tokenizer = TextTokenizer.load(trained_tokenizer)
    folder = tmp_path_factory.mktemp("security") / "run"
    save_checkpoint(folder, Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layers=1, n_heads=2, d_model=16)), tokenizer)
    return folder


def task_folder(folder: Path, name: str = "task.yaml", **changes: str | None) -> Path:
    """A task folder: data.jsonl and a task file of FIELDS with `changes` (YAML text; None drops a field)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    fields = {**FIELDS, **changes}
    (folder / name).write_text("".join(f"{key}: {value}\n" for key, value in fields.items() if value is not None), encoding="utf-8")
    return folder


def evil_module(folder: Path, marker: Path, name: str = "evil") -> None:
    """evil.py beside the task file: importing it, or calling its fn, creates `marker`."""
    (folder / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n\ndef fn(*args, **kwargs):\n    Path({str(marker)!r}).touch()\n    return args[0] if args else None\n",
        encoding="utf-8",
    )


def assert_refused(result, pattern: str) -> str:
    """Exit 2, nothing on stdout, one error line matching `pattern`, no traceback; returns the line."""
    assert result.code == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(pattern, errors[0]), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    return errors[0]


def evaluate(cli, run: Path, folder: Path, *extra):
    return cli("eval", run, "--tasks", "mine", "--include-path", folder, "--limit", "2", *extra)


@pytest.mark.parametrize("where", ["process_docs", "doc_to_text", "an included file", "class"])
def test_function_tags_are_refused_without_trust(run, cli, tmp_path, where):
    folder, marker = tmp_path / "tasks", tmp_path / "marker"
    if where == "an included file":  # lm-eval follows `include` to any file name, not only *.yaml
        task_folder(folder, name="_base", process_docs="!function evil.fn")
        (folder / "task.yaml").write_text("include: _base\ntask: mine\n", encoding="utf-8")
        tag = r"_base \(included by .*task.yaml\) holds `!function evil.fn`"
    elif where == "class":
        task_folder(folder, **{"class": "!function os.system"})
        (folder / "os.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\nsystem = print\n", encoding="utf-8")
        tag = r"task.yaml names a Python task class \(`class: !function os.system`\)"
    else:
        task_folder(folder, **{where: "!function evil.fn"})
        tag = r"task.yaml holds `!function evil.fn`"
    evil_module(folder, marker)
    line = assert_refused(evaluate(cli, run, folder), tag)
    assert "--trust-remote-code" in line
    assert not marker.exists()


def test_a_class_entry_and_an_outside_metric_are_refused(run, cli, tmp_path):
    """`class:` without a tag, and a metric that is a .py file (HF evaluate imports it), are code too."""
    folder, marker = tmp_path / "tasks", tmp_path / "marker"
    task_folder(folder, **{"class": "lm_eval.api.task.ConfigurableTask"})
    assert_refused(evaluate(cli, run, folder), r"task.yaml names a Python task class \(`class: lm_eval.api.task.ConfigurableTask`\).*--trust-remote-code")
    evil_module(folder, marker)
    task_folder(folder, metric_list=json.dumps([{"metric": str(folder / "evil.py"), "aggregation": "mean", "higher_is_better": True}]))
    assert_refused(evaluate(cli, run, folder), r"asks for the metric '.*', which is not one of the harness's own.*--trust-remote-code")
    assert not marker.exists()


@pytest.mark.parametrize("field, trust", [("doc_to_text", False), ("doc_to_text", True), ("description", False)])
def test_a_template_reaching_python_is_refused(run, cli, tmp_path, field, trust):
    """lm-eval's own Jinja environment would run this; the sandbox stops it, trusted folder or not, whether
    the template is rendered as the task loads (doc_to_text) or only as the harness writes prompts (description)."""
    marker = tmp_path / "marker"
    folder = task_folder(tmp_path / "tasks", **{field: json.dumps("{{ cycler.__init__.__globals__.os.system('touch " + str(marker) + "') }}")})
    result = evaluate(cli, run, folder, *(["--trust-remote-code"] if trust else []))
    assert_refused(result, r"(task mine: a|a task) template was refused \(access to attribute '__init__' of '\w+' object is unsafe.*sandbox")
    assert not marker.exists()


@pytest.mark.parametrize(
    "template, said",
    [
        ("{{ question * 100000000 }}", "a repetition of 100,000,000 x"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{{ question }}{% endfor %}{% endfor %}", "the template renders more than"),
        ("{{ question.center(1000000000) }}", r"center\(\) to a width over"),
        ("{{ '%0999999999d' % 1 }}", "a format that would write more than"),
    ],
)
def test_a_template_that_would_fill_memory_is_refused(run, cli, tmp_path, template, said):
    folder = task_folder(tmp_path / "tasks", doc_to_text=json.dumps(template))
    assert_refused(evaluate(cli, run, folder), f"task mine: a template was refused \\({said}")


def test_the_sandbox_is_put_back_after_a_run(run, cli, tmp_path):
    import datasets
    import lm_eval.utils

    env, load_dataset = lm_eval.utils.env, datasets.load_dataset
    result = evaluate(cli, run, task_folder(tmp_path / "tasks"), "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["n-samples"]["mine"]["effective"] == 2
    assert lm_eval.utils.env is env and datasets.load_dataset is load_dataset
    assert type(env).__name__ == "Environment"  # the harness's own, unsandboxed outside the run


@pytest.fixture
def secret(tmp_path) -> Path:
    """A file outside the task folder that the task must not read: records holding a secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "secret.jsonl"
    path.write_text("".join(json.dumps({**r, "question": SECRET}) + "\n" for r in RECORDS), encoding="utf-8")
    return path


@pytest.mark.parametrize("how", ["absolute", "dot-dot", "symlink", "symlinked folder", "data_dir", "glob"])
def test_data_outside_the_task_folder_is_refused(run, cli, tmp_path, secret, how):
    folder = task_folder(tmp_path / "tasks")
    if how == "absolute":
        kwargs = {"data_files": {"test": str(secret)}}
    elif how == "dot-dot":
        kwargs = {"data_files": {"test": "../outside/secret.jsonl"}}
    elif how == "symlink":
        (folder / "data.jsonl").unlink()
        (folder / "data.jsonl").symlink_to(secret)
        kwargs = {"data_files": {"test": "data.jsonl"}}
    elif how == "symlinked folder":
        (folder / "more").symlink_to(secret.parent)
        kwargs = {"data_files": {"test": "more/secret.jsonl"}}
    elif how == "data_dir":
        kwargs = {"data_dir": "../outside"}
    else:
        (folder / "sub").mkdir()
        (folder / "sub" / "x.jsonl").symlink_to(secret)
        kwargs = {"data_files": {"test": "sub/*.jsonl"}}
    task_folder(folder, dataset_kwargs=json.dumps(kwargs))
    result = evaluate(cli, run, folder)
    assert_refused(result, r"task mine: (data_files|data_dir) .* (is outside the task folder|a link outside the task folder).*--trust-remote-code")
    assert SECRET not in result.stdout + result.stderr


def test_a_group_reads_no_data_from_the_current_folder(run, cli, tmp_path, secret, monkeypatch):
    """A group's tasks are built by the harness itself, which reads a relative data_files from the current
    folder: there, a file outside the task folder."""
    folder = task_folder(tmp_path / "tasks", dataset_kwargs="{data_files: {test: secret.jsonl}}")
    (folder / "group.yaml").write_text("group: mygroup\ntask: [mine]\n", encoding="utf-8")
    monkeypatch.chdir(secret.parent)
    result = cli("eval", run, "--tasks", "mygroup", "--include-path", folder, "--limit", "2")
    assert_refused(result, r"task mygroup: data_files 'secret.jsonl' is outside the task folder")
    assert SECRET not in result.stdout + result.stderr


def test_an_include_outside_the_folder_is_refused(run, cli, tmp_path, secret):
    folder = task_folder(tmp_path / "tasks")
    (folder / "task.yaml").write_text(f"include: {secret.parent / 'base.yaml'}\n" + (folder / "task.yaml").read_text(), encoding="utf-8")
    (secret.parent / "base.yaml").write_text(f"description: {SECRET}\n", encoding="utf-8")
    result = evaluate(cli, run, folder)
    assert_refused(result, r"base.yaml \(included by .*task.yaml\) leads outside the task folder.*--trust-remote-code")
    assert SECRET not in result.stdout + result.stderr


def test_trust_remote_code_runs_the_folder_functions(run, cli, tmp_path):
    """The same folder: refused without the flag, and with it lm-eval imports evil.py and calls its function
    on the documents, as it would by itself."""
    folder, marker = tmp_path / "tasks", tmp_path / "marker"
    task_folder(folder, process_docs="!function evil.fn")
    evil_module(folder, marker)
    assert_refused(evaluate(cli, run, folder), "holds `!function evil.fn`")
    assert not marker.exists()
    result = evaluate(cli, run, folder, "--trust-remote-code", "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["n-samples"]["mine"]["effective"] == 2
    assert marker.exists()


def test_trust_remote_code_goes_with_tasks(run, cli):
    assert_refused(cli("eval", run, "--data", run, "--trust-remote-code"), "--trust-remote-code.* go with --tasks")
