"""The requests the API takes, as OpenAI documents them: typed models that refuse unknown keys, wrong types
and out-of-range values with a 400 before any work (JSON's true and false are not numbers, though pydantic's
lax mode reads them as 1 and 0). Two extensions, named as vLLM names them: `ignore_eos` (decode to
max_tokens, for benchmarks) and `return_token_ids` (each choice's ids)."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

MAX_N = 128  # completions per request (OpenAI's own limit)
MAX_PROMPTS = 128  # prompts in one completions request
MAX_STOPS = 4  # stop strings (OpenAI's limit)
MAX_LOGPROBS = 20


def _not_a_bool(value):
    """A number field refuses JSON's true and false (pydantic would read `max_tokens: true` as 1)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, not {str(value).lower()}")
    return value


NOT_A_BOOL = BeforeValidator(_not_a_bool)  # put after a number's Field (before it, the OpenAPI schema says "ge", not "minimum")
Temperature = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False), NOT_A_BOOL]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False), NOT_A_BOOL]
Seed = Annotated[int, Field(ge=-(2**63), lt=2**64), NOT_A_BOOL]
TokenId = Annotated[int, Field(ge=0, lt=2**31), NOT_A_BOOL]


def _text(value: str, what: str) -> str:
    """Text the tokenizer can read: a lone surrogate (JSON's "\\ud800") is not a character."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} holds a lone surrogate (\\u{ord(value[0]):04x}...), which is not text") from None
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
    stop: Optional[Union[str, Annotated[list[str], Field(max_length=MAX_STOPS)]]] = None
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


Prompt = Union[
    str,
    Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)],
    Annotated[list[TokenId], Field(min_length=1)],
    Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)],
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
