"""The requests the API takes, as OpenAI documents them: typed models that refuse unknown keys, wrong types
and out-of-range values with a 400 before any work (JSON's true and false are not numbers, though pydantic's
lax mode reads them as 1 and 0). Two extensions, named as vLLM names them: `ignore_eos` (decode to
max_tokens, for benchmarks) and `return_token_ids` (each choice's ids)."""

from __future__ import annotations

import json
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

MAX_N = 128  # completions per request (OpenAI's own limit)
MAX_PROMPTS = 128  # prompts in one completions request
MAX_STOPS = 4  # stop strings (OpenAI's limit)
MAX_LOGPROBS = 20
MAX_TOKEN_ID = 2**31 - 1  # above any vocabulary; the served one's size is checked by the handler
WHOLE_MESSAGE = "whole_message"  # a validation error whose message names its field (errors.py shows it as it is)


def _not_a_bool(value):
    """A number field refuses JSON's true and false (pydantic would read `max_tokens: true` as 1)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, not {str(value).lower()}")
    return value


NOT_A_BOOL = BeforeValidator(_not_a_bool)  # put after a number's Field (before it, the OpenAPI schema says "ge", not "minimum")
Temperature = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False), NOT_A_BOOL]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False), NOT_A_BOOL]
Seed = Annotated[int, Field(ge=-(2**63), lt=2**64), NOT_A_BOOL]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID), NOT_A_BOOL]


def _text(value: str, what: str) -> str:
    """Text the tokenizer can read: a lone surrogate (JSON's "\\ud800") is not a character."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} holds a lone surrogate (\\u{ord(value[0]):04x}...), which is not text") from None
    return value


def _whole(message: str) -> PydanticCustomError:
    return PydanticCustomError(WHOLE_MESSAGE, "{message}", {"message": message})


def _json_kind(value) -> str:
    """What a JSON value is, to name it. Example: _json_kind(1.5) -> "a decimal number (1.5)" """
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"{'a number' if isinstance(value, int) else 'a decimal number'} ({value})"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _stop_shape(value):
    """stop's shape named before pydantic tries the union's forms (five stop strings got "Input should be a
    valid string", the first form's complaint)."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _whole(f"stop is {_json_kind(value)}: stop is a string or a list of at most {MAX_STOPS} strings")
    if len(value) > MAX_STOPS:
        raise _whole(f"stop holds {len(value)} strings; at most {MAX_STOPS} are taken (OpenAI's limit)")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _whole(f"stop[{i}] is {_json_kind(item)}, not a string")
    return value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Optional[bool] = False


class Sampled(BaseModel):
    """What both routes share."""

    model_config = ConfigDict(extra="forbid")

    model: str
    temperature: Optional[Temperature] = 1.0
    top_p: Optional[Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False), NOT_A_BOOL]] = 1.0
    n: Optional[Annotated[int, Field(ge=1, le=MAX_N), NOT_A_BOOL]] = 1
    stop: Annotated[Optional[Union[str, Annotated[list[str], Field(max_length=MAX_STOPS)]]], BeforeValidator(_stop_shape)] = None
    seed: Optional[Seed] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[Annotated[Penalty, Field(ge=0.0, le=0.0)]] = 0.0  # accepted at 0 only: not implemented
    frequency_penalty: Optional[Annotated[Penalty, Field(ge=0.0, le=0.0)]] = 0.0
    logit_bias: Optional[Annotated[dict[str, Annotated[float, NOT_A_BOOL]], Field(max_length=0)]] = None
    user: Optional[Annotated[str, Field(max_length=256)]] = None
    ignore_eos: Optional[bool] = False
    return_token_ids: Optional[bool] = False

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else value or []
        for stop in stops:
            if not stop:
                raise ValueError("a stop string is empty")
            _text(stop, "a stop string")
            if len(stop) > 256:
                raise ValueError("a stop string is longer than 256 characters")
        return value

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


PROMPT_FORMS = "a prompt is text, a list of texts, a list of token ids or a list of token-id lists"


def _token_ids(ids: list, where: str) -> None:
    if not ids:
        raise _whole(f"{where} is an empty list of token ids; send at least one token, or the prompt as text")
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int):
            raise _whole(f"{where}[{i}] is {_json_kind(token)}, not a token id: {PROMPT_FORMS}")
        if token < 0:
            raise _whole(f"{where}[{i}] is token id {token}; token ids are 0 or more")
        if token > MAX_TOKEN_ID:
            raise _whole(f"{where}[{i}] is token id {token}, outside the vocabulary")


def _prompt_shape(value):
    """The prompt's shape checked before pydantic tries the union's forms, which would report only the first
    form's complaint (`prompt: []` or `[-1]` got "Input should be a valid string"): what is wrong, named. The
    first item tells the form: texts, token-id lists, or else token ids."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _whole(f"prompt is {_json_kind(value)}: {PROMPT_FORMS}")
    if not value:
        raise _whole("prompt is an empty list; send the prompt as text, or as a list of token ids")
    if isinstance(value[0], (str, list)):
        form, what = type(value[0]), "text" if isinstance(value[0], str) else "a list of token ids"
        if len(value) > MAX_PROMPTS:
            raise _whole(f"prompt holds {len(value)} prompts; this server takes at most {MAX_PROMPTS} in one request")
        for i, item in enumerate(value):
            if not isinstance(item, form):
                raise _whole(f"prompt[{i}] is {_json_kind(item)}, not {what} as prompt[0] is: {PROMPT_FORMS}")
            if form is list:
                _token_ids(item, f"prompt[{i}]")
    else:
        _token_ids(value, "prompt")
    return value


Prompt = Annotated[
    Union[
        str,
        Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)],
        Annotated[list[TokenId], Field(min_length=1)],
        Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)],
    ],
    BeforeValidator(_prompt_shape),
]


class CompletionRequest(Sampled):
    """POST /v1/completions."""

    prompt: Prompt
    max_tokens: Optional[Annotated[int, Field(ge=0, le=2**31), NOT_A_BOOL]] = 16
    logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_LOGPROBS), NOT_A_BOOL]] = None
    echo: Optional[bool] = False
    best_of: Optional[Annotated[int, Field(ge=1, le=1), NOT_A_BOOL]] = None  # accepted as 1 only
    suffix: Optional[Annotated[str, Field(max_length=0)]] = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        for text in [value] if isinstance(value, str) else value:
            if isinstance(text, str):
                _text(text, "the prompt")
        return value


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer"]
    content: Union[str, Annotated[list[ContentPart], Field(max_length=64)]]
    name: Optional[Annotated[str, Field(max_length=64)]] = None

    @field_validator("content")
    @classmethod
    def _content(cls, value):
        for text in [value] if isinstance(value, str) else [p.text for p in value]:
            _text(text, "a message")
        return value

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(Sampled):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)]
    max_tokens: Optional[Annotated[int, Field(ge=1, le=2**31), NOT_A_BOOL]] = None
    max_completion_tokens: Optional[Annotated[int, Field(ge=1, le=2**31), NOT_A_BOOL]] = None
    logprobs: Optional[bool] = False
    top_logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_LOGPROBS), NOT_A_BOOL]] = None
