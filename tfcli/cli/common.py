"""Shared pieces of the command line: consoles, the error line, progress bars (the options more than one command
takes are in options.py)."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

DEBUG_ENV = "TFCLI_DEBUG"


class _State:
    debug: bool = os.environ.get(DEBUG_ENV, "") not in ("", "0")


state = _State()


class Command(TyperCommand):
    """A command whose arguments read `<text>` in the usage line and the Arguments list, in the style of the
    options' `<path>` (typer writes `{text}` in one place and `text` in the other)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "argument" and param.metavar is None:
                param.metavar = f"<{param.name}>"

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                pieces.extend(param.get_usage_pieces(ctx))
                continue
            piece = f"{param.metavar}{'...' if param.nargs != 1 else ''}"
            pieces.append(piece if param.required else f"[{piece}]")
        return pieces


class Typer(typer.Typer):
    """typer.Typer whose commands are `Command`s."""

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or Command, **kwargs)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 file', '2 files', '1,024 files'; counted(2, "process", "processes") -> '2 processes'."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


PIPED_WIDTH = 200  # columns when output goes to a file or a pipe and COLUMNS is not set (rich would take 80)


def _piped_width(stream) -> int | None:
    """A line that wraps at 80 columns in a file is two lines to grep; a terminal keeps its own width."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return None if terminal or os.environ.get("COLUMNS") else PIPED_WIDTH


def stderr_console() -> Console:
    """Status, progress and errors go to stderr, so stdout carries only data (e.g. --json)."""
    from rich.console import Console

    console = Console(stderr=True, highlight=False, width=_piped_width(sys.stderr))
    # Status lines are for whoever watches; when the reader of stderr goes away (`2>&1 | head`), the work
    # goes on without them, rather than dying halfway through (a training run, say).
    console.on_broken_pipe = lambda: _stop_writing_stderr(console)
    return console


def _stop_writing_stderr(console: Console) -> None:
    console.quiet = True
    point_at_devnull(sys.stderr)


def point_at_devnull(stream) -> None:
    """Send what is still written to a stream whose reader went away to /dev/null (the interpreter's last
    flush included), so it never meets the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def stdout_console() -> Console:
    from rich.console import Console

    console = Console(highlight=False, width=_piped_width(sys.stdout))
    # A reader that stops early (`| head`) is no failure: rich would exit 1, the CLI exits 0 (see app.main).
    console.on_broken_pipe = _raise_broken_pipe
    return console


class StdoutClosed(Exception):
    """The reader of stdout went away (`| head`). Not an OSError, which click would turn into exit 1: the
    CLI exits 0 (see app._run)."""


def _raise_broken_pipe() -> None:
    raise StdoutClosed


def write_stdout(text: str) -> None:
    """Text to stdout, flushed (streamed text, JSON)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise StdoutClosed from None


_BIDI_CONTROLS = set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A)) | {0x200E, 0x200F, 0x061C}


def terminal_safe(text: str) -> str:
    """Generated text shown on a terminal: control characters (other than newline and tab) and bidi
    overrides are escaped, so a model can never send the terminal an escape sequence. Pipes get the text as is.

    Example: "a\\x1b[2Jb\\n" -> "a\\\\x1b[2Jb\\n"
    """
    out = []
    for ch in text:
        code = ord(ch)
        if (code < 0x20 and ch not in "\n\t") or 0x7F <= code < 0xA0 or code in _BIDI_CONTROLS:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


class TextWriter:
    """Text to stdout, exactly as made when piped, control characters escaped on a terminal."""

    def __init__(self) -> None:
        self.terminal = sys.stdout.isatty()

    def write(self, text: str) -> None:
        write_stdout(terminal_safe(text) if self.terminal else text)


def at_least(minimum: int, **options: int | None) -> None:
    """Refuse an option below `minimum` in tfcli's words (not click's range message); None is "not given".

    Example: at_least(1, max_batches=-1) raises TfcliError("--max-batches must be at least 1, not -1")
    """
    from tfcli.errors import TfcliError

    for name, value in options.items():
        if value is not None and value < minimum:
            raise TfcliError(f"--{name.replace('_', '-')} must be at least {minimum}, not {value}")


def require_utf8(text: str | None, what: str, file_option: str | None = None) -> None:
    """Text from the command line that was not UTF-8 arrives holding lone surrogates (Python's escape for
    the bytes it could not decode); refuse it, as a file that is not UTF-8 is refused."""
    from tfcli.errors import TfcliError

    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        hint = f"pass it in UTF-8, or in a UTF-8 file with {file_option}" if file_option else "pass it in UTF-8"
        raise TfcliError(f"{what} is not UTF-8 text (character {exc.start + 1})", hint=hint) from exc


def print_error(message: str) -> None:
    """One red line on stderr. The message is data: rich markup in it is printed, not interpreted."""
    from rich.text import Text

    stderr_console().print(Text(f"error: {message}", style="bold red"), soft_wrap=True)


def show_loader_notes() -> None:
    """Print the loader's notes (the `tfcli.loader` logger: a quantized run dequantized on load, ...) as one dim
    line each on stderr, for every command that loads a run; installed once by the app's callback."""
    logger = logging.getLogger("tfcli.loader")
    if any(isinstance(handler, _NoteLine) for handler in logger.handlers):
        return
    logger.addHandler(_NoteLine())
    logger.propagate = False


class _NoteLine(logging.Handler):
    """A logging handler that writes a record as `note: ...`, dim, on stderr (the console of the moment)."""

    def emit(self, record: logging.LogRecord) -> None:
        from rich.text import Text

        stderr_console().print(Text(f"note: {record.getMessage()}", style="dim"), soft_wrap=True)


def print_table(console: Console, table: Any) -> None:
    """Print a rich table (or any renderable) without the spaces rich pads each line with to the table's
    width: a table written to a file or a pipe has no trailing whitespace, and a terminal shows the same."""
    from rich.segment import Segment, Segments

    out: list[Segment] = []
    for line in console.render_lines(table, console.options, pad=False):
        while line and not line[-1].control and not line[-1].text.rstrip(" "):
            line.pop()
        if line and not line[-1].control:
            last = line[-1]
            line[-1] = Segment(last.text.rstrip(" "), last.style, last.control)
        out.extend(line)
        out.append(Segment.line())
    console.print(Segments(out), end="")


def print_json(data: Any) -> None:
    from tfcli.jsontext import dumps_json

    write_stdout(dumps_json(data, indent=2) + "\n")


def make_progress(console: Console, *, tokens: bool = False) -> Progress:
    """A progress bar over bytes: percentage, MB/s (and tokens/s), elapsed and remaining time.

    Shown on a terminal only: in a log or a pipe it would be noise.
    """
    from rich.progress import (
        BarColumn,
        Progress,
        ProgressColumn,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def __init__(self, field: str, unit: str, scale: float) -> None:
            super().__init__()
            self.field, self.unit, self.scale = field, unit, scale

        def render(self, task: Any) -> Text:
            elapsed = task.elapsed or 0.0
            amount = task.completed if self.field == "completed" else task.fields.get(self.field, 0)
            if elapsed <= 0 or not amount:
                return Text(f"-- {self.unit}", style="progress.data.speed")
            return Text(f"{amount / elapsed / self.scale:,.1f} {self.unit}", style="progress.data.speed")

    columns: list[Any] = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        RateColumn("completed", "MB/s", 1e6),
    ]
    if tokens:
        columns.append(RateColumn("tokens", "k tokens/s", 1e3))
    columns += [TimeElapsedColumn(), TimeRemainingColumn()]
    return Progress(*columns, console=console, transient=False, disable=not console.is_terminal)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} GB"
