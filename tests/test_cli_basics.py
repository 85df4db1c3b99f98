"""The command line as a whole: start-up cost, --version, help texts, errors, exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.helpers import heavy_imports_of

COMMANDS = [
    ["tokenize", "train"],
    ["tokenize", "encode"],
    ["tokenize", "show"],
    ["tokenize", "trace"],
    ["quickstart"],
    ["bench", "tokenize"],
    ["tokenize"],
    ["train"],
    ["bench"],
]


def _command_tree() -> list[tuple[list[str], object]]:
    """Every command and group under `tfcli` (its words after `tfcli`), with its click command."""
    import typer

    from tfcli.cli.app import app

    found = []

    def walk(command, path):
        if path:
            found.append((path, command))
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


TREE = _command_tree()


@pytest.mark.parametrize("args", [["--help"], ["tokenize", "--help"], ["tokenize", "train", "--help"]])
def test_help_does_not_import_torch_or_tokenizers(args):
    assert heavy_imports_of(args, ("torch", "tokenizers", "numpy", "pydantic", "pyarrow", "tiktoken", "zstandard")) == []


def test_version_and_python_dash_m():
    from tfcli import __version__

    done = subprocess.run([sys.executable, "-m", "tfcli", "--version"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0
    assert done.stdout.strip() == f"tfcli {__version__}"


@pytest.mark.parametrize("signum, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_while_the_command_line_is_still_importing_ends_it_without_a_traceback(signum, code):
    sends_it_on_import = (
        "import os, signal, sys\n"
        "class Finder:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'tfcli.cli.app':\n"
        f"            os.kill(os.getpid(), signal.{signum})\n"
        "        return None\n"
        "sys.meta_path.insert(0, Finder())\n"
        "from tfcli.__main__ import main\n"
        "sys.argv = ['tfcli', '--version']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", sends_it_on_import], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == code and "Traceback" not in done.stderr and "tfcli" not in done.stdout, done.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_help_has_an_example(cli, command):
    result = cli(*command, "--help")
    assert result.code == 0
    assert "Example: tfcli " + command[0] in " ".join(result.stdout.split())


@pytest.mark.parametrize("path, command", TREE, ids=[" ".join(p) for p, _ in TREE])
def test_each_example_is_one_line_that_parses(cli, monkeypatch, path, command):
    """The example in the help is printed unwrapped, even at 80 columns, and is a command line tfcli accepts."""
    import shlex

    examples = [line.strip() for line in command.help.splitlines() if line.strip().startswith("Example: tfcli ")]
    assert len(examples) == 1, command.help
    monkeypatch.setenv("COLUMNS", "80")
    shown = cli(*path, "--help")
    assert shown.code == 0 and examples[0] in [line.strip() for line in shown.stdout.splitlines()]
    words = shlex.split(examples[0][len("Example: ") :])
    assert words[: 1 + len(path)] == ["tfcli", *path]
    parsed = cli(*words[1:], "--help")  # parsing stops at --help: an unknown option or a stray argument still fails
    assert parsed.code == 0, parsed.stderr
    assert parsed.stdout.startswith(f"Usage: tfcli {' '.join(words[1 : 1 + len(path)])}")


@pytest.mark.parametrize("path, command", [(p, c) for p, c in TREE if not hasattr(c, "commands")], ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_arguments_read_like_the_options_in_usage_and_help(cli, path, command):
    usage = cli(*path, "--help").stdout
    first = usage.splitlines()[0]
    assert "{" not in first
    for param in command.params:
        if param.param_type_name == "argument":
            assert f"<{param.name}>" in first  # `<text>`, as the options read `<path>`
            assert f"  <{param.name}>  " in usage  # the same in the Arguments list


def test_shell_completion_is_on_and_does_not_import_torch(cli, monkeypatch):
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")  # the shell named, not looked up: no terminal in CI
    shown = cli("--show-completion", "bash")
    assert shown.code == 0 and "_TFCLI_COMPLETE=complete_bash" in shown.stdout and "complete -o default -F" in shown.stdout
    assert "--install-completion" in cli("--help").stdout
    code = (
        "import sys\n"
        "from tfcli.cli.app import main\n"
        "try:\n"
        "    main([])\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "print('HEAVY=' + ','.join(m for m in ('torch', 'tokenizers', 'numpy') if m in sys.modules))\n"
    )
    env = {**os.environ, "_TFCLI_COMPLETE": "complete_bash", "COMP_WORDS": "tfcli tokenize sh", "COMP_CWORD": "2"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["show", "HEAVY="]


def test_tables_have_no_trailing_spaces(cli, tmp_path, tiny_corpus, trained_tokenizer):
    from tfcli.checkpoint import save_checkpoint
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    tokenizer = TextTokenizer.load(trained_tokenizer)
    save_checkpoint(tmp_path / "run", Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layers=1, n_heads=2, d_model=16)), tokenizer)
    outputs = [
        cli("tokenize", "train", tiny_corpus, "-o", tmp_path / "tok", "--vocab-size", "300"),
        cli("tokenize", "encode", tiny_corpus, "-t", tmp_path / "tok", "-o", tmp_path / "shards"),
        cli("info", tmp_path / "run"),
        cli("eval", tmp_path / "run", "--data", tiny_corpus, "--max-batches", "1"),
    ]
    for result in outputs:
        assert result.code == 0, result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) >= 4 and all(line == line.rstrip() for line in lines), [line for line in lines if line != line.rstrip()]


def test_usage_error_is_one_line_exit_2(cli):
    result = cli("tokenize", "train", "x.txt", "--vocab-size", "lots", "-o", "out")
    assert result.code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "--vocab-size" in lines[0] and "--help" in lines[0]


@pytest.mark.parametrize(
    "args, line",
    [
        (["eval", "RUN", "--data", "DATA", "--max-batches", "-1"], "error: --max-batches must be at least 1, not -1"),
        (["eval", "RUN", "--data", "DATA", "--batch-size", "0"], "error: --batch-size must be at least 1, not 0"),
        (["quickstart", "--steps", "0"], "error: --steps must be at least 1, not 0"),
        (["bench", "train", "--repeat", "0"], "error: --repeat must be at least 1, not 0"),
    ],
)
def test_a_number_out_of_range_reads_like_every_tfcli_error(cli, tmp_path, args, line):
    result = cli(*[str(tmp_path / a) if a in ("RUN", "DATA") else a for a in args])
    assert result.code == 2 and result.stderr == line + "\n"  # not click's "Invalid value ...: not in the range x>=1"


def test_user_error_is_one_line_without_traceback(cli, tmp_path):
    result = cli("tokenize", "train", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "out"))
    assert result.code == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'missing.txt'} does not exist; check the path"
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback(cli, tmp_path):
    result = cli("--debug", "tokenize", "train", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "out"))
    assert result.code == 2
    assert "Traceback" in result.stderr and "TfcliError" in result.stderr


def test_error_text_is_not_markup(cli, tmp_path):
    result = cli("tokenize", "train", str(tmp_path / "[bold]x[/bold].txt"), "-o", str(tmp_path / "out"))
    assert result.code == 2
    assert "[bold]x[/bold].txt" in result.stderr


def test_ctrl_c_exits_130(cli, monkeypatch):
    import tfcli.tokenizer.trace as trace

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trace, "bpe_trace", interrupted)
    result = cli("tokenize", "trace", "a b")
    assert result.code == 130
    assert "interrupted" in result.stderr


def _into_a_closed_pipe(*commands: list[str]) -> list[tuple[int, str]]:
    """Run each `tfcli ARGS...` (all at once) with stdout a pipe that nobody reads, so every write to it fails
    with EPIPE; returns each one's exit code and stderr."""
    processes = []
    for args in commands:
        read_end, write_end = os.pipe()
        os.close(read_end)
        processes.append(subprocess.Popen([sys.executable, "-m", "tfcli", *args], stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=REPO))
        os.close(write_end)
    done = []
    for process in processes:
        _, err = process.communicate()
        done.append((process.returncode, err))
    return done


def test_a_reader_that_stops_early_is_not_an_error():
    """`tfcli ... | head`: the pipe closes before the table is printed; rich alone would exit 1."""
    ((code, err),) = _into_a_closed_pipe(["tokenize", "trace", "a sailor went to sea sea sea " * 20, "--merges", "30"])
    assert code == 0, err
    assert "Traceback" not in err


def test_a_reader_that_stops_early_is_not_an_error_for_streamed_text(tmp_path, trained_tokenizer):
    """`tfcli generate ... | head -c 20`: the streamed text meets the closed pipe, not rich."""
    from tfcli.checkpoint import save_checkpoint
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    tokenizer = TextTokenizer.load(trained_tokenizer)
    save_checkpoint(tmp_path / "run", Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layers=1, n_heads=2, d_model=16)), tokenizer)
    generate = ["generate", str(tmp_path / "run"), "-p", "The fox", "-n", "40", "--ignore-eos"]
    for code, err in _into_a_closed_pipe(generate, [*generate, "--json"]):  # text and JSON, side by side
        assert code == 0, err
        assert "Traceback" not in err and "Exception ignored" not in err


@pytest.mark.parametrize("group", [[], ["train"], ["tokenize"], ["bench"]])
def test_a_group_without_a_command_shows_its_help(cli, group):
    result = cli(*group)
    assert result.code == 0 and result.stdout.startswith("Usage: tfcli") and "Commands" in result.stdout
    assert "error" not in result.stderr
