"""Decoding prompts with a model: greedy and sampling (here) and beam search (`beam.py`), over the context
window and its KV cache (`window.py`), for decoders and encoder-decoders, on batches of left-padded
prompts. The loops yield events (`events.py`: text chunks, finished completions, notices); they never print.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from tfcli.errors import TfcliError
from tfcli.generate.beam import beam_search
from tfcli.generate.events import Chunk, Completion, Done, Event, Finished, Notice, Timing
from tfcli.generate.sampling import apply_repetition_penalty, choose_next
from tfcli.generate.settings import GenerationSettings
from tfcli.generate.stream import CompletionText
from tfcli.generate.window import DecoderWindow, Vocabulary, pad_rows
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.detokenize import decode_completion


@dataclasses.dataclass
class Row:
    """One completion being sampled: its text so far, its tokens and their log-probabilities."""

    text: CompletionText
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    active: bool = True


class Generator:
    """Decodes prompts with one model and tokenizer. `run(prompts)` yields Chunk, Finished and Notice
    events and finally Done with every completion (in prompt order) and the timing."""

    def __init__(self, model: Transformer, tokenizer: TextTokenizer, settings: GenerationSettings, *, batch_size: int = 16) -> None:
        config = model.config
        if config.arch == "encoder":
            raise TfcliError(
                "this run is an encoder (masked LM); it fills in masks rather than writing text",
                hint='use --fill-mask "The [MASK] sat on the mat"' + (" or --classify TEXT" if config.n_classes else ""),
            )
        if batch_size < 1:
            raise TfcliError(f"--batch-size must be at least 1, not {batch_size}")
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.batch_size = batch_size
        self.vocab = Vocabulary.of(tokenizer, config.vocab_size)
        choosable = self.vocab.limit - len(self.vocab.suppressed)
        if settings.strategy == "beam" and settings.num_beams > choosable:  # the first step could not give each beam its own token
            raise TfcliError(
                f"--num-beams {settings.num_beams} is more than the {choosable:,} tokens this run can write",
                hint=f"pass --num-beams {choosable:,} at most",
            )
        if config.arch == "encoder-decoder" and self.vocab.eos_id is None:
            tokenizer.require("eos")  # the decoder starts from it
        # ids that end a text: eos and those the run's files name (a chat adds its end-of-turn token)
        self.end_ids: set[int] = set(self.vocab.end_ids)
        self.device = next(model.parameters()).device  # not lm_head.weight: a quantized head dequantizes on each read
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
        training does). Each crop is a notice. An empty prompt is an error, but where a decoder's tokenizer
        starts every text with its beginning-of-text token (Llama's <s>): then it starts from the empty text's
        prompt, an unconditional sample, as llama2.c's `run` and transformers' `generate` do. That prompt is
        <s>, and <s></s> where the file adds eos too, as llama.cpp's llama_tokenize and llama-cpp-python's
        completions give it (llama-cpp-python before 0.3 started an empty prompt from <s> alone)."""
        encoded = self.tokenizer.encode_batch(list(prompts))
        block = self.model.config.block_size
        decoder = self.model.config.arch == "decoder"
        starts_from_bos = decoder and self.tokenizer.adds_bos
        added = [name for name, on in (("beginning-of-text", self.tokenizer.adds_bos), ("end-of-text", self.tokenizer.adds_eos)) if on and decoder]
        room = block - len(added)  # the prompt's own tokens beside the ones the tokenizer adds
        notices = []
        for i, ids in enumerate(encoded):
            if not ids and not starts_from_bos:
                where = f"prompt {i + 1}" if len(prompts) > 1 else "the prompt"
                raise TfcliError(
                    f"{where} is empty", hint="pass some text to continue with --prompt (this tokenizer has no beginning-of-text token to start from)"
                )
            if len(ids) > room:
                where = f"prompt {i + 1}" if len(prompts) > 1 else "the prompt"
                if decoder:
                    beside = f" beside its {' and '.join(added)} token{'s' if len(added) > 1 else ''}" if added else ""
                    notices.append(Notice(f"{where} has {len(ids):,} tokens, more than the context ({block:,}) holds{beside}; keeping the last {room:,}"))
                    encoded[i] = ids[-room:]
                else:
                    notices.append(Notice(f"{where} has {len(ids):,} tokens, more than the context ({block:,}); keeping the first {block:,}"))
                    encoded[i] = ids[:block]
            if decoder:  # a pretrained Llama reads <s> first (and </s> last where its file says so)
                encoded[i] = self.tokenizer.prompt_ids(encoded[i], block)
        return encoded, notices

    # -- the loops ---------------------------------------------------------------------------------------

    LONG_RUN = 10  # --max-new-tokens above this many contexts is said up front (a typo shows before it runs)

    def length_notice(self) -> Notice | None:
        """A note when --max-new-tokens is more than LONG_RUN times the context: allowed (past the context the
        window slides, for as long as asked), but said up front, so that a typo is seen."""
        block, asked = self.model.config.block_size, self.settings.max_new_tokens
        if asked <= self.LONG_RUN * block:
            return None
        return Notice(
            f"--max-new-tokens {asked:,} is {asked / block:,.0f}x the context ({block:,} tokens): past the context "
            "the window slides and decoding goes on for as long as asked (Ctrl-C stops it)",
            level="note",
        )

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
            prompts = [decode_completion(self.tokenizer, (), ids) for ids in encoded]
        s = self.settings
        n = s.num_samples
        results: dict[int, Completion] = {}
        per_batch = max(1, self.batch_size // (s.num_beams if s.strategy == "beam" else n))
        for first in range(0, len(encoded), per_batch):
            indices = list(range(first, min(first + per_batch, len(encoded))))
            if s.strategy == "beam":
                events = beam_search(self, indices, [prompts[i] for i in indices], [encoded[i] for i in indices])
            else:
                events = self._sample(indices, [prompts[i] for i in indices], [encoded[i] for i in indices])
            for event in events:
                if isinstance(event, Finished):
                    results[event.completion] = event.result
                yield event
        completions = [results[i] for i in sorted(results)]
        self.timing.new_tokens = sum(len(c.tokens) for c in completions)
        yield Done(completions, self.timing, self.seed)

    def open_window(self, rows: list[list[int]], repeat: int) -> tuple[DecoderWindow, torch.Tensor]:
        """A window over the rows (each repeated `repeat` times, adjacent), with the prompts run through it."""
        started = time.perf_counter()
        model, config = self.model, self.model.config
        B = len(rows) * repeat
        memory = memory_padding = None
        if config.arch == "encoder-decoder":
            source_ids, source_real = pad_rows(rows, self.vocab.pad_id, self.device, left=False)
            padded = not bool(source_real.all())
            memory = model.encode(source_ids, source_real if padded else None)  # (P, S, d), once per source
            memory_padding = source_real if padded else None
            if repeat > 1:
                memory = memory.repeat_interleave(repeat, dim=0)
                memory_padding = None if memory_padding is None else memory_padding.repeat_interleave(repeat, dim=0)
            ids = torch.full((B, 1), self.vocab.eos_id, dtype=torch.long, device=self.device)  # decoding starts from eos
            real = torch.ones_like(ids, dtype=torch.bool)
        else:
            ids, real = pad_rows([r for r in rows for _ in range(repeat)], self.vocab.pad_id, self.device, left=True)
        longest = ids.shape[1] + self.settings.max_new_tokens
        window = DecoderWindow(
            model,
            B,
            self.vocab,
            use_cache=self.settings.use_cache,
            keep=self.settings.slide_keep,
            memory=memory,
            memory_padding=memory_padding,
            longest=longest,
        )
        logits = window.start(ids, real)
        self.timing.prefill_seconds += time.perf_counter() - started
        self.timing.prompt_tokens += sum(len(r) for r in rows) * repeat
        return window, logits

    def seen_tokens(self, rows: list[list[int]], repeat: int) -> torch.Tensor | None:
        """(rows * repeat, vocab) the tokens each row has had (a decoder's prompt; not an encoder-decoder's
        source), for the repetition penalty; None without one."""
        if self.settings.repetition_penalty == 1.0:
            return None
        seen = torch.zeros(len(rows) * repeat, self.vocab.limit, dtype=torch.bool, device=self.device)
        if self.model.config.arch == "decoder":  # a decoder's prompt is part of its text; a source is not
            for i, r in enumerate(rows):
                ids = torch.tensor([t for t in r if t < self.vocab.limit], dtype=torch.long, device=self.device)
                seen[i * repeat : (i + 1) * repeat, ids] = True
        return seen

    def _sample(self, indices: list[int], prompts: list[str], rows: list[list[int]]) -> Iterator[Event]:
        """Greedy or sampling for a batch of prompts, each repeated num_samples times."""
        s = self.settings
        n = s.num_samples
        window, logits = self.open_window(rows, n)
        started = time.perf_counter()

        def completion(b: int, row: Row, reason: str) -> Completion:
            return Completion(
                prompt_index=indices[b // n],
                sample_index=b % n,
                prompt=prompts[b // n],
                prompt_tokens=len(rows[b // n]),
                text=row.text.text,
                tokens=row.tokens,
                logprobs=row.logprobs if s.logprobs else None,
                finish_reason=reason,
                token_texts=row.text.pieces,
            )

        completion_ids = [indices[b // n] * n + b % n for b in range(len(rows) * n)]
        contexts = [self.text_context(rows[b // n]) for b in range(len(rows) * n)]
        yield from self.sampling_loop(window, logits, self.seen_tokens(rows, n), completion_ids, completion, contexts)
        self.timing.decode_seconds += time.perf_counter() - started

    def text_context(self, prompt_ids: Sequence[int]) -> Sequence[int]:
        """What a completion's text follows: a decoder's prompt; nothing for an encoder-decoder's target."""
        return prompt_ids if self.model.config.arch == "decoder" else ()

    def sampling_loop(
        self,
        window: DecoderWindow,
        logits: torch.Tensor,
        seen: torch.Tensor | None,
        completion_ids: list[int],
        completion: Callable[[int, Row, str], Completion],
        contexts: Sequence[Sequence[int]],
    ) -> Iterator[Event]:
        """Greedy or sampled tokens for every row of the window until each ends (end-of-text, a stop string,
        the token limit): a Chunk whenever text is safe to show, and a Finished with `completion(row index,
        row, reason)` as each row ends. seen (B, vocab): the tokens each row has had, for the repetition
        penalty (None: no penalty). contexts: per row, the ids its text follows (`text_context`)."""
        s = self.settings
        rows = [Row(CompletionText(self.tokenizer, context, s.stop)) for context in contexts]
        ends = self.end_ids if s.stop_at_eos else set()

        def finish(b: int, reason: str) -> Iterator[Event]:
            rows[b].active = False
            tail = rows[b].text.finish()
            if tail:
                yield Chunk(completion_ids[b], tail)
            yield Finished(completion_ids[b], completion(b, rows[b], reason))

        for step in range(s.max_new_tokens):
            scores = logits if seen is None else apply_repetition_penalty(logits, seen, s.repetition_penalty)
            chosen = choose_next(scores, greedy=s.greedy, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, generator=self.rng)  # (B,)
            chosen_list = chosen.tolist()
            chosen_logprobs = F.log_softmax(logits, dim=-1).gather(1, chosen[:, None]).squeeze(1).tolist() if s.logprobs else None
            for b, row in enumerate(rows):
                if not row.active:
                    continue
                token = chosen_list[b]
                if token in ends:
                    yield from finish(b, "eos")
                    continue
                row.tokens.append(token)
                if chosen_logprobs is not None:
                    row.logprobs.append(chosen_logprobs[b])
                chunk = row.text.add(token)
                if chunk:
                    yield Chunk(completion_ids[b], chunk)
                if row.text.stopped:
                    yield from finish(b, "stop")
            if not any(row.active for row in rows) or step == s.max_new_tokens - 1:
                break  # the last token is never run through the model
            if seen is not None:
                seen.scatter_(1, chosen[:, None], True)
            logits = window.push(chosen, chosen_list)
        for b, row in enumerate(rows):
            if row.active:
                yield from finish(b, "length")
