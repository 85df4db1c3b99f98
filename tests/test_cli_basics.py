"""The command line as a whole: start-up cost, --version, help texts, errors, exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

COMMANDS = [
    ["tokenize", "train"], ["tokenize", "encode"], ["tokenize", "show"], ["tokenize", "trace"],
    ["quickstart"], ["bench", "tokenize"],
]


@pytest.mark.parametrize("args", [["--help"], ["tokenize", "--help"], ["tokenize", "train", "--help"]])
def test_help_does_not_import_torch_or_tokenizers(args):
    code = (
        "import sys\n"
        "from tfcli.cli.app import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "heavy = [m for m in ('torch', 'tokenizers', 'numpy', 'pydantic', 'pyarrow', 'tiktoken', 'zstandard') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "HEAVY="


def test_version_and_python_dash_m():
    from tfcli import __version__

    done = subprocess.run([sys.executable, "-m", "tfcli", "--version"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0
    assert done.stdout.strip() == f"tfcli {__version__}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_help_has_an_example(cli, command):
    result = cli(*command, "--help")
    assert result.code == 0
    assert "Example: tfcli " + command[0] in " ".join(result.stdout.split())


def test_usage_error_is_one_line_exit_2(cli):
    result = cli("tokenize", "train", "x.txt", "--vocab-size", "lots", "-o", "out")
    assert result.code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "--vocab-size" in lines[0] and "--help" in lines[0]


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


def test_a_reader_that_stops_early_is_not_an_error():
    """`tfcli ... | head`: the pipe closes before the table is printed; rich alone would exit 1."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: every write to the pipe fails with EPIPE
    done = subprocess.run([sys.executable, "-m", "tfcli", "tokenize", "trace", "a sailor went to sea sea sea " * 20, "--merges", "30"],
                          stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=REPO)
    os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_a_reader_that_stops_early_is_not_an_error_for_streamed_text(tmp_path, trained_tokenizer):
    """`tfcli generate ... | head -c 20`: the streamed text meets the closed pipe, not rich."""
    import os

    from tfcli.checkpoint import save_checkpoint
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    tokenizer = TextTokenizer.load(trained_tokenizer)
    save_checkpoint(tmp_path / "run", Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layers=1, n_heads=2,
                                                              d_model=16)), tokenizer)
    for extra in ([], ["--json"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        done = subprocess.run([sys.executable, "-m", "tfcli", "generate", str(tmp_path / "run"), "-p", "The fox", "-n", "40",
                               "--ignore-eos", *extra], stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=REPO)
        os.close(write_end)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


@pytest.mark.parametrize("group", [[], ["train"], ["tokenize"], ["bench"]])
def test_a_group_without_a_command_shows_its_help(cli, group):
    result = cli(*group)
    assert result.code == 0 and result.stdout.startswith("Usage: tfcli") and "Commands" in result.stdout
    assert "error" not in result.stderr
