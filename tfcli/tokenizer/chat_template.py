"""Chat templates: a conversation (system / user / assistant messages) rendered to text with the Jinja
template a run keeps in tokenizer_config.json (`chat_template`, as transformers reads it), then to ids,
with the ids the loss counts (the assistant's) marked.

The template runs in jinja2's immutable sandbox, set up as transformers sets it up (trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `tojson`, `strftime_now`, a pass-through `generation`
block), so `AutoTokenizer.from_pretrained(run).apply_chat_template(messages, tokenize=True)` gives the ids
`encode` gives. The rendered text is tokenized with special-token text read as the special tokens (the
template's markers); the text of a special token inside a message is refused, so no message can forge a
turn. Which ids are the assistant's is found by rendering the conversation prefix by prefix: the
assistant's text is what a message adds after the generation prompt, up to and including the end-of-turn
token; a token counts when any of its characters does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from tfcli.errors import TfcliError
from tfcli.limits import CHAT_TEMPLATE_OUTPUT
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.specials import CONFIG_KEYS, LOADED_ROLES

CHAT_ROLES = ("system", "user", "assistant")
TEMPLATE_KEY = "chat_template"  # tokenizer_config.json's key, as transformers names it
TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"
# ChatML, the format most chat models use: <|im_start|>role\n...<|im_end|>\n per message.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_PROBE = ("\u2063probe question\u2063", "\u2063probe answer\u2063")  # text no template changes


@dataclasses.dataclass(frozen=True)
class Message:
    role: str
    content: str

    def to_json(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclasses.dataclass
class EncodedChat:
    """A conversation's ids and, for each id, whether the loss counts it (an assistant's token)."""

    ids: list[int]
    trained: list[bool]


def template_source(config: dict[str, Any]) -> str | None:
    """The chat template a tokenizer_config.json holds: a string, or the "default" of a list of named
    templates (as some models ship them); None when it has none."""
    value = config.get(TEMPLATE_KEY)
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) and value.strip() else None


def _environment():
    class GenerationBlock(jinja2.ext.Extension):
        """transformers' `{% generation %}...{% endgeneration %}` marks assistant text; here it only renders."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise TemplateRaised(str(message))

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """The sandbox, with `*` and `**` checked before they run: "a" * 4000000000 or 10 ** 10 ** 9 would
        take gigabytes or hours before the output cap could see them."""

        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "*" and isinstance(right, int) and isinstance(left, (str, list, tuple)):
                left, right = right, left
            if operator == "*" and isinstance(left, int) and isinstance(right, (str, list, tuple)) and left * len(right) > CHAT_TEMPLATE_OUTPUT.value:
                raise TemplateLimit(f"a repetition of {left:,} x {len(right):,} items, more than {CHAT_TEMPLATE_OUTPUT.what} may hold")
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1024 and isinstance(left, int) and abs(left) > 1:
                raise TemplateLimit(f"a power {left} ** {right} too large to compute")
            return super().call_binop(context, operator, left, right)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


class TemplateRaised(Exception):
    """A template's own `raise_exception(...)`."""


class TemplateLimit(Exception):
    """A template that asked for more than a chat template may (see limits.CHAT_TEMPLATE_OUTPUT)."""


def _template_line(exc: BaseException) -> int | None:
    """The template line an error came from: jinja2 rewrites tracebacks so the template's frames carry its lines."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


@contextlib.contextmanager
def _special_text_read_as_specials(tokenizer: TextTokenizer) -> Iterator[None]:
    previous = tokenizer.hf.encode_special_tokens
    tokenizer.hf.encode_special_tokens = False
    try:
        yield
    finally:
        tokenizer.hf.encode_special_tokens = previous


class ChatTemplate:
    """A compiled chat template over a tokenizer. `where` names its origin in messages (a file, a run)."""

    def __init__(self, source: str, tokenizer: TextTokenizer, where: str, special_tokens: dict[str, str] | None = None) -> None:
        self.source, self.tokenizer, self.where = source, tokenizer, where
        if not source.strip():
            raise TfcliError(f"the chat template of {where} is empty", hint="write a template, or leave the option out for tfcli's default (ChatML)")
        try:
            self.compiled = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TfcliError(f"the chat template of {where} is not valid Jinja (template line {exc.lineno}: {exc.message})", hint="fix the template") from None
        except (RecursionError, MemoryError, OverflowError, ValueError) as exc:  # nesting too deep to compile, say
            raise TfcliError(f"the chat template of {where} cannot be compiled ({type(exc).__name__})", hint="fix the template") from None
        # the variables transformers passes besides the messages: bos_token, eos_token, ... by name
        self.variables = dict(special_tokens or {})

    @classmethod
    def for_tokenizer(cls, tokenizer: TextTokenizer, config: dict[str, Any], where: str) -> ChatTemplate | None:
        """The template a tokenizer_config.json (already read into `config`) holds, or None."""
        source = template_source(config)
        if source is None:
            return None
        names = {}
        for role in LOADED_ROLES:
            value = config.get(CONFIG_KEYS[role])
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                names[CONFIG_KEYS[role]] = value
        return cls(source, tokenizer, where, names)

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = False) -> str:
        cap = CHAT_TEMPLATE_OUTPUT.value
        pieces, size = [], 0
        try:  # piece by piece, so that output past the cap stops the template instead of filling memory
            for piece in self.compiled.generate(messages=[m.to_json() for m in messages], add_generation_prompt=add_generation_prompt, **self.variables):
                size += len(piece)
                if size > cap:
                    raise CHAT_TEMPLATE_OUTPUT.exceeded(f"the output of the chat template of {self.where}")
                pieces.append(piece)
        except TemplateRaised as exc:
            raise TfcliError(f"the chat template of {self.where} refused the conversation: {exc}") from None
        except TfcliError:
            raise
        except (jinja2.TemplateError, TemplateLimit, ArithmeticError, RecursionError, MemoryError, TypeError, ValueError, LookupError, AttributeError) as exc:
            line = _template_line(exc)
            at = f"template line {line}: " if line else ""
            what = "nests too deeply (a macro that calls itself?)" if isinstance(exc, RecursionError) else f"{type(exc).__name__}: {str(exc)[:200]}"
            raise TfcliError(f"the chat template of {self.where} failed to render ({at}{what})", hint="fix the template") from None
        return "".join(pieces)

    @cached_property
    def special_texts(self) -> list[str]:
        """The text of every special token, longest first."""
        added = self.tokenizer.hf.get_added_tokens_decoder().values()
        return sorted({t.content for t in added if t.special}, key=len, reverse=True)

    def check_content(self, messages: Sequence[Message]) -> None:
        """A message may not hold a special token's text: it would read as a control token (a forged turn)."""
        for number, message in enumerate(messages, start=1):
            for special in self.special_texts:
                if special in message.content:
                    raise TfcliError(
                        f"message {number} ({message.role}) holds the text of the special token {special!r}",
                        hint="remove it from the text; special tokens come from the chat template only",
                    )

    def _ids_and_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        with _special_text_read_as_specials(self.tokenizer):
            encoding = self.tokenizer.hf.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The ids of a conversation followed by the generation prompt (what the model continues)."""
        self.check_content(messages)
        return self._ids_and_offsets(self.render(messages, add_generation_prompt=True))[0]

    def encode(self, messages: Sequence[Message]) -> EncodedChat:
        """The conversation's ids, with the assistant's tokens (and their end-of-turn tokens) marked."""
        self.check_content(messages)
        full = self.render(messages)
        spans = list(self._assistant_spans(messages, full))
        ids, offsets = self._ids_and_offsets(full)
        # a token that straddles the start of a reply (" red" after "A:") carries the reply's first characters
        trained = [any(begin < end and finish > start for start, end in spans) for begin, finish in offsets]
        return EncodedChat(ids, trained)

    def _assistant_spans(self, messages: Sequence[Message], full: str) -> Iterator[tuple[int, int]]:
        """(start, end) characters of each assistant message's text in `full`: what rendering it adds to the
        conversation before it plus the generation prompt, cut after the end-of-turn token."""
        for k, message in enumerate(messages):
            if message.role != "assistant":
                continue
            before = self.render(messages[:k], add_generation_prompt=True)
            through = self.render(messages[: k + 1])
            if not (through.startswith(before) and full.startswith(through)):
                raise TfcliError(
                    f"the chat template of {self.where} does not render a conversation as the conversation before it plus one message, "
                    "so the assistant's tokens cannot be found",
                    hint="use a template that renders each message in turn (tfcli's default, ChatML, does)",
                )
            end = len(through)
            for marker in self.end_of_turn_texts:
                found = through.find(marker, len(before))
                if found >= 0:
                    end = min(end, found + len(marker))
            yield len(before), end

    @cached_property
    def end_of_turn_texts(self) -> tuple[str, ...]:
        """The special token that ends an assistant's turn: the first one the template writes after an
        assistant's text (ChatML's <|im_end|>); none when it writes none."""
        try:
            rendered = self.render([Message("user", _PROBE[0]), Message("assistant", _PROBE[1])])
        except TfcliError:
            return ()
        at = rendered.find(_PROBE[1])
        if at < 0:
            return ()
        after = rendered[at + len(_PROBE[1]) :]
        found = [(after.find(t), t) for t in self.special_texts if t in after]
        return (min(found)[1],) if found else ()

    @cached_property
    def end_of_turn_ids(self) -> set[int]:
        """Ids that end a reply: the end-of-turn token and the end-of-text token."""
        ids = {self.tokenizer.hf.token_to_id(t) for t in self.end_of_turn_texts}
        ids.add(self.tokenizer.special_ids.get("eos"))
        return {i for i in ids if i is not None}


def chat_tokenizer_files(tokenizer: TextTokenizer, config: dict[str, Any], source: str) -> tuple[str, dict[str, Any], list[str]]:
    """The tokenizer.json text and tokenizer_config.json of `tokenizer` made to chat with the template
    `source`: the template under `chat_template`, special-token text read as the special tokens (so that
    transformers' apply_chat_template reads the template's markers as tfcli does), and ChatML's two markers
    added as special tokens where the template writes them and the tokenizer lacks them. Returns the added tokens too."""
    text = tokenizer.path.read_text(encoding="utf-8")
    added: list[str] = []
    hf = Tokenizer.from_str(text)
    specials = {a.content for a in hf.get_added_tokens_decoder().values() if a.special}
    added = [t for t in (TURN_START, TURN_END) if t in source and t not in specials]
    if added:
        hf.add_special_tokens(added)
        text = hf.to_str(pretty=True)
    config = dict(config)
    config[TEMPLATE_KEY] = source
    config["split_special_tokens"] = False
    if added:
        extra = config.get("additional_special_tokens")
        config["additional_special_tokens"] = [*(extra if isinstance(extra, list) else []), *added]
    return text, config, added
