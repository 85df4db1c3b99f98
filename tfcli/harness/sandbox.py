"""Task templates (doc_to_text, doc_to_target, doc_to_choice, description, ...) rendered in Jinja's immutable
sandbox, with their output bounded: a task file is data, and its templates may read a document's fields but
never reach Python (`cycler.__init__.__globals__.os`) or fill memory (`context * 100000000`).

`sandboxed_templates()` is the one place tfcli reaches into lm-eval's internals."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tfcli.errors import TfcliError

TEMPLATE_OUTPUT_CHARS = 16 << 20  # what one task template may render: a prompt, a target or a list of choices
SANDBOX_HINT = "task templates run in Jinja's sandbox: they may read the document's fields, not Python's internals"
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\d*)(?:\.(\d*))?")  # '%-12.3f': width 12, precision 3
_FIELD_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")  # '{:>12}': the spec after the colon
_WIDTH_FROM_ARGUMENTS = re.compile(r"%[^a-zA-Z%]*\*|\{[^{}]*:[^{}]*\{")  # '%*d' % (n, 1), '{:{}}'.format(x, n)
_PADDING = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})  # str methods whose number is a width


class TemplateRefused(SecurityError):
    """A template that asked for more than a task template may: a huge repetition, power, width or output."""


def _too_large(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > TEMPLATE_OUTPUT_CHARS


def _widths(fmt: str) -> Iterator[str]:
    """The widths and precisions a format writes. Example: "%5d of {:>12.3f}" -> "5", "12", "3" """
    for match in _PERCENT_SPEC.finditer(fmt):
        yield from (digits for digits in match.groups() if digits)
    for match in _FIELD_SPEC.finditer(fmt):
        yield from re.findall(r"\d+", match.group(1))


def _check_format(fmt: Any, args: Any) -> None:
    """A %-format or str.format whose width, written in it or taken from its arguments, would build a huge string."""
    if not isinstance(fmt, str):
        return
    values = args if isinstance(args, (tuple, list)) else (args,)
    written = any(len(digits) > 9 or int(digits) > TEMPLATE_OUTPUT_CHARS for digits in _widths(fmt))
    if written or (_WIDTH_FROM_ARGUMENTS.search(fmt) and any(_too_large(v) for v in values)):
        raise TemplateRefused(f"a format that would write more than {TEMPLATE_OUTPUT_CHARS:,} characters")


class _BoundedTemplate(jinja2.Template):
    """A template whose render stops once its output passes TEMPLATE_OUTPUT_CHARS, piece by piece."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        pieces, size = [], 0
        for piece in self.generate(*args, **kwargs):
            size += len(piece)
            if size > TEMPLATE_OUTPUT_CHARS:
                raise TemplateRefused(f"the template renders more than {TEMPLATE_OUTPUT_CHARS:,} characters")
            pieces.append(piece)
        return "".join(pieces)


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with `*`, `**`, `%` and padding calls checked before they run: "a" * 4000000000,
    10 ** 10 ** 9 or x.center(10 ** 9) would take gigabytes or hours before the output cap could see them."""

    template_class = _BoundedTemplate
    intercepted_binops = frozenset(["*", "**", "%"])

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            count, items = (left, right) if isinstance(left, int) else (right, left)
            if isinstance(count, int) and isinstance(items, (str, list, tuple)) and count * len(items) > TEMPLATE_OUTPUT_CHARS:
                raise TemplateRefused(f"a repetition of {count:,} x {len(items):,} items, more than {TEMPLATE_OUTPUT_CHARS:,}")
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1024 and isinstance(left, int) and abs(left) > 1:
            raise TemplateRefused(f"a power {left} ** {right} too large to compute")
        if operator == "%":
            _check_format(left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # jinja2's names: a template's keyword may be `context`
        target = getattr(__obj, "__wrapped__", __obj)  # the sandbox hands str.format out wrapped
        name, owner = getattr(target, "__name__", None), getattr(target, "__self__", None)
        if isinstance(owner, str) and name in _PADDING and any(_too_large(v) for v in (*args, *kwargs.values())):
            raise TemplateRefused(f"{name}() to a width over {TEMPLATE_OUTPUT_CHARS:,}")
        if isinstance(owner, str) and name in ("format", "format_map"):
            _check_format(owner, (*args, *kwargs.values()))
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, (str, list, tuple)) and len(result) > TEMPLATE_OUTPUT_CHARS:  # replace(), join(): one step, then no more
            raise TemplateRefused(f"a call that built {len(result):,} items, more than {TEMPLATE_OUTPUT_CHARS:,}")
        return result


def sandbox_environment(like: jinja2.Environment) -> jinja2.Environment:
    """A bounded sandbox set up as `like` is (its undefined, newline handling and extra filters, such as
    lm-eval's regex_replace)."""
    env = _BoundedSandbox(loader=like.loader, undefined=like.undefined, keep_trailing_newline=like.keep_trailing_newline)
    for name, function in like.filters.items():
        env.filters.setdefault(name, function)
    for name, function in like.tests.items():
        env.tests.setdefault(name, function)
    plain_format = env.filters["format"]

    def checked_format(value, *args, **kwargs):
        _check_format(value, args)
        return plain_format(value, *args, **kwargs)

    env.filters["format"] = checked_format
    return env


@contextlib.contextmanager
def sandboxed_templates() -> Iterator[None]:
    """While it lasts, the harness renders every task template in the bounded sandbox; a refused template is
    a TfcliError. lm-eval renders doc_to_text and the rest with `lm_eval.utils.apply_template`, which reads
    the module's `env` (a plain, unsandboxed jinja2 Environment) on each call: that one name is swapped for
    the sandbox here and put back afterwards. Nested uses are fine (each restores what it found)."""
    import lm_eval.utils

    original = lm_eval.utils.env
    lm_eval.utils.env = original if isinstance(original, _BoundedSandbox) else sandbox_environment(original)
    try:
        yield
    except SecurityError as exc:
        raise template_refused(None, exc) from None
    finally:
        lm_eval.utils.env = original


def template_refused(task: str | None, exc: SecurityError) -> TfcliError:
    """The one line for a template the sandbox stopped."""
    where = f"task {task}: a template" if task else "a task template"
    return TfcliError(f"{where} was refused ({exc})", hint=SANDBOX_HINT)
