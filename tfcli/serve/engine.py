"""The scheduler: one worker thread owns the model and a `SlotBatch`, and between steps lets finished and
cancelled sequences leave and waiting requests join (continuous batching). Handlers talk to it through
`Ticket`s: `submit` queues a request, the worker puts each step's events on the ticket's asyncio queue.

Sampling is `tfcli generate`'s (`choose_next`, text through `CompletionText`, one seeded generator per
request), so a request decodes as `generate` decodes it alone: greedy always, seeded sampling while every
completion of the request is still running (generate draws for its finished rows too; here they have left).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import secrets
import threading
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from tfcli.generate.sampling import filtered_logits, sample_from
from tfcli.generate.stream import CompletionText
from tfcli.generate.window import Vocabulary
from tfcli.model.transformer import Transformer
from tfcli.serve.slots import SlotBatch
from tfcli.tokenizer.core import TextTokenizer


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How one request decodes (its API fields, checked by the handler)."""

    max_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    end_ids: frozenset[int] = frozenset()  # ids that end a completion (end-of-text; a chat's end of turn)
    logprobs: int | None = None  # None: none; k: each token's log-probability and the top k at its position


@dataclasses.dataclass
class Token:
    """A new token of completion `index` and the text it made safe to show (possibly "")."""

    index: int
    token: int
    text: str
    logprob: float | None = None
    top: dict[int, float] | None = None


@dataclasses.dataclass
class Ended:
    """Completion `index` is done: the rest of its text, why it ended, all its text and tokens."""

    index: int
    text: str
    finish_reason: str  # stop (end-of-text, end of turn or a stop string) | length
    completion: str
    tokens: list[int]
    # the end-of-generation token that ended it (not in `tokens` or the text), with its log-probability and top
    # alternatives where asked for: the completions API lists it last in logprobs, as vLLM does (lm-eval reads so)
    end_token: int | None = None
    logprob: float | None = None
    top: dict[int, float] | None = None


@dataclasses.dataclass
class Failed:
    message: str


GREEDY_BELOW = 1e-5  # temperatures under this decode greedily


def _plain_greedy(s: Sampling) -> bool:
    return s.temperature < GREEDY_BELOW and s.logprobs is None


class Busy(Exception):
    """The queue of waiting requests is full."""


class Ticket:
    """A request in the engine: its prompts (ids) x n completions, or a scoring job; the handler reads
    `queue` (lists of events) until every completion has Ended, or the scoring result came."""

    def __init__(self, loop: asyncio.AbstractEventLoop, prompts: Sequence[Sequence[int]], n: int, sampling: Sampling) -> None:
        self.loop = loop
        self.prompts = [list(p) for p in prompts]
        self.n, self.sampling = n, sampling
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self.task: Callable[[], object] | None = None  # work for the model between steps (scoring, an attention capture): its result is delivered
        self.rng: torch.Generator | None = None

    @property
    def rows(self) -> int:
        return 0 if self.task is not None else len(self.prompts) * self.n

    def deliver(self, events: list) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, events)


@dataclasses.dataclass
class Row:
    """A completion decoding in the batch."""

    ticket: Ticket
    index: int
    text: CompletionText
    tokens: list[int] = dataclasses.field(default_factory=list)
    pending: int = -1  # the token the next step feeds


class Engine:
    """Owns the model; `start()` runs the worker thread, `submit` and `cancel` are called from handlers."""

    def __init__(self, model: Transformer, tokenizer: TextTokenizer, *, max_batch: int = 16, max_queue: int = 64) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.vocab = Vocabulary.of(tokenizer, model.config.vocab_size)
        self.batch = SlotBatch(model, max_batch, self.vocab)
        self.max_batch, self.max_queue = max_batch, max_queue
        self.device = self.batch.device
        self.rows: list[Row] = []  # row i of the batch
        self.waiting: collections.deque[Ticket] = collections.deque()
        self.lock = threading.Condition()
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.rng = torch.Generator(device=self.device)
        self.rng.manual_seed(secrets.randbits(63))
        self.steps = 0  # decoding steps run (tests and the bench read it)
        self.busiest = 0  # the most rows decoded together in one step

    # -- the handlers' side -------------------------------------------------------------------------------

    def submit(self, ticket: Ticket) -> Ticket:
        if ticket.sampling.seed is not None and ticket.task is None:
            ticket.rng = torch.Generator(device=self.device)
            ticket.rng.manual_seed(ticket.sampling.seed)
        with self.lock:
            if len(self.waiting) >= self.max_queue:
                raise Busy(f"{len(self.waiting)} requests are waiting, the most this server queues")
            self.waiting.append(ticket)
            self.lock.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The client went away: its rows leave at the next step; a waiting request leaves the queue at once (it
        would hold a place there, and turn others away as busy, until rows came free)."""
        with self.lock:
            ticket.cancelled = True
            if ticket in self.waiting:
                self.waiting.remove(ticket)
            self.lock.notify()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._work, name="tfcli-serve-engine", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify()
        if self.thread is not None:
            self.thread.join(timeout=10)

    @property
    def queued(self) -> int:
        return len(self.waiting)

    # -- the worker ---------------------------------------------------------------------------------------

    def _work(self) -> None:
        with torch.inference_mode():
            while True:
                with self.lock:
                    while not self.stopping and not self.waiting and not self.rows:
                        self.lock.wait()
                    if self.stopping:
                        return
                    admitted = self._admit()
                try:
                    self._drop_cancelled()
                    for ticket in [t for t in admitted if t.task is not None]:
                        self._run_task(ticket)
                        admitted.remove(ticket)
                    self._start(admitted)
                    admitted = []
                    if self.rows:
                        self._step()
                except Exception as exc:  # a bug must not stop the server: every request in flight fails, clearly
                    self._fail_all(f"the server failed while decoding ({type(exc).__name__}: {exc})", admitted)

    def _admit(self) -> list[Ticket]:
        """Waiting requests that fit in the free rows, first come first served (called holding the lock)."""
        admitted = []
        free = self.batch.rows - len(self.rows)
        while self.waiting:
            ticket = self.waiting[0]
            if ticket.cancelled:
                self.waiting.popleft()
                continue
            if ticket.rows > free:
                break
            free -= ticket.rows
            admitted.append(self.waiting.popleft())
        return admitted

    def _run_task(self, ticket: Ticket) -> None:
        assert ticket.task is not None
        try:
            result = ticket.task()
        except Exception as exc:
            ticket.deliver([Failed(f"the work failed ({type(exc).__name__}: {exc})")])
            return
        ticket.deliver([result])

    def _start(self, tickets: list[Ticket]) -> None:
        """The admitted requests join the batch: their prompts run together in one pass, and each first token
        is chosen from its prompt's logits."""
        prompts = [(ticket, p, prompt) for ticket in tickets for p, prompt in enumerate(ticket.prompts)]
        if not prompts:
            return
        prefilled, logits = self.batch.prefill([prompt for _, _, prompt in prompts])
        joined: list[tuple[Row, int]] = []
        for k, (ticket, p, prompt) in enumerate(prompts):
            for s in range(ticket.n):
                self.batch.join(prompt, prefilled, k)
                row = Row(ticket, p * ticket.n + s, CompletionText(self.tokenizer, prompt, ticket.sampling.stop))
                self.rows.append(row)
                joined.append((row, k))
        self._advance([r for r, _ in joined], logits[[k for _, k in joined]])

    def _step(self) -> None:
        pending = torch.tensor([r.pending for r in self.rows], dtype=torch.long, device=self.device)
        logits = self.batch.step(pending)  # (B, V)
        self.steps += 1
        self.busiest = max(self.busiest, len(self.rows))
        self._advance(list(self.rows), logits)

    def _advance(self, rows: list[Row], logits: torch.Tensor) -> None:
        """Choose each row's next token from its logits (rows x V), deliver the events, let ended rows leave."""
        out: dict[Ticket, list] = {}
        ended: list[Row] = []
        by_ticket: dict[Ticket, list[int]] = {}
        for i, row in enumerate(rows):
            by_ticket.setdefault(row.ticket, []).append(i)
        # greedy rows without log-probabilities: one argmax and one copy to Python for all of them (on a GPU,
        # one synchronisation a step rather than one per request)
        plain = any(_plain_greedy(ticket.sampling) for ticket in by_ticket)
        greedy = logits.argmax(dim=-1).tolist() if plain else []
        for ticket, which in by_ticket.items():
            s = ticket.sampling
            if _plain_greedy(s):
                chosen_ids, logprobs, top = [greedy[i] for i in which], None, None
            else:
                try:
                    chosen, logprobs, top = self._choose(s, logits[which], ticket.rng or self.rng)
                except Exception as exc:  # this request's draw failed: it alone ends, the others go on
                    out[ticket] = [Failed(f"sampling failed ({type(exc).__name__}: {exc})")]
                    ended.extend(rows[i] for i in which)
                    continue
                chosen_ids = chosen.tolist()
            events = out.setdefault(ticket, [])
            for k, (i, token) in enumerate(zip(which, chosen_ids)):
                row = rows[i]
                if token in s.end_ids:
                    end = self._end(row, "stop")
                    end.end_token, end.logprob, end.top = token, None if logprobs is None else logprobs[k], None if top is None else top[k]
                    events.append(end)
                    ended.append(row)
                    continue
                row.tokens.append(token)
                events.append(Token(row.index, token, row.text.add(token), None if logprobs is None else logprobs[k], None if top is None else top[k]))
                if row.text.stopped:
                    events.append(self._end(row, "stop"))
                    ended.append(row)
                elif len(row.tokens) >= s.max_tokens:
                    events.append(self._end(row, "length"))
                    ended.append(row)
                else:
                    row.pending = token
        for ticket, events in out.items():
            ticket.deliver(events)
        for row in ended:
            self._leave(row)

    @staticmethod
    def _choose(s: Sampling, scores: torch.Tensor, rng: torch.Generator) -> tuple[torch.Tensor, list[float] | None, list[dict[int, float]] | None]:
        """One request's rows' next tokens (r,) from their scores (r, V), with their log-probabilities and the
        top alternatives when asked for. A temperature under GREEDY_BELOW decodes greedily (dividing by it
        would overflow), as vLLM does."""
        if s.temperature < GREEDY_BELOW:
            chosen = scores.argmax(dim=-1)
        else:
            chosen = sample_from(filtered_logits(scores, temperature=s.temperature, top_p=s.top_p), rng)
        if s.logprobs is None:
            return chosen, None, None
        all_logprobs = F.log_softmax(scores, dim=-1)
        logprobs = all_logprobs.gather(1, chosen[:, None]).squeeze(1).tolist()
        top = None
        if s.logprobs > 0:
            values, ids = all_logprobs.topk(min(s.logprobs, all_logprobs.shape[1]), dim=-1)
            # tokens the run may not write (specials at -inf) are no alternatives, and -inf is no JSON
            top = [{t: v for t, v in zip(i, v) if v != float("-inf")} for i, v in zip(ids.tolist(), values.tolist())]
        return chosen, logprobs, top

    def _end(self, row: Row, reason: str) -> Ended:
        tail = row.text.finish()
        return Ended(row.index, tail, reason, row.text.text, list(row.tokens))

    def _leave(self, row: Row) -> None:
        at = self.rows.index(row)
        moved = self.batch.leave(at)
        if moved is not None:
            self.rows[at] = self.rows[moved]
        self.rows.pop()

    def _drop_cancelled(self) -> None:
        for row in [r for r in self.rows if r.ticket.cancelled]:
            self._leave(row)

    def _fail_all(self, message: str, starting: list[Ticket]) -> None:
        tickets = {row.ticket for row in self.rows} | set(starting)
        while self.rows:
            self._leave(self.rows[-1])
        for ticket in tickets:
            ticket.deliver([Failed(message)])
