"""The `tfcli` entry point: the command tree, global options, and how errors and Ctrl-C end a run."""

from __future__ import annotations

import contextlib
import errno
import sys
from typing import Annotated

import typer

from tfcli import __version__
from tfcli.cli import bench, circuits, embeddings, evaluate, generate, hf, info, quantize, quickstart, serve, tokenize, train
from tfcli.cli import inspect as inspect_command
from tfcli.cli.common import Typer, show_loader_notes, state
from tfcli.cli.common import print_error as _print_error
from tfcli.cli.features import inspect_features

app = Typer(
    name="tfcli",
    help="From raw text to a trained transformer, and a look inside it.\n\nStart with `tfcli quickstart`, which runs the whole chain on sample_data/.",
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=True,  # --install-completion, --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(tokenize.app, name="tokenize")
app.add_typer(train.app, name="train")
app.add_typer(bench.app, name="bench")
app.command("generate")(generate.generate)
app.command("eval")(evaluate.evaluate)
app.command("info")(info.info)
app.command("export")(hf.export)
app.command("import")(hf.import_)
app.command("quantize")(quantize.quantize)
app.command("quickstart")(quickstart.quickstart)
app.command("serve")(serve.serve)
app.command("inspect-attention")(inspect_command.inspect_attention)
app.command("inspect-logits")(circuits.inspect_logits)
app.command("inspect-ablate")(circuits.inspect_ablate)
app.command("inspect-patch")(circuits.inspect_patch)
app.command("inspect-embeddings")(embeddings.inspect_embeddings)
app.command("inspect-features")(inspect_features)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tfcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True)] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback when a command fails (also TFCLI_DEBUG=1).")] = False,
) -> None:
    if debug:
        state.debug = True
    show_loader_notes()


def main(argv: list[str] | None = None) -> None:
    """Run the command line; exit 0 on success, 1 when `tfcli info` finds a problem in a run, 2 on a user
    error or one the machine raised (a full disk, a read-only folder), 130 on Ctrl-C, 143 on SIGTERM."""
    args = sys.argv[1:] if argv is None else list(argv)
    with _sigterm_unwinds(), _stdout_passes_undecodable_names():
        _run(args)


@contextlib.contextmanager
def _stdout_passes_undecodable_names():
    """A file name that is not UTF-8 reaches Python holding lone surrogates (its bytes, escaped); printed in a
    table or a line, it goes out as the bytes it was, as `ls` prints it, where a strict UTF-8 stdout would
    raise. JSON escapes them itself (tfcli.jsontext), so --json stays UTF-8."""
    stream = sys.stdout
    if getattr(stream, "errors", None) != "strict" or not hasattr(stream, "reconfigure"):
        yield
        return
    try:
        stream.reconfigure(errors="surrogateescape")
    except (AttributeError, ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="strict")


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM ends a command the way Ctrl-C does, through its `finally` blocks (a bench removes its scratch
    folder, a failed start its empty -o), with exit code 143. Training saves a checkpoint first, with its
    own handler."""
    import signal

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# What the machine, not the command, got wrong: a full disk or quota, a read-only or failing file system, a
# folder without permission, a name too long. Any command that meets one ends with one line, exit 2; the
# writers remove their temp files on the way out, so what was on disk stays as it was.
_ENVIRONMENT_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG}


def _stay_silent(message: str) -> None:
    pass


def _run(args: list[str]) -> None:
    from tfcli.cli.common import StdoutClosed, point_at_devnull
    from tfcli.cli.torchrun import refuse_what_torchrun_cannot_run, this_rank_speaks
    from tfcli.errors import Interrupted, TfcliError

    print_error = _print_error if this_rank_speaks() else _stay_silent  # under torchrun, rank 0 speaks for all
    try:
        refuse_what_torchrun_cannot_run(args)
        code = app(args=args, prog_name="tfcli", standalone_mode=False)
    except TfcliError as exc:
        if state.debug:
            import traceback

            traceback.print_exc()
        if getattr(exc, "rank_specific", False):  # what this rank alone met (a peer lost): every rank says it
            _print_error(str(exc))
        else:
            print_error(str(exc))
        sys.exit(2)
    except Interrupted as exc:
        from rich.text import Text

        from tfcli.cli.common import stderr_console

        if this_rank_speaks():
            stderr_console().print(Text(exc.message, style="yellow"), soft_wrap=True)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        print_error("interrupted")
        sys.exit(130)
    except typer.Exit as exc:
        if exc.exit_code == 130:  # typer turns Ctrl-C into Exit(130)
            print_error("interrupted")
        sys.exit(exc.exit_code)
    except (BrokenPipeError, StdoutClosed):
        point_at_devnull(sys.stdout)
        sys.exit(0)
    except OSError as exc:
        if exc.errno not in _ENVIRONMENT_ERRORS:
            raise
        if state.debug:
            import traceback

            traceback.print_exc()
        from tfcli.fsutil import describe_write_error

        where = f" ({exc.filename})" if exc.filename else ""
        print_error(f"{describe_write_error(exc)}{where}; check the free space and the permissions of the folders it writes to")
        sys.exit(2)
    except Exception as exc:
        # click's usage errors (typer vendors click from 0.26 on, so match the shape, not the class)
        if not (hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int)):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # a group named without a command: its help, as --help prints it
            print(exc.format_message())
            sys.exit(0)
        message = exc.format_message().rstrip(".")
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "tfcli"
        print_error(f"{message}; see `{where} --help`")
        sys.exit(exc.exit_code)
    code = code if isinstance(code, int) else 0
    if code == 130:  # typer turns Ctrl-C into Exit(130) and, here, returns the code
        print_error("interrupted")
    sys.exit(code)
