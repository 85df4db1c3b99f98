"""The HTTP side: OpenAI's routes over one run and its engine, the chat page and the attention view.

Handlers check a request completely (prompt ids, the context, how many completions, how many
log-probabilities an echo returns) before any work and turn it into a `Ticket`; the engine's worker decodes
it with whatever else is running, and scores echoed prompts between steps. A response streams as
server-sent events (`data: {...}` chunks, then `data: [DONE]`) or comes whole, built and encoded in a worker
thread: the event loop only moves bytes. A client that goes away cancels its ticket, and its rows leave the
batch at the next step. One model is served, so a request may name it anything (as llama.cpp's server
takes it); /v1/models lists the names it is served under.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from tfcli.checkpoint import Checkpoint
from tfcli.errors import TfcliError
from tfcli.generate.chat import fit_messages, reply_room
from tfcli.generate.conversation import transcript_ids
from tfcli.generate.scoring import ContinuationScore, score_continuations
from tfcli.serve import errors
from tfcli.serve.admission import Limits
from tfcli.serve.attention import Exchange, Exchanges, attention_page
from tfcli.serve.engine import Busy, Ended, Engine, Failed, Sampling, Ticket, Token
from tfcli.serve.errors import ApiError
from tfcli.serve.page import chat_page
from tfcli.serve.protocol import ChatRequest, CompletionRequest
from tfcli.tokenizer.chat_template import ChatTemplate, Message
from tfcli.tokenizer.detokenize import REPLACEMENT, alone_texts, decode_completion
from tfcli.train.saving import KEPT_DIR
from tfcli.train.state import BEST_DIR

DISCONNECT_POLL_SECONDS = 0.5  # how often a handler waiting on work for the model (scoring, a capture) checks its client is still there
MAX_ECHO_LOGPROBS = 1_000_000  # log-probabilities an echo returns in one response: prompt tokens x n x (1 + logprobs)
MAX_NAME_CHARS = 256  # a served model name
GONE = "gone"  # put on a ticket's queue when its client has gone away


@dataclasses.dataclass
class Served:
    """One run behind the API."""

    name: str  # the name responses give the model
    checkpoint: Checkpoint
    engine: Engine
    template: ChatTemplate | None
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    exchanges: Exchanges = dataclasses.field(default_factory=Exchanges)
    names: tuple[str, ...] = ()  # the names /v1/models lists, `name` first (empty: `name` alone)
    _token_texts: dict[int, str] = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.names = tuple(self.names) or (self.name,)

    @property
    def block(self) -> int:
        return self.checkpoint.model.config.block_size

    def token_text(self, token: int) -> str:
        """One token's text on its own (logprobs' `tokens` and `top_logprobs` keys), through the tokenizer's
        decoder; a token that is only part of a character shows as its vocabulary entry ("<0xE6>")."""
        found = self._token_texts.get(token)
        if found is None:
            tokenizer = self.checkpoint.tokenizer
            (found,) = alone_texts(tokenizer, [token])
            if REPLACEMENT in found:
                found = tokenizer.hf.id_to_token(token) or found
            self._token_texts[token] = found
        return found

    def text(self, ids: Sequence[int]) -> str:
        """The text of ids (an echoed prompt), through the tokenizer's own decoder."""
        return decode_completion(self.checkpoint.tokenizer, (), ids)


def run_name(run: Path) -> str:
    """The name a run is served under by default: its folder's, or for its best checkpoint or a kept one, the run's.

    Example: runs/story -> story; runs/story/best -> story; runs/story/checkpoints/step-0000500 -> story"""
    folder = Path(run).resolve()
    if folder.name == BEST_DIR:
        folder = folder.parent
    elif folder.parent.name == KEPT_DIR:
        folder = folder.parent.parent
    return folder.name or "model"


def model_names(run: Path, given: Sequence[str] = ()) -> tuple[str, ...]:
    """The names a run is served under: --served-model-name's (repeated or comma-separated), else the run's.

    Example: ("tiny", "a,b") -> ("tiny", "a", "b"); () for runs/story/best -> ("story",)"""
    names: list[str] = []
    for value in given:
        for name in value.split(","):
            name = name.strip()
            if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
                raise TfcliError(
                    f"--served-model-name {name[:40]!r} is not a name: a name is 1 to {MAX_NAME_CHARS} printable characters",
                    hint="pass --served-model-name NAME, or names separated by commas",
                )
            if name not in names:
                names.append(name)
    return tuple(names) or (run_name(run),)


def create_app(served: Served, *, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title=f"tfcli serve: {served.name}", docs_url=None, redoc_url=None, version="1")
    errors.install(app)
    app.add_middleware(Limits, api_key=api_key)  # outermost: the key and the body size before anything is read
    app.state.served = served

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(chat_page(served.name, chat=served.template is not None, block=served.block))

    @app.get("/health")
    async def health() -> dict:
        engine = served.engine
        return {
            "status": "ok",
            "model": served.name,
            "decoding": len(engine.rows),
            "waiting": engine.queued,
            "max_batch": engine.max_batch,
            "steps": engine.steps,
            "busiest_batch": engine.busiest,
            "compiled_step": engine.batch.compiled_state(),
        }

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(served, name) for name in served.names]}

    @app.get("/v1/models/{model}")
    async def model(model: str) -> dict:
        if model not in served.names:
            listed = ", ".join(repr(name) for name in served.names)
            raise ApiError(
                404,
                f"the model {model!r} is not listed; this server serves one model, listed as {listed} (a request may name it anything)",
                param="model",
                code="model_not_found",
            )
        return _model_card(served, model)

    @app.get("/attention/{exchange}", response_class=HTMLResponse)
    async def attention(exchange: str, request: Request) -> HTMLResponse:
        found = served.exchanges.get(exchange)
        if found is None:
            raise ApiError(404, f"no exchange {exchange!r} is kept (the server keeps the last {served.exchanges.kept})", param="exchange")
        result = await _run_task(served, request, lambda: attention_page(served.checkpoint, found))
        return HTMLResponse(result)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await _completions(served, body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        return await _chat(served, body, request)

    @app.post("/chat", include_in_schema=False)
    async def page_chat(body: ChatRequest, request: Request):
        """The chat page's: /v1/chat/completions on any run, its conversation fitted by `tfcli generate --chat`'s rule."""
        return await _chat(served, body, request, fit=True)

    return app


def _model_card(served: Served, name: str) -> dict:
    return {"id": name, "object": "model", "created": served.created, "owned_by": "tfcli", "max_model_len": served.block}


def _context_check(served: Served, prompt_tokens: int, max_tokens: int, where: str = "the prompt") -> None:
    if prompt_tokens + max_tokens > served.block:
        raise ApiError(
            400,
            f"This model's maximum context length is {served.block} tokens. However, you requested {prompt_tokens + max_tokens} tokens "
            f"({prompt_tokens} in {where}, {max_tokens} for the completion). Please reduce the prompt or the completion length.",
            param="max_tokens" if prompt_tokens < served.block else "prompt",
            code="context_length_exceeded",
        )


def _sampling(served: Served, body, max_tokens: int, *, chat: bool, logprobs: int | None) -> Sampling:
    """A request's decoding settings, OpenAI's defaults where it leaves them out (temperature 1, top_p 1)."""
    return Sampling(
        max_tokens=max_tokens,
        temperature=body.temperature if body.temperature is not None else 1.0,
        top_p=body.top_p if body.top_p is not None else 1.0,
        stop=body.stops(),
        seed=body.seed,
        end_ids=_end_ids(served, body, chat=chat),
        logprobs=logprobs,
    )


def _end_ids(served: Served, body, chat: bool) -> frozenset[int]:
    if body.ignore_eos:
        return frozenset()
    ids = served.engine.vocab.end_ids  # eos and the ids the run's files name
    return (ids | served.template.end_of_turn_ids) if chat and served.template is not None else ids


def _check_rows(served: Served, rows: int) -> None:
    """Every request, whatever its max_tokens: each completion is a row of the batch and a choice to build."""
    if rows > served.engine.max_batch:
        raise ApiError(
            400,
            f"the request asks for {rows} completions at once (prompts x n); this server decodes at most {served.engine.max_batch} together",
            param="n",
        )


def _check_echo(prompts: list[list[int]], n: int, logprobs: int) -> None:
    """An echo with logprobs returns each prompt token's log-probability and top alternatives, in each of the
    prompt's n completions: bounded before the prompts are scored."""
    entries = sum(len(p) for p in prompts) * n * (1 + logprobs)
    if entries > MAX_ECHO_LOGPROBS:
        raise ApiError(
            400,
            f"echo with logprobs {logprobs} returns {entries:,} log-probabilities here (prompt tokens x n x (1 + logprobs)); "
            f"this server returns at most {MAX_ECHO_LOGPROBS:,} in one response: send fewer or shorter prompts, a smaller n or a smaller logprobs",
            param="logprobs",
            code="echo_too_large",
        )


def _prompt_ids(served: Served, body: CompletionRequest) -> list[list[int]]:
    prompt = body.prompt
    tokenizer = served.checkpoint.tokenizer
    if isinstance(prompt, str):
        prompts: list = [prompt]
    elif prompt and isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    encoded = []
    limit = served.engine.vocab.limit
    for i, p in enumerate(prompts):
        where = "the prompt" if len(prompts) == 1 else f"prompt {i}"
        if isinstance(p, str):
            ids = tokenizer.encode(p)
            # as `tfcli generate` reads a prompt: a pretrained Llama's starts with <s> (and ends with </s> where its file
            # says so); an empty one is <s> (</s>) alone, an unconditional sample, where the tokenizer adds <s>
            if ids or tokenizer.adds_bos:
                ids = tokenizer.prompt_ids(ids)
        else:
            ids = list(p)
            bad = [t for t in ids if t >= limit]
            if bad:
                raise ApiError(400, f"{where} holds token id {bad[0]}, outside the vocabulary (0 to {limit - 1})", param="prompt")
        if not ids:
            raise ApiError(
                400, f"{where} is empty (no tokens), and this tokenizer has no beginning-of-text token to start from: send some text", param="prompt"
            )
        if len(ids) > served.block:
            raise ApiError(
                400,
                f"This model's maximum context length is {served.block} tokens. However, {where} has {len(ids)} tokens. Please reduce the prompt.",
                param="prompt",
                code="context_length_exceeded",
            )
        encoded.append(ids)
    return encoded


async def _completions(served: Served, body: CompletionRequest, request: Request):
    prompts = _prompt_ids(served, body)
    max_tokens = body.max_tokens if body.max_tokens is not None else 16
    if max_tokens == 0 and not body.echo:
        raise ApiError(400, "max_tokens 0 returns nothing without echo", param="max_tokens")
    for ids in prompts:
        _context_check(served, len(ids), max_tokens)
    n = body.n or 1
    _check_rows(served, len(prompts) * n)
    want_logprobs = body.logprobs
    scores: list[list[ContinuationScore | None]] | None = None
    if body.echo and want_logprobs is not None:
        _check_echo(prompts, n, want_logprobs)
        scores = await _score_prompts(served, request, prompts, want_logprobs)
    sampling = _sampling(served, body, max_tokens, chat=False, logprobs=want_logprobs)
    rid = f"cmpl-{secrets.token_hex(12)}"
    created = int(time.time())
    builder = CompletionChoices(served, prompts, n, echo=bool(body.echo), scores=scores, logprobs=want_logprobs, token_ids=bool(body.return_token_ids))
    echoed = None
    if body.stream and builder.echo:  # the stream's first chunk, made and encoded in a worker thread
        echoed = await asyncio.to_thread(lambda: _sse_line(_completion_chunk(served, rid, created, builder.echo_choices())))
    ticket = _submit(served, Ticket(asyncio.get_running_loop(), prompts, n, sampling)) if max_tokens else None
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _sse(_stream_completion(served, request, ticket, builder, rid, created, include_usage, echoed))
    if ticket is not None:
        async for event in _events(served, request, ticket):
            builder.add(event)
        _check_present(ticket)

    single = ticket is not None and len(builder.texts) == 1  # an exchange the attention view can show

    def respond() -> tuple[JSONResponse, str]:  # in a worker thread: the choices' texts and log-probabilities, encoded
        answer = {"id": rid, "object": "text_completion", "created": created, "model": served.name, "choices": builder.finished(), "usage": builder.usage()}
        return JSONResponse(answer), served.text(prompts[0])[:60] if single else ""

    response, title = await asyncio.to_thread(respond)
    if single:
        served.exchanges.add(rid, Exchange(prompts[0], builder.tokens[0], title))
    return response


class CompletionChoices:
    """The choices of a completions response, built from the engine's events (prompt i, sample s is
    choice i * n + s, as OpenAI orders them). An echoed prompt's text and log-probabilities are made once
    per prompt and shared by its n choices; the handlers call `echo_choices` and `finished` in a worker
    thread, never on the event loop."""

    def __init__(self, served: Served, prompts, n: int, *, echo: bool, scores, logprobs: int | None, token_ids: bool) -> None:
        self.served, self.prompts, self.n = served, prompts, n
        self.echo, self.scores, self.logprobs, self.token_ids = echo, scores, logprobs, token_ids
        count = len(prompts) * n
        self.texts = [""] * count
        self.tokens: list[list[int]] = [[] for _ in range(count)]
        self.token_logprobs: list[list[float | None]] = [[] for _ in range(count)]
        self.top: list[list[dict | None]] = [[] for _ in range(count)]
        self.reasons: list[str] = ["length"] * count
        self.ends: list[tuple[int, float | None, dict | None] | None] = [None] * count  # the end token, listed last in logprobs
        self._echoed: dict[int, tuple[str, tuple[list[str], list[float | None], list[dict | None]]]] = {}

    def prompt_of(self, index: int) -> list[int]:
        return self.prompts[index // self.n]

    def add(self, event) -> None:
        i = event.index
        if isinstance(event, Token):
            self.tokens[i].append(event.token)
            self.texts[i] += event.text
            self.token_logprobs[i].append(event.logprob)
            self.top[i].append(self._top(event.top))
        elif isinstance(event, Ended):
            self.texts[i] += event.text
            self.reasons[i] = event.finish_reason
            if event.end_token is not None:
                self.ends[i] = (event.end_token, event.logprob, self._top(event.top))

    def _top(self, top: dict[int, float] | None) -> dict[str, float] | None:
        if top is None:
            return None
        out: dict[str, float] = {}
        for token, logprob in top.items():  # two ids with one text keep the likelier
            text = self.served.token_text(token)
            out[text] = max(logprob, out.get(text, float("-inf")))
        return out

    def _echoed_prompt(self, index: int) -> tuple[str, tuple[list[str], list[float | None], list[dict | None]]]:
        """Choice `index`'s prompt: its text, and its tokens' texts, log-probabilities (the first has none) and
        top alternatives; made once per prompt."""
        p = index // self.n
        found = self._echoed.get(p)
        if found is None:
            prompt = self.prompts[p]
            strings = [self.served.token_text(t) for t in prompt] if self.logprobs is not None else []
            score = self.scores[p] if self.scores is not None else None
            if self.scores is None:
                logprobs, tops = [None] * len(prompt), [None] * len(prompt)
            elif score is None:
                logprobs, tops = [None], [None]
            else:
                tops = [None] + [self._top(t) if t is not None else {} for t in (score.top_logprobs or [None] * len(score.token_logprobs))]
                logprobs = [None, *score.token_logprobs]
            found = self._echoed[p] = (self.served.text(prompt), (strings, logprobs, tops))
        return found

    def logprobs_of(self, index: int, start: int = 0, with_prompt: bool = False) -> dict | None:
        if self.logprobs is None:
            return None
        strings = [self.served.token_text(t) for t in self.tokens[index][start:]]
        token_logprobs, top = list(self.token_logprobs[index][start:]), list(self.top[index][start:])
        if self.ends[index] is not None:  # the token that ended it, as vLLM lists it (lm-eval counts on one token after the prompt)
            token, logprob, alternatives = self.ends[index]
            strings, token_logprobs, top = [*strings, self.served.token_text(token)], [*token_logprobs, logprob], [*top, alternatives]
        if with_prompt:
            prompt_strings, prompt_logprobs, prompt_top = self._echoed_prompt(index)[1]
            strings, token_logprobs, top = prompt_strings + strings, prompt_logprobs + token_logprobs, prompt_top + top
        offsets, at = [], 0
        for s in strings:
            offsets.append(at)
            at += len(s)
        return {
            "tokens": strings,
            "token_logprobs": token_logprobs,
            "top_logprobs": top if self.logprobs > 0 else [None] * len(strings),
            "text_offset": offsets,
        }

    def prompt_text(self, index: int) -> str:
        return self._echoed_prompt(index)[0]

    def echo_choices(self) -> list[dict]:
        """A stream's first chunk with echo: each choice's prompt (and its log-probabilities when asked for)."""
        return [
            {"index": i, "text": self.prompt_text(i), "logprobs": self.logprobs_of(i, with_prompt=True) if self.scores else None, "finish_reason": None}
            for i in range(len(self.texts))
        ]

    def finished(self) -> list[dict]:
        choices = []
        for i in range(len(self.texts)):
            text = (self.prompt_text(i) if self.echo else "") + self.texts[i]
            choice = {"index": i, "text": text, "logprobs": self.logprobs_of(i, with_prompt=self.echo), "finish_reason": self.reasons[i]}
            if self.token_ids:
                choice["token_ids"] = self.tokens[i]
                choice["prompt_token_ids"] = self.prompt_of(i)
            choices.append(choice)
        return choices

    def usage(self) -> dict:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(len(t) for t in self.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _completion_chunk(served: Served, rid: str, created: int, choices: list[dict], **extra) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": served.name, "choices": choices, **extra}


async def _stream_completion(
    served: Served, request: Request, ticket: Ticket | None, builder: CompletionChoices, rid: str, created: int, include_usage: bool, echoed: str | None
):
    """The stream's chunks; `echoed`, the first with echo, comes encoded (it was made in a worker thread)."""

    def chunk(choices: list[dict], **extra) -> dict:
        return _completion_chunk(served, rid, created, choices, **extra)

    if echoed is not None:
        yield echoed
    if ticket is not None:
        async for event in _events(served, request, ticket):
            builder.add(event)
            if isinstance(event, Token):
                at = len(builder.tokens[event.index]) - 1
                yield chunk([{"index": event.index, "text": event.text, "logprobs": builder.logprobs_of(event.index, at), "finish_reason": None}])
            elif isinstance(event, Ended):
                logprobs = builder.logprobs_of(event.index, len(builder.tokens[event.index])) if event.end_token is not None else None
                yield chunk([{"index": event.index, "text": event.text, "logprobs": logprobs, "finish_reason": event.finish_reason}])
    else:
        yield chunk([{"index": i, "text": "", "logprobs": None, "finish_reason": "length"} for i in range(len(builder.texts))])
    if ticket is not None and len(builder.texts) == 1:
        served.exchanges.add(rid, Exchange(builder.prompts[0], builder.tokens[0], served.text(builder.prompts[0])[:60]))
    if include_usage:
        yield chunk([], usage=builder.usage())


async def _chat(served: Served, body: ChatRequest, request: Request, *, fit: bool = False):
    """A chat completion. `fit` (the chat page's route): any run (one without a chat template continues the text,
    as `generate --interactive` does: each message a line, the reply ends at a newline), and a conversation too
    long for the context loses its oldest exchanges by `generate --chat`'s rule (`X-Dropped-Exchanges` says how
    many) where the API answers 400, as OpenAI does."""
    template = served.template
    if template is None and not fit:
        raise ApiError(
            400,
            f"the run {served.name!r} has no chat template (chat_template in tokenizer_config.json), so it cannot read messages; "
            "use /v1/completions with a prompt, or fine-tune it for chat (tfcli train finetune --task chat)",
            param="messages",
            code="no_chat_template",
        )
    messages = [Message("system" if m.role == "developer" else m.role, m.text()) for m in body.messages]
    asked = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    dropped = 0
    render = _renderer(served)
    if fit:  # in a worker thread: a long conversation is rendered a few times
        room = reply_room(served.block, asked if asked is not None else served.block)
        prompt, messages, dropped = await asyncio.to_thread(fit_messages, render, messages, room)
    else:
        prompt = render(messages)
    if not prompt:
        raise ApiError(400, "the conversation renders to no tokens", param="messages")
    if len(prompt) >= served.block:
        raise ApiError(
            400,
            f"This model's maximum context length is {served.block} tokens. However, your messages resulted in {len(prompt)} tokens, "
            "which leaves no room for a reply. Please reduce the length of the messages.",
            param="messages",
            code="context_length_exceeded",
        )
    max_tokens = asked if asked is not None else served.block - len(prompt)
    if fit:  # the server never slides the window: the reply gets what the context has left
        max_tokens = min(max_tokens, served.block - len(prompt))
    _context_check(served, len(prompt), max_tokens, "the messages")
    n = body.n or 1
    _check_rows(served, n)
    top = body.top_logprobs if body.logprobs else None
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    sampling = _sampling(served, body, max_tokens, chat=True, logprobs=(top or 0) if body.logprobs else None)
    if template is None:  # a line of text answers a line
        sampling = dataclasses.replace(sampling, stop=(*sampling.stop, "\n"))
    rid = f"chatcmpl-{secrets.token_hex(12)}"
    created = int(time.time())
    ticket = _submit(served, Ticket(asyncio.get_running_loop(), [prompt], n, sampling))
    title = messages[-1].content[:60]
    fitted = {"X-Dropped-Exchanges": str(dropped)} if fit else {}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        response = _sse(_stream_chat(served, request, ticket, prompt, n, rid, created, include_usage, title, bool(body.logprobs)))
        response.headers.update(fitted)
        return response
    texts, tokens, reasons = [""] * n, [[] for _ in range(n)], ["length"] * n
    logprobs: list[list[dict]] = [[] for _ in range(n)]
    async for event in _events(served, request, ticket):
        texts[event.index] += event.text
        if isinstance(event, Token):
            tokens[event.index].append(event.token)
            if body.logprobs:
                logprobs[event.index].append(_chat_logprob(served, event))
        else:
            reasons[event.index] = event.finish_reason
    _check_present(ticket)
    if n == 1:
        served.exchanges.add(rid, Exchange(prompt, tokens[0], title))
    choices = []
    for i in range(n):
        choice = {
            "index": i,
            "message": {"role": "assistant", "content": texts[i]},
            "logprobs": {"content": logprobs[i]} if body.logprobs else None,
            "finish_reason": reasons[i],
        }
        if body.return_token_ids:
            choice["token_ids"] = tokens[i]
            choice["prompt_token_ids"] = prompt
        choices.append(choice)
    used = sum(len(t) for t in tokens)
    usage = {"prompt_tokens": len(prompt), "completion_tokens": used, "total_tokens": len(prompt) + used}
    answer = {"id": rid, "object": "chat.completion", "created": created, "model": served.name, "choices": choices, "usage": usage}
    return await asyncio.to_thread(lambda: JSONResponse(answer, headers=fitted))  # encoded in a worker thread


def _renderer(served: Served) -> Callable[[list[Message]], list[int]]:
    """How messages become a prompt: the run's chat template, or for a run without one the text so far, as
    `tfcli generate --interactive` holds it (each message a line)."""
    if served.template is not None:
        return served.template.prompt_ids
    tokenizer = served.checkpoint.tokenizer
    return lambda messages: transcript_ids(tokenizer, [m.content for m in messages])


def _chat_logprob(served: Served, event: Token) -> dict:
    def entry(token: int, logprob: float) -> dict:
        return {"token": served.token_text(token), "logprob": logprob, "bytes": list(served.token_text(token).encode("utf-8"))}

    return entry(event.token, event.logprob) | {"top_logprobs": [entry(t, lp) for t, lp in (event.top or {}).items()]}


async def _stream_chat(
    served: Served, request: Request, ticket: Ticket, prompt: list[int], n: int, rid: str, created: int, include_usage: bool, title: str, logprobs: bool
):
    def chunk(choices: list[dict], **extra) -> dict:
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": served.name, "choices": choices, **extra}

    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None} for i in range(n)])
    tokens: list[list[int]] = [[] for _ in range(n)]
    async for event in _events(served, request, ticket):
        if isinstance(event, Token):
            tokens[event.index].append(event.token)
            chosen = {"content": [_chat_logprob(served, event)]} if logprobs else None
            yield chunk([{"index": event.index, "delta": {"content": event.text}, "logprobs": chosen, "finish_reason": None}])
        else:
            delta = {"content": event.text} if event.text else {}
            yield chunk([{"index": event.index, "delta": delta, "logprobs": None, "finish_reason": event.finish_reason}])
    if n == 1:
        served.exchanges.add(rid, Exchange(prompt, tokens[0], title))
    if include_usage:
        used = sum(len(t) for t in tokens)
        yield chunk([], usage={"prompt_tokens": len(prompt), "completion_tokens": used, "total_tokens": len(prompt) + used})


# -- the engine, from the handlers --------------------------------------------------------------------------


def _submit(served: Served, ticket: Ticket) -> Ticket:
    try:
        return served.engine.submit(ticket)
    except Busy as exc:
        raise ApiError(503, f"the server is busy: {exc}; try again shortly", code="server_busy") from None


async def _events(served: Served, request: Request, ticket: Ticket) -> AsyncIterator[Token | Ended]:
    """The ticket's events until every completion has ended. A client that goes away (a cancelled stream, or a
    closed connection, which a watcher hears at once) cancels the ticket: its rows leave the batch at the next
    step."""
    remaining = ticket.rows
    watcher = asyncio.create_task(_watch_client(served, request, ticket))
    try:
        while remaining:
            events = await ticket.queue.get()
            if events is GONE:
                return
            for event in events:
                if isinstance(event, Failed):
                    raise ApiError(500, event.message)
                if isinstance(event, Ended):
                    remaining -= 1
                yield event
    finally:
        watcher.cancel()
        if remaining:
            served.engine.cancel(ticket)


async def _watch_client(served: Served, request: Request, ticket: Ticket) -> None:
    """Wait for the client to go away (the body was read, so the next message is its disconnect), then cancel
    the ticket and wake its handler."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a connection that cannot be read from any more has gone too
        pass
    served.engine.cancel(ticket)
    ticket.queue.put_nowait(GONE)


def _check_present(ticket: Ticket) -> None:
    """After the events: a client that went away gets no response built."""
    if ticket.cancelled:
        raise ApiError(400, "the client went away")


async def _run_task(served: Served, request: Request, task):
    """Run work that needs the model (scoring, an attention capture) in the engine's thread, between steps."""
    ticket = Ticket(asyncio.get_running_loop(), [], 1, Sampling(max_tokens=0))
    ticket.task = task
    _submit(served, ticket)
    while True:
        try:
            events = await asyncio.wait_for(ticket.queue.get(), DISCONNECT_POLL_SECONDS)
            break
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                served.engine.cancel(ticket)
                raise ApiError(400, "the client went away") from None
    result = events[0]
    if isinstance(result, Failed):
        raise ApiError(500, result.message)
    return result


async def _score_prompts(served: Served, request: Request, prompts: list[list[int]], top: int) -> list[ContinuationScore | None]:
    """Each prompt's tokens scored by the one scorer: token i given tokens 0..i-1 (the first has no score)."""
    pairs = [(p[:1], p[1:]) for p in prompts if len(p) > 1]
    model = served.checkpoint.model
    results = iter(await _run_task(served, request, lambda: score_continuations(model, pairs, top_k=top)) if pairs else [])
    return [next(results) if len(p) > 1 else None for p in prompts]


def _sse_line(chunk: dict) -> str:
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"


def _sse(chunks: AsyncIterator[dict | str]) -> StreamingResponse:
    """Server-sent events of the chunks (a str is an event already encoded)."""

    async def lines():
        try:
            async for chunk in chunks:
                yield chunk if isinstance(chunk, str) else _sse_line(chunk)
        except ApiError as exc:  # after the first chunk the status is sent: the error travels as an event
            yield f"data: {json.dumps(errors.error_body(exc.status, exc.message, exc.param, exc.code))}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
