"""The decoding loops: greedy and sampling, and beam search, over a preallocated KV cache, for decoders and
encoder-decoders, on batches of left-padded prompts. The loops yield events (text chunks, finished
completions, notices); they never print.

Each step feeds one new token per row through the cache and scores only the last position. Past the
context the window slides: when it is full, the last `keep` tokens are run again to rebuild the cache
(this works for learned, sinusoidal and rotary positions alike, since every position restarts from 0).
Rows of different lengths are left-padded; each row's positions count its own real tokens, so a batched
row decodes exactly as it would alone.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from tfcli.errors import TfcliError
from tfcli.generate.sampling import apply_repetition_penalty, choose_next
from tfcli.generate.settings import GenerationSettings
from tfcli.generate.stream import CompletionText, TokenBytes, text_of
from tfcli.model.attention import KVCache
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer


@dataclasses.dataclass
class Completion:
    prompt_index: int
    sample_index: int
    prompt: str
    prompt_tokens: int  # tokens of the prompt the model saw (after any cropping)
    text: str
    tokens: list[int]  # generated ids (the end-of-text id is not included)
    logprobs: list[float] | None  # the model's log-probability of each generated token (settings.logprobs)
    finish_reason: str  # eos | stop | length
    score: float | None = None  # beam search: sum of log-probabilities / length ** length_penalty


@dataclasses.dataclass
class Chunk:
    """Text of completion `completion` (prompt_index * num_samples + sample_index), safe to show now."""

    completion: int
    text: str


@dataclasses.dataclass
class Finished:
    completion: int
    result: Completion


@dataclasses.dataclass
class Notice:
    """Something the user should know (a cropped prompt); the CLI prints it on stderr as `level: message`."""

    message: str
    level: str = "warning"  # warning | note


@dataclasses.dataclass
class Timing:
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_seconds: float = 0.0  # the prompts (and the encoder) through the model
    decode_seconds: float = 0.0  # everything after: one step per new token

    @property
    def total_seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens,
                "prefill_seconds": round(self.prefill_seconds, 6), "decode_seconds": round(self.decode_seconds, 6),
                "total_seconds": round(self.total_seconds, 6), "tokens_per_second": round(self.tokens_per_second, 3)}


@dataclasses.dataclass
class Done:
    completions: list[Completion]
    timing: Timing
    seed: int | None


Event = Chunk | Finished | Notice | Done


@dataclasses.dataclass
class Vocabulary:
    """What the loop needs from the tokenizer: the ids it may choose and the end-of-text id."""

    limit: int  # ids >= limit are never chosen (a model's vocabulary may be larger than its tokenizer's)
    eos_id: int | None
    pad_id: int
    suppressed: list[int]  # special ids that are never generated (pad, mask, cls, unk)

    @classmethod
    def of(cls, tokenizer: TextTokenizer, model_vocab: int) -> Vocabulary:
        specials = tokenizer.special_ids
        eos = specials.get("eos")
        suppressed = sorted({i for role, i in specials.items() if role != "eos" and i != eos and i < model_vocab})
        pad = specials.get("pad", eos if eos is not None else 0)
        return cls(limit=min(tokenizer.vocab_size, model_vocab), eos_id=eos, pad_id=pad, suppressed=suppressed)


class DecoderWindow:
    """Each row's tokens inside the context window, which of them are real (not left padding), and the KV
    cache over them. `start` runs the prompts, `push` one new token per row; both return the next-token
    logits (B, vocab limit) of every row."""

    def __init__(self, model: Transformer, batch: int, vocab: Vocabulary, *, use_cache: bool = True, keep: int | None = None,
                 memory: torch.Tensor | None = None, memory_padding: torch.Tensor | None = None) -> None:
        config = model.config
        self.model, self.vocab = model, vocab
        self.block = config.block_size
        self.keep = min(self.block, keep if keep is not None else max(1, self.block - self.block // 4))
        device = model.lm_head.weight.device
        dtype = model.lm_head.weight.dtype
        self.ids = torch.zeros(batch, self.block, dtype=torch.long, device=device)
        self.real = torch.zeros(batch, self.block, dtype=torch.bool, device=device)
        self.n_real = torch.zeros(batch, dtype=torch.long, device=device)  # real tokens per row in the window
        self.length = 0
        self.padded = False
        self.cache = KVCache(config, batch, self.block, dtype, device) if use_cache else None
        self.memory, self.memory_padding = memory, memory_padding
        self.slides = 0
        # One row: a faster step that tfcli.accel attached to the model, where it has one for it (the C step).
        bind = getattr(model, "fast_decode_step", None)
        self.fast_step = bind(model, self.cache) if bind is not None and self.cache is not None and batch == 1 else None
        if vocab.suppressed:
            self._suppressed: torch.Tensor | None = torch.tensor(vocab.suppressed, dtype=torch.long, device=device)
        else:
            self._suppressed = None

    @property
    def device(self) -> torch.device:
        return self.ids.device

    def start(self, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """ids, real (B, T): left-padded prompts, T <= block size."""
        T = ids.shape[1]
        assert 0 < T <= self.block, "prompts are cropped to the window before they get here"
        self.ids[:, :T] = ids
        self.real[:, :T] = real
        self.length = T
        return self._run_window()

    def push(self, next_ids: torch.Tensor) -> torch.Tensor:
        """Append one token per row (B,) and return the logits that follow it."""
        if self.length == self.block:  # full: slide, keeping the last keep - 1 tokens and the new one
            kept = self.keep - 1
            self.ids[:, :kept] = self.ids[:, self.length - kept:self.length].clone()
            self.real[:, :kept] = self.real[:, self.length - kept:self.length].clone()
            self.length = kept
            self._append(next_ids)
            self.slides += 1
            return self._run_window()
        self._append(next_ids)
        if self.cache is None:
            return self._run_window()
        L = self.length
        if self.fast_step is not None and not self.padded and self.fast_step.usable():
            return self._scores(self.fast_step(int(next_ids[0])))
        if self.padded:
            hidden = self.model.decode(self.ids[:, L - 1:L], self.real[:, :L], memory=self.memory,
                                       memory_padding=self.memory_padding, cache=self.cache,
                                       positions=(self.n_real - 1).unsqueeze(1))  # (B, 1, d)
        else:
            hidden = self.model.decode(self.ids[:, L - 1:L], memory=self.memory, memory_padding=self.memory_padding, cache=self.cache)
        return self._logits(hidden[:, -1])

    def extend(self, ids: list[int]) -> torch.Tensor:
        """Batch of one, unpadded, with a cache: append several tokens (a conversation's next turn) and run
        only them. They must fit in the window."""
        assert self.cache is not None and not self.padded and self.length + len(ids) <= self.block
        new = torch.tensor([ids], dtype=torch.long, device=self.device)  # (1, T)
        L, T = self.length, len(ids)
        self.ids[:, L:L + T] = new
        self.real[:, L:L + T] = True
        self.length = L + T
        self.n_real += T
        hidden = self.model.decode(new, memory=self.memory, memory_padding=self.memory_padding, cache=self.cache)
        return self._logits(hidden[:, -1])

    def truncate(self, length: int) -> None:
        """Unpadded windows: forget every token after the first `length` (their cache entries too)."""
        assert not self.padded and 0 < length <= self.length
        self.length = length
        self.n_real.fill_(length)
        if self.cache is not None:
            self.cache.length = length

    def tokens(self, row: int = 0) -> list[int]:
        """The real tokens of a row in the window, oldest first."""
        return self.ids[row, :self.length][self.real[row, :self.length]].tolist()

    def reorder(self, rows: torch.Tensor, *, same_memory: bool = False) -> None:
        """Beam search: row i becomes a copy of row rows[i] (tokens, padding and cache). same_memory: every
        row moves within rows that share one source, so the encoder memory and cross keys stay as they are."""
        L = self.length
        self.ids[:, :L] = self.ids[rows, :L]
        self.real[:, :L] = self.real[rows, :L]
        self.n_real = self.n_real[rows]
        if self.cache is not None:
            self.cache.keys[:, :, :, :L] = self.cache.keys[:, rows, :, :L]
            self.cache.values[:, :, :, :L] = self.cache.values[:, rows, :, :L]
            if not same_memory:
                self.cache.cross = [None if kv is None else (kv[0][rows], kv[1][rows]) for kv in self.cache.cross]
        if self.memory is not None and not same_memory:
            self.memory = self.memory[rows]
            self.memory_padding = None if self.memory_padding is None else self.memory_padding[rows]

    def _append(self, next_ids: torch.Tensor) -> None:
        self.ids[:, self.length] = next_ids
        self.real[:, self.length] = True
        self.n_real += 1
        self.length += 1

    def _run_window(self) -> torch.Tensor:
        """Run every token in the window (no cache, or a fresh one) and return the last position's logits."""
        L = self.length
        ids, real = self.ids[:, :L], self.real[:, :L]
        self.n_real = real.sum(dim=1)
        self.padded = bool((self.n_real < L).any())
        positions = (real.long().cumsum(dim=1) - 1).clamp(min=0) if self.padded else None  # (B, L)
        if self.cache is not None:
            self.cache.length = 0  # rebuilt from the window; cross-attention keys/values stay
        hidden = self.model.decode(ids, real if self.padded else None, memory=self.memory, memory_padding=self.memory_padding,
                                   cache=self.cache, positions=positions)
        return self._logits(hidden[:, -1])

    def _logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """Next-token scores (B, vocab limit) from the last hidden state."""
        return self._scores(self.model.lm_head(last_hidden))

    def _scores(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logits (B, vocab) cut to the tokenizer's vocabulary, specials other than eos at -inf."""
        logits = logits[:, :self.vocab.limit]  # (B, V)
        if logits.dtype != torch.float32:
            logits = logits.float()
        if self._suppressed is not None:
            logits = logits.index_fill(1, self._suppressed, float("-inf"))
        return logits


def _pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device, *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, longest) ids and real-token mask. Left padding (prompts) makes every row end at the last column;
    right padding (an encoder's sources) starts every row at position 0."""
    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), longest), dtype=torch.bool)
    for i, r in enumerate(rows):
        where = slice(longest - len(r), longest) if left else slice(0, len(r))
        ids[i, where] = torch.tensor(list(r), dtype=torch.long)
        real[i, where] = True
    return ids.to(device), real.to(device)


class Generator:
    """Decodes prompts with one model and tokenizer. `run(prompts)` yields Chunk, Finished and Notice
    events and finally Done with every completion (in prompt order) and the timing."""

    def __init__(self, model: Transformer, tokenizer: TextTokenizer, settings: GenerationSettings, *, batch_size: int = 16) -> None:
        config = model.config
        if config.arch == "encoder":
            raise TfcliError("this run is an encoder (masked LM); it fills in masks rather than writing text",
                             hint='use --fill-mask "The [MASK] sat on the mat"' + (" or --classify TEXT" if config.n_classes else ""))
        if batch_size < 1:
            raise TfcliError(f"--batch-size must be at least 1, not {batch_size}")
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.batch_size = batch_size
        self.vocab = Vocabulary.of(tokenizer, config.vocab_size)
        if config.arch == "encoder-decoder" and self.vocab.eos_id is None:
            tokenizer.require("eos")  # the decoder starts from it
        self.token_bytes = TokenBytes(tokenizer)
        self.device = model.lm_head.weight.device
        self.seed = settings.seed
        if settings.strategy == "sample" and not settings.greedy and self.seed is None:
            self.seed = secrets.randbits(31)
        self.rng: torch.Generator | None = None
        if self.seed is not None:
            self.rng = torch.Generator(device=self.device)
            self.rng.manual_seed(self.seed)
        self.timing = Timing()

    # -- prompts -----------------------------------------------------------------------------------------

    def encode_prompts(self, prompts: Sequence[str]) -> tuple[list[list[int]], list[Notice]]:
        """Token ids of each prompt, cropped to fit: a decoder keeps the last block-size tokens of a long
        prompt (it continues the end), an encoder-decoder the first block-size tokens of a long source (as
        training does). Each crop is a notice. An empty prompt is an error."""
        encoded = self.tokenizer.encode_batch(list(prompts))
        block = self.model.config.block_size
        notices = []
        for i, ids in enumerate(encoded):
            if not ids:
                where = f"prompt {i + 1}" if len(prompts) > 1 else "the prompt"
                raise TfcliError(f"{where} is empty", hint="pass some text to continue with --prompt")
            if len(ids) > block:
                where = f"prompt {i + 1}" if len(prompts) > 1 else "the prompt"
                if self.model.config.arch == "decoder":
                    notices.append(Notice(f"{where} has {len(ids):,} tokens, more than the context ({block:,}); keeping the last {block:,}"))
                    encoded[i] = ids[-block:]
                else:
                    notices.append(Notice(f"{where} has {len(ids):,} tokens, more than the context ({block:,}); keeping the first {block:,}"))
                    encoded[i] = ids[:block]
        return encoded, notices

    # -- the loops ---------------------------------------------------------------------------------------

    LONG_RUN = 10  # --max-new-tokens above this many contexts is said up front (a typo shows before it runs)

    def length_notice(self) -> Notice | None:
        """A note when --max-new-tokens is more than LONG_RUN times the context: allowed (past the context the
        window slides, for as long as asked), but said up front, so that a typo is seen."""
        block, asked = self.model.config.block_size, self.settings.max_new_tokens
        if asked <= self.LONG_RUN * block:
            return None
        return Notice(f"--max-new-tokens {asked:,} is {asked / block:,.0f}x the context ({block:,} tokens): past the context "
                      "the window slides and decoding goes on for as long as asked (Ctrl-C stops it)", level="note")

    def run(self, prompts: Sequence[str]) -> Iterator[Event]:
        """Decode text prompts (a note first when asked for many contexts' worth; a long prompt cropped, with a Notice)."""
        long_run = self.length_notice()
        if long_run is not None:
            yield long_run
        encoded, notices = self.encode_prompts(prompts)
        yield from notices
        yield from self.run_ids(encoded, prompts)

    @torch.inference_mode()
    def run_ids(self, encoded: Sequence[Sequence[int]], prompts: Sequence[str] | None = None) -> Iterator[Event]:
        """Decode prompts given as token ids (each non-empty and at most block-size long)."""
        block = self.model.config.block_size
        if any(not 0 < len(ids) <= block for ids in encoded):
            raise TfcliError(f"every prompt must have between 1 and {block} tokens")
        encoded = [list(ids) for ids in encoded]
        if prompts is None:
            prompts = [text_of(self.token_bytes, ids) for ids in encoded]
        s = self.settings
        n = s.num_samples
        results: dict[int, Completion] = {}
        per_batch = max(1, self.batch_size // (s.num_beams if s.strategy == "beam" else n))
        for first in range(0, len(encoded), per_batch):
            indices = list(range(first, min(first + per_batch, len(encoded))))
            if s.strategy == "beam":
                events = self._beam(indices, [prompts[i] for i in indices], [encoded[i] for i in indices])
            else:
                events = self._sample(indices, [prompts[i] for i in indices], [encoded[i] for i in indices])
            for event in events:
                if isinstance(event, Finished):
                    results[event.completion] = event.result
                yield event
        completions = [results[i] for i in sorted(results)]
        self.timing.new_tokens = sum(len(c.tokens) for c in completions)
        yield Done(completions, self.timing, self.seed)

    def _open(self, rows: list[list[int]], repeat: int) -> tuple[DecoderWindow, torch.Tensor]:
        """A window over the rows (each repeated `repeat` times, adjacent), with the prompts run through it."""
        started = time.perf_counter()
        model, config = self.model, self.model.config
        B = len(rows) * repeat
        memory = memory_padding = None
        if config.arch == "encoder-decoder":
            source_ids, source_real = _pad(rows, self.vocab.pad_id, self.device, left=False)
            padded = not bool(source_real.all())
            memory = model.encode(source_ids, source_real if padded else None)  # (P, S, d), once per source
            memory_padding = source_real if padded else None
            if repeat > 1:
                memory = memory.repeat_interleave(repeat, dim=0)
                memory_padding = None if memory_padding is None else memory_padding.repeat_interleave(repeat, dim=0)
            ids = torch.full((B, 1), self.vocab.eos_id, dtype=torch.long, device=self.device)  # decoding starts from eos
            real = torch.ones_like(ids, dtype=torch.bool)
        else:
            ids, real = _pad([r for r in rows for _ in range(repeat)], self.vocab.pad_id, self.device, left=True)
        window = DecoderWindow(model, B, self.vocab, use_cache=self.settings.use_cache, keep=self.settings.slide_keep,
                               memory=memory, memory_padding=memory_padding)
        logits = window.start(ids, real)
        self.timing.prefill_seconds += time.perf_counter() - started
        self.timing.prompt_tokens += sum(len(r) for r in rows) * repeat
        return window, logits

    def _seen(self, window: DecoderWindow, rows: list[list[int]], repeat: int) -> torch.Tensor | None:
        if self.settings.repetition_penalty == 1.0:
            return None
        seen = torch.zeros(len(rows) * repeat, self.vocab.limit, dtype=torch.bool, device=self.device)
        if self.model.config.arch == "decoder":  # a decoder's prompt is part of its text; a source is not
            for i, r in enumerate(rows):
                ids = torch.tensor([t for t in r if t < self.vocab.limit], dtype=torch.long, device=self.device)
                seen[i * repeat:(i + 1) * repeat, ids] = True
        return seen

    def _sample(self, indices: list[int], prompts: list[str], rows: list[list[int]]) -> Iterator[Event]:
        """Greedy or sampling for a batch of prompts, each repeated num_samples times."""
        s = self.settings
        n = s.num_samples
        window, logits = self._open(rows, n)
        started = time.perf_counter()
        seen = self._seen(window, rows, n)
        B = len(rows) * n
        completion_ids = [indices[b // n] * n + b % n for b in range(B)]
        texts = [CompletionText(self.token_bytes, s.stop) for _ in range(B)]
        tokens: list[list[int]] = [[] for _ in range(B)]
        logprobs: list[list[float]] = [[] for _ in range(B)]
        active = [True] * B
        remaining = B
        eos = self.vocab.eos_id if s.stop_at_eos else None
        greedy = s.greedy

        def finish(b: int, reason: str) -> Iterator[Event]:
            nonlocal remaining
            active[b] = False
            remaining -= 1
            tail = texts[b].finish()
            if tail:
                yield Chunk(completion_ids[b], tail)
            yield Finished(completion_ids[b], Completion(
                prompt_index=indices[b // n], sample_index=b % n, prompt=prompts[b // n], prompt_tokens=len(rows[b // n]),
                text=texts[b].text, tokens=tokens[b], logprobs=logprobs[b] if s.logprobs else None, finish_reason=reason))

        for step in range(s.max_new_tokens):
            scores = logits if seen is None else apply_repetition_penalty(logits, seen, s.repetition_penalty)
            chosen = choose_next(scores, greedy=greedy, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                 min_p=s.min_p, generator=self.rng)  # (B,)
            chosen_list = chosen.tolist()
            chosen_logprobs = F.log_softmax(logits, dim=-1).gather(1, chosen[:, None]).squeeze(1).tolist() if s.logprobs else None
            for b in range(B):
                if not active[b]:
                    continue
                token = chosen_list[b]
                if token == eos:
                    yield from finish(b, "eos")
                    continue
                tokens[b].append(token)
                if chosen_logprobs is not None:
                    logprobs[b].append(chosen_logprobs[b])
                chunk = texts[b].add(token)
                if chunk:
                    yield Chunk(completion_ids[b], chunk)
                if texts[b].stopped:
                    yield from finish(b, "stop")
            if remaining == 0 or step == s.max_new_tokens - 1:
                break  # the last token is never run through the model
            if seen is not None:
                seen.scatter_(1, chosen[:, None], True)
            logits = window.push(chosen)
        for b in range(B):
            if active[b]:
                yield from finish(b, "length")
        self.timing.decode_seconds += time.perf_counter() - started

    def _beam(self, indices: list[int], prompts: list[str], rows: list[list[int]]) -> Iterator[Event]:
        """Beam search: num_beams hypotheses per prompt. Each step every beam's continuations compete on
        their summed log-probability; a hypothesis ends at eos or a stop string and then scores
        sum(logprob) / length ** length_penalty (length: its tokens, eos included). The best num_samples
        of the finished hypotheses (and, at the token limit, of the running beams) are returned."""
        s = self.settings
        K, P = s.num_beams, len(rows)
        window, logits = self._open(rows, K)
        started = time.perf_counter()
        seen = self._seen(window, rows, K)
        V = logits.shape[-1]
        eos = self.vocab.eos_id if s.stop_at_eos else None
        minus_inf = float("-inf")
        scores_now = [[0.0] + [minus_inf] * (K - 1) for _ in range(P)]  # every beam starts as the prompt: use one
        beam_tokens: list[list[list[int]]] = [[[] for _ in range(K)] for _ in range(P)]
        beam_logprobs: list[list[list[float]]] = [[[] for _ in range(K)] for _ in range(P)]
        finished: list[list[tuple[float, list[int], list[float], str, str]]] = [[] for _ in range(P)]
        done = [False] * P

        def add_hypothesis(p: int, total: float, toks: list[int], lps: list[float], reason: str, text: str) -> None:
            length = max(1, len(toks) + (reason == "eos"))
            finished[p].append((total / length ** s.length_penalty, toks, lps, reason, text))
            finished[p].sort(key=lambda h: -h[0])
            del finished[p][K:]

        for step in range(s.max_new_tokens):
            scores = logits if seen is None else apply_repetition_penalty(logits, seen, s.repetition_penalty)
            step_logprobs = F.log_softmax(scores, dim=-1)  # (P*K, V)
            raw_logprobs = step_logprobs if seen is None else F.log_softmax(logits, dim=-1)
            beam_scores = torch.tensor(scores_now, device=self.device)  # (P, K)
            totals = (beam_scores.view(-1, 1) + step_logprobs).view(P, K * V)
            top_totals, top_index = totals.topk(min(2 * K, K * V), dim=1)  # (P, 2K): enough to find K that go on
            top_beam, top_token = (top_index // V).tolist(), (top_index % V).tolist()
            top_totals_list = top_totals.tolist()
            picked_logprobs = raw_logprobs.view(P, K * V).gather(1, top_index).tolist()
            next_rows, next_tokens = [], []
            for p in range(P):
                going_on: list[tuple[int, int, float, float]] = []  # (beam, token, total, token logprob)
                if not done[p]:
                    for rank in range(len(top_beam[p])):
                        beam, token, total = top_beam[p][rank], top_token[p][rank], top_totals_list[p][rank]
                        if total == minus_inf:
                            break
                        lp = picked_logprobs[p][rank]
                        if token == eos:
                            if rank < K:
                                toks = beam_tokens[p][beam]
                                add_hypothesis(p, total, toks, beam_logprobs[p][beam], "eos", text_of(self.token_bytes, toks))
                            continue
                        if s.stop:
                            toks = beam_tokens[p][beam] + [token]
                            text = CompletionText(self.token_bytes, s.stop)
                            for t in toks:
                                text.add(t)
                            if text.stopped:
                                if rank < K:
                                    add_hypothesis(p, total, toks, beam_logprobs[p][beam] + [lp], "stop", text.text)
                                continue
                        going_on.append((beam, token, total, lp))
                        if len(going_on) == K:
                            break
                    if not going_on:
                        done[p] = True
                    elif len(finished[p]) >= K:
                        if s.early_stopping:
                            done[p] = True
                        else:  # stop only when no running beam could still beat the worst finished hypothesis
                            best = going_on[0][2]
                            best_possible = best / (step + 1) ** s.length_penalty if s.length_penalty > 0 else best
                            done[p] = finished[p][-1][0] >= best_possible
                if done[p]:
                    going_on = [(0, self.vocab.pad_id, minus_inf, 0.0)] * K  # a finished prompt's rows idle
                while len(going_on) < K:
                    going_on.append((going_on[0][0], going_on[0][1], minus_inf, 0.0))
                beam_tokens[p] = [beam_tokens[p][beam] + [token] for beam, token, _, _ in going_on]
                beam_logprobs[p] = [beam_logprobs[p][beam] + [lp] for beam, _, _, lp in going_on]
                scores_now[p] = [total for _, _, total, _ in going_on]
                next_rows += [p * K + beam for beam, _, _, _ in going_on]
                next_tokens += [token for _, token, _, _ in going_on]
            if all(done) or step == s.max_new_tokens - 1:
                break
            rows_index = torch.tensor(next_rows, dtype=torch.long, device=self.device)
            token_index = torch.tensor(next_tokens, dtype=torch.long, device=self.device)
            window.reorder(rows_index, same_memory=True)  # beams move only among their own prompt's rows
            if seen is not None:
                seen = seen[rows_index]
                seen.scatter_(1, token_index[:, None], True)
            logits = window.push(token_index)
        for p in range(P):
            if not done[p]:  # out of tokens: the running beams compete with the finished hypotheses
                for k in range(K):
                    if scores_now[p][k] > minus_inf:
                        toks = beam_tokens[p][k]
                        add_hypothesis(p, scores_now[p][k], toks, beam_logprobs[p][k], "length", text_of(self.token_bytes, toks))
            for sample_index, (score, toks, lps, reason, text) in enumerate(finished[p][:s.num_samples]):
                completion = Completion(prompt_index=indices[p], sample_index=sample_index, prompt=prompts[p],
                                        prompt_tokens=len(rows[p]), text=text, tokens=toks,
                                        logprobs=lps if s.logprobs else None, finish_reason=reason, score=score)
                index = indices[p] * s.num_samples + sample_index
                if text:
                    yield Chunk(index, text)
                yield Finished(index, completion)
        self.timing.decode_seconds += time.perf_counter() - started


class Conversation:
    """An interactive session with a decoder: every turn (the user's line and the model's reply, each ending in
    a newline) stays in the context. The KV cache carries over from turn to turn: only the tokens that differ
    from what the window already holds are run."""

    def __init__(self, generator: Generator) -> None:
        if generator.model.config.arch != "decoder":
            raise TfcliError("--interactive needs a decoder run (a conversation continues one text)",
                             hint="for an encoder-decoder, pass --prompt-file - and one source per line")
        if generator.settings.strategy == "beam" or generator.settings.num_samples > 1:
            raise TfcliError("--interactive replies with one text at a time", hint="drop --num-beams and --num-samples")
        self.generator = generator
        self.history: list[int] = []  # every token of the conversation so far
        self.window: DecoderWindow | None = None
        self.reused = 0  # tokens of the last turn's context found already in the cache

    def reset(self) -> None:
        """Forget the conversation."""
        self.history, self.window = [], None

    def abandon_reply(self) -> None:
        """A reply was interrupted: it is not part of the conversation, and the cache may be half-written."""
        self.window = None

    @torch.inference_mode()
    def reply(self, line: str) -> Iterator[Event]:
        """Add the user's line to the conversation and yield the reply as it is made (Chunk events, then
        Finished). The reply ends at end-of-text, a stop string or the token limit."""
        g, s = self.generator, self.generator.settings
        if not line.strip():
            raise TfcliError("the line is empty", hint="type some text; /reset forgets the conversation, /quit leaves")
        started = time.perf_counter()
        turn = g.tokenizer.encode(line + "\n")
        self.history += turn
        block = g.model.config.block_size
        window_keep = max(1, block - block // 4) if s.slide_keep is None else min(block, s.slide_keep)
        context = self.history if len(self.history) <= block else self.history[-window_keep:]
        if len(turn) > len(context):
            yield Notice(f"the line has {len(turn):,} tokens, more than the context keeps ({len(context):,}); "
                         f"the model sees its last {len(context):,}")
        logits = self._prime(context)
        g.timing.prefill_seconds += time.perf_counter() - started
        started = time.perf_counter()
        window = self.window
        assert window is not None
        text = CompletionText(g.token_bytes, s.stop)
        tokens: list[int] = []
        eos = g.vocab.eos_id if s.stop_at_eos else None
        reason = "length"
        for step in range(s.max_new_tokens):
            chosen = choose_next(logits, greedy=s.greedy, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                 min_p=s.min_p, generator=g.rng)
            token = int(chosen[0])
            if token == eos:
                reason = "eos"
                break
            tokens.append(token)
            chunk = text.add(token)
            if chunk:
                yield Chunk(0, chunk)
            if text.stopped:
                reason = "stop"
                break
            if step < s.max_new_tokens - 1:
                logits = window.push(chosen)
        tail = text.finish()
        if tail:
            yield Chunk(0, tail)
        g.timing.decode_seconds += time.perf_counter() - started
        g.timing.new_tokens += len(tokens)
        # the reply as it was shown (a stop string cut off, end-of-text dropped) is what the next turn sees
        self.history += g.tokenizer.encode(text.text + "\n")
        yield Finished(0, Completion(0, 0, line, len(context), text.text, tokens, None, reason))

    def _prime(self, context: list[int]) -> torch.Tensor:
        """Make the window hold `context` and return the logits after it, reusing the longest common prefix."""
        g = self.generator
        window = self.window
        if window is not None and window.cache is not None and not window.padded:
            held = window.tokens()
            common = 0
            for a, b in zip(held, context):
                if a != b:
                    break
                common += 1
            common = min(common, len(context) - 1)  # at least one token runs, to give the next logits
            if common > 0:
                window.truncate(common)
                self.reused = common
                return window.extend(context[common:])
        self.reused = 0
        self.window = DecoderWindow(g.model, 1, g.vocab, use_cache=g.settings.use_cache, keep=g.settings.slide_keep)
        ids = torch.tensor([context], dtype=torch.long, device=g.device)
        return self.window.start(ids, torch.ones_like(ids, dtype=torch.bool))
