"""Beam search: num_beams hypotheses per prompt, over the same window and cache as sampling.

Each step every running hypothesis's continuations compete on their summed log-probability; the best
num_beams go on. A hypothesis ends at end-of-text or a stop string and then scores
sum(logprob) / length ** length_penalty (length: its tokens, end-of-text included). The best num_samples
of the ended hypotheses (and, at the token limit, of the running ones) are returned.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from tfcli.generate.events import Chunk, Completion, Event, Finished, Timing
from tfcli.generate.sampling import apply_repetition_penalty
from tfcli.generate.settings import GenerationSettings
from tfcli.generate.stream import CompletionText
from tfcli.generate.window import DecoderWindow, Vocabulary
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.detokenize import decode_completion, decode_pieces

MINUS_INF = float("-inf")


class Decoder(Protocol):
    """What beam search needs from the decoder it runs in (`decoding.Generator` is one): its settings, tokenizer,
    vocabulary, end ids and device, a window factory, and the clock it adds its decoding time to."""

    settings: GenerationSettings
    tokenizer: TextTokenizer
    vocab: Vocabulary
    end_ids: set[int]  # ids that end a text
    device: torch.device
    timing: Timing

    def open_window(self, rows: list[list[int]], repeat: int) -> tuple[DecoderWindow, torch.Tensor]:
        """A window over the rows (each repeated `repeat` times, adjacent) with the prompts run through it; the next logits."""
        ...

    def seen_tokens(self, rows: list[list[int]], repeat: int) -> torch.Tensor | None:
        """(rows * repeat, vocab) the tokens each row has had, for the repetition penalty; None without one."""
        ...

    def text_context(self, prompt_ids: Sequence[int]) -> Sequence[int]:
        """What a completion's text follows."""
        ...


@dataclasses.dataclass
class Hypothesis:
    """One running beam: its tokens, each one's log-probability, and their summed score (-inf: an idle row).
    `text` follows the tokens when there are stop strings to look for, so each new token is checked once."""

    tokens: list[int]
    logprobs: list[float]
    total: float
    text: CompletionText | None

    def extended(self, token: int, total: float, logprob: float) -> Hypothesis:
        text = None
        if self.text is not None:
            text = self.text.fork()
            text.add(token)
        return Hypothesis(self.tokens + [token], self.logprobs + [logprob], total, text)


@dataclasses.dataclass
class Ended:
    """A hypothesis that ended: its length-normalised score, tokens, log-probabilities, why, and its text."""

    score: float
    tokens: list[int]
    logprobs: list[float]
    reason: str  # eos | stop | length
    text: str


@dataclasses.dataclass
class Candidate:
    """A continuation on offer this step: beam `beam` extended by `token`."""

    beam: int
    token: int
    total: float  # the beam's score plus the token's (repetition-penalised) log-probability
    logprob: float  # the model's own log-probability of the token


def beam_search(g: Decoder, indices: list[int], prompts: list[str], rows: list[list[int]]) -> Iterator[Event]:
    """Decode rows (the prompts `indices`) with beams; yields a Chunk and a Finished per returned completion."""
    s = g.settings
    window, logits = g.open_window(rows, s.num_beams)
    started = time.perf_counter()
    seen = g.seen_tokens(rows, s.num_beams)
    search = _Search(g, [g.text_context(r) for r in rows])
    for step in range(s.max_new_tokens):
        next_rows, next_tokens = search.step(logits, seen, step)
        if all(search.done) or step == s.max_new_tokens - 1:
            break
        rows_index = torch.tensor(next_rows, dtype=torch.long, device=g.device)
        token_index = torch.tensor(next_tokens, dtype=torch.long, device=g.device)
        window.reorder(rows_index, same_memory=True)  # beams move only among their own prompt's rows
        if seen is not None:
            seen = seen[rows_index]
            seen.scatter_(1, token_index[:, None], True)
        logits = window.push(token_index, next_tokens)
    for p in range(len(rows)):
        search.end_running(p)
        yield from _events(g, search.ended[p], indices[p], prompts[p], rows[p])
    g.timing.decode_seconds += time.perf_counter() - started


class _Search:
    """The state of one beam search over P prompts of K beams each: per prompt its running hypotheses
    (`beams`), the best K that ended (`ended`, best first) and whether it is done."""

    def __init__(self, g: Decoder, contexts: list[Sequence[int]]) -> None:
        self.g, self.s = g, g.settings
        self.K, self.P = self.s.num_beams, len(contexts)
        self.contexts = contexts  # per prompt, the ids its texts follow
        self.end_ids = g.end_ids if self.s.stop_at_eos else set()
        self.beams = [self._start(context) for context in contexts]
        self.ended: list[list[Ended]] = [[] for _ in contexts]
        self.done = [False] * self.P

    def text_of(self, p: int, tokens: list[int]) -> str:
        return decode_completion(self.g.tokenizer, self.contexts[p], tokens)

    def _start(self, context: Sequence[int]) -> list[Hypothesis]:
        """Every beam starts as the prompt: use one."""
        first = Hypothesis([], [], 0.0, CompletionText(self.g.tokenizer, context, self.s.stop) if self.s.stop else None)
        return [first] + [Hypothesis([], [], MINUS_INF, None) for _ in range(self.K - 1)]

    def step(self, logits: torch.Tensor, seen: torch.Tensor | None, step: int) -> tuple[list[int], list[int]]:
        """Extend every prompt's beams by this step's logits (P*K, V); returns the rows the next step reads
        (which beam each new row continues) and the token each row feeds."""
        candidates = self._candidates(logits, seen)
        next_rows, next_tokens = [], []
        for p in range(self.P):
            kept: list[tuple[int, Hypothesis]] = []
            if not self.done[p]:
                kept = self._going_on(p, candidates[p])
                self.done[p] = self._finished_prompt(p, kept, step)
            kept = self._fill(p, kept)
            self.beams[p] = [hypothesis for _, hypothesis in kept]
            next_rows += [p * self.K + beam for beam, _ in kept]
            next_tokens += [hypothesis.tokens[-1] for _, hypothesis in kept]
        return next_rows, next_tokens

    def _candidates(self, logits: torch.Tensor, seen: torch.Tensor | None) -> list[list[Candidate]]:
        """Per prompt, the best 2K continuations of its beams, best first: enough to find K that go on."""
        s, K, P = self.s, self.K, self.P
        V = logits.shape[-1]
        scores = logits if seen is None else apply_repetition_penalty(logits, seen, s.repetition_penalty)
        step_logprobs = F.log_softmax(scores, dim=-1)  # (P*K, V)
        raw_logprobs = step_logprobs if seen is None else F.log_softmax(logits, dim=-1)
        beam_scores = torch.tensor([[h.total for h in self.beams[p]] for p in range(P)], device=self.g.device)  # (P, K)
        totals = (beam_scores.view(-1, 1) + step_logprobs).view(P, K * V)
        top_totals, top_index = totals.topk(min(2 * K, K * V), dim=1)  # (P, 2K)
        top_beam, top_token = (top_index // V).tolist(), (top_index % V).tolist()
        top_totals_list = top_totals.tolist()
        picked_logprobs = raw_logprobs.view(P, K * V).gather(1, top_index).tolist()
        return [[Candidate(top_beam[p][r], top_token[p][r], top_totals_list[p][r], picked_logprobs[p][r]) for r in range(len(top_beam[p]))] for p in range(P)]

    def _end(self, p: int, hypothesis: Hypothesis, total: float, reason: str, text: str) -> None:
        length = max(1, len(hypothesis.tokens) + (reason == "eos"))
        ended = self.ended[p]
        ended.append(Ended(total / length**self.s.length_penalty, hypothesis.tokens, hypothesis.logprobs, reason, text))
        ended.sort(key=lambda e: -e.score)
        del ended[self.K :]

    def _going_on(self, p: int, candidates: list[Candidate]) -> list[tuple[int, Hypothesis]]:
        """The best K continuations that go on; those among the best K that end are kept in ended[p]."""
        K = self.K
        kept: list[tuple[int, Hypothesis]] = []
        for rank, candidate in enumerate(candidates):
            if candidate.total == MINUS_INF:
                break
            parent = self.beams[p][candidate.beam]
            if candidate.token in self.end_ids:
                if rank < K:
                    self._end(p, parent, candidate.total, "eos", self.text_of(p, parent.tokens))
                continue
            child = parent.extended(candidate.token, candidate.total, candidate.logprob)
            if child.text is not None and child.text.stopped:
                if rank < K:
                    self._end(p, child, candidate.total, "stop", child.text.text)
                continue
            kept.append((candidate.beam, child))
            if len(kept) == K:
                break
        return kept

    def _finished_prompt(self, p: int, kept: list[tuple[int, Hypothesis]], step: int) -> bool:
        s = self.s
        if not kept:
            return True
        if len(self.ended[p]) < self.K:
            return False
        if s.early_stopping:
            return True
        # stop only when no running beam could still beat the worst ended hypothesis
        best = kept[0][1].total
        best_possible = best / (step + 1) ** s.length_penalty if s.length_penalty > 0 else best
        return self.ended[p][-1].score >= best_possible

    def _fill(self, p: int, kept: list[tuple[int, Hypothesis]]) -> list[tuple[int, Hypothesis]]:
        """K rows for the prompt: a finished prompt's rows idle (padding), and rows no continuation went
        to repeat the first one with a score of -inf."""
        if self.done[p]:
            first = self.beams[p][0]
            return [(0, Hypothesis(first.tokens + [self.g.vocab.pad_id], first.logprobs + [0.0], MINUS_INF, None))] * self.K
        while len(kept) < self.K:
            beam, first = kept[0]
            kept.append((beam, Hypothesis(first.tokens, first.logprobs, MINUS_INF, None)))
        return kept

    def end_running(self, p: int) -> None:
        """Out of tokens: the running beams of an unfinished prompt compete with its ended hypotheses."""
        if self.done[p]:
            return
        for hypothesis in self.beams[p]:
            if hypothesis.total > MINUS_INF:
                self._end(p, hypothesis, hypothesis.total, "length", self.text_of(p, hypothesis.tokens))


def _events(g: Decoder, ended: list[Ended], prompt_index: int, prompt: str, prompt_ids: list[int]) -> Iterator[Event]:
    """A Chunk (when there is text) and a Finished for each of the best num_samples ended hypotheses."""
    s = g.settings
    for sample_index, e in enumerate(ended[: s.num_samples]):
        completion = Completion(
            prompt_index=prompt_index,
            sample_index=sample_index,
            prompt=prompt,
            prompt_tokens=len(prompt_ids),
            text=e.text,
            tokens=e.tokens,
            logprobs=e.logprobs if s.logprobs else None,
            finish_reason=e.reason,
            score=e.score,
            token_texts=decode_pieces(g.tokenizer, g.text_context(prompt_ids), e.tokens),
        )
        index = prompt_index * s.num_samples + sample_index
        if e.text:
            yield Chunk(index, e.text)
        yield Finished(index, completion)
