"""Beam search: num_beams hypotheses per prompt, over the same window and cache as sampling.

Each step every running hypothesis's continuations compete on their summed log-probability; the best
num_beams go on. A hypothesis ends at end-of-text or a stop string and then scores
sum(logprob) / length ** length_penalty (length: its tokens, end-of-text included). The best num_samples
of the ended hypotheses (and, at the token limit, of the running ones) are returned.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tfcli.generate.events import Chunk, Completion, Event, Finished
from tfcli.generate.sampling import apply_repetition_penalty
from tfcli.generate.stream import CompletionText, text_of

if TYPE_CHECKING:
    from tfcli.generate.decoding import Generator

MINUS_INF = float("-inf")


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


def beam_search(g: Generator, indices: list[int], prompts: list[str], rows: list[list[int]]) -> Iterator[Event]:
    """Decode rows (the prompts `indices`) with beams; yields a Chunk and a Finished per returned completion."""
    s = g.settings
    K, P = s.num_beams, len(rows)
    window, logits = g._open(rows, K)
    started = time.perf_counter()
    seen = g._seen(window, rows, K)
    V = logits.shape[-1]
    eos = g.vocab.eos_id if s.stop_at_eos else None

    def start() -> list[Hypothesis]:  # every beam starts as the prompt: use one
        first = Hypothesis([], [], 0.0, CompletionText(g.token_bytes, s.stop) if s.stop else None)
        return [first] + [Hypothesis([], [], MINUS_INF, None) for _ in range(K - 1)]

    beams = [start() for _ in range(P)]
    ended: list[list[Ended]] = [[] for _ in range(P)]
    done = [False] * P

    def end(p: int, hypothesis: Hypothesis, total: float, reason: str, text: str) -> None:
        length = max(1, len(hypothesis.tokens) + (reason == "eos"))
        ended[p].append(Ended(total / length**s.length_penalty, hypothesis.tokens, hypothesis.logprobs, reason, text))
        ended[p].sort(key=lambda e: -e.score)
        del ended[p][K:]

    def going_on(p: int, candidates: list[Candidate]) -> list[tuple[int, Hypothesis]]:
        """The best K continuations that go on; those among the best K that end are kept in ended[p]."""
        kept: list[tuple[int, Hypothesis]] = []
        for rank, candidate in enumerate(candidates):
            if candidate.total == MINUS_INF:
                break
            parent = beams[p][candidate.beam]
            if candidate.token == eos:
                if rank < K:
                    end(p, parent, candidate.total, "eos", text_of(g.token_bytes, parent.tokens))
                continue
            child = parent.extended(candidate.token, candidate.total, candidate.logprob)
            if child.text is not None and child.text.stopped:
                if rank < K:
                    end(p, child, candidate.total, "stop", child.text.text)
                continue
            kept.append((candidate.beam, child))
            if len(kept) == K:
                break
        return kept

    def finished_prompt(p: int, kept: list[tuple[int, Hypothesis]], step: int) -> bool:
        if not kept:
            return True
        if len(ended[p]) < K:
            return False
        if s.early_stopping:
            return True
        # stop only when no running beam could still beat the worst ended hypothesis
        best = kept[0][1].total
        best_possible = best / (step + 1) ** s.length_penalty if s.length_penalty > 0 else best
        return ended[p][-1].score >= best_possible

    for step in range(s.max_new_tokens):
        scores = logits if seen is None else apply_repetition_penalty(logits, seen, s.repetition_penalty)
        step_logprobs = F.log_softmax(scores, dim=-1)  # (P*K, V)
        raw_logprobs = step_logprobs if seen is None else F.log_softmax(logits, dim=-1)
        beam_scores = torch.tensor([[h.total for h in beams[p]] for p in range(P)], device=g.device)  # (P, K)
        totals = (beam_scores.view(-1, 1) + step_logprobs).view(P, K * V)
        top_totals, top_index = totals.topk(min(2 * K, K * V), dim=1)  # (P, 2K): enough to find K that go on
        top_beam, top_token = (top_index // V).tolist(), (top_index % V).tolist()
        top_totals_list = top_totals.tolist()
        picked_logprobs = raw_logprobs.view(P, K * V).gather(1, top_index).tolist()
        next_rows, next_tokens = [], []
        for p in range(P):
            kept: list[tuple[int, Hypothesis]] = []
            if not done[p]:
                candidates = [Candidate(top_beam[p][r], top_token[p][r], top_totals_list[p][r], picked_logprobs[p][r]) for r in range(len(top_beam[p]))]
                kept = going_on(p, candidates)
                done[p] = finished_prompt(p, kept, step)
            if done[p]:  # a finished prompt's rows idle
                kept = [(0, Hypothesis(beams[p][0].tokens + [g.vocab.pad_id], beams[p][0].logprobs + [0.0], MINUS_INF, None))] * K
            while len(kept) < K:
                beam, first = kept[0]
                kept.append((beam, Hypothesis(first.tokens, first.logprobs, MINUS_INF, None)))
            beams[p] = [hypothesis for _, hypothesis in kept]
            next_rows += [p * K + beam for beam, _ in kept]
            next_tokens += [hypothesis.tokens[-1] for _, hypothesis in kept]
        if all(done) or step == s.max_new_tokens - 1:
            break
        rows_index = torch.tensor(next_rows, dtype=torch.long, device=g.device)
        token_index = torch.tensor(next_tokens, dtype=torch.long, device=g.device)
        window.reorder(rows_index, same_memory=True)  # beams move only among their own prompt's rows
        if seen is not None:
            seen = seen[rows_index]
            seen.scatter_(1, token_index[:, None], True)
        logits = window.push(token_index)
    for p in range(P):
        if not done[p]:  # out of tokens: the running beams compete with the ended hypotheses
            for hypothesis in beams[p]:
                if hypothesis.total > MINUS_INF:
                    end(p, hypothesis, hypothesis.total, "length", text_of(g.token_bytes, hypothesis.tokens))
        for sample_index, e in enumerate(ended[p][: s.num_samples]):
            completion = Completion(
                prompt_index=indices[p],
                sample_index=sample_index,
                prompt=prompts[p],
                prompt_tokens=len(rows[p]),
                text=e.text,
                tokens=e.tokens,
                logprobs=e.logprobs if s.logprobs else None,
                finish_reason=e.reason,
                score=e.score,
            )
            index = indices[p] * s.num_samples + sample_index
            if e.text:
                yield Chunk(index, e.text)
            yield Finished(index, completion)
    g.timing.decode_seconds += time.perf_counter() - started
