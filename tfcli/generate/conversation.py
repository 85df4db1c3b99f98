"""An interactive session with a decoder (`tfcli generate --interactive`): every turn stays in the context,
and the KV cache carries over from turn to turn."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import torch

from tfcli.errors import TfcliError
from tfcli.generate.decoding import Generator
from tfcli.generate.events import Completion, Event, Finished, Notice
from tfcli.generate.window import DecoderWindow
from tfcli.tokenizer.core import TextTokenizer


def transcript_ids(tokenizer: TextTokenizer, lines: Iterable[str], *, start: bool = True) -> list[int]:
    """A conversation with a run that has no chat template, as `--interactive` holds it: each line (a message,
    a reply as it was shown) and its newline encoded on its own; `start`: after <s> where the tokenizer adds one.

    Example: ["Hi", "there"] -> encode("Hi\\n") + encode("there\\n") (a Llama's with <s> first)"""
    ids = [tokenizer.special_ids["bos"]] if start and tokenizer.adds_bos else []
    for line in lines:
        ids += tokenizer.encode(line + "\n")
    return ids


class Conversation:
    """An interactive session with a decoder: every turn (the user's line and the model's reply, each ending in
    a newline) stays in the context. The KV cache carries over from turn to turn: only the tokens that differ
    from what the window already holds are run."""

    def __init__(self, generator: Generator) -> None:
        if generator.model.config.arch != "decoder":
            raise TfcliError(
                "--interactive needs a decoder run (a conversation continues one text)",
                hint="for an encoder-decoder, pass --prompt-file - and one source per line",
            )
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
        turn = transcript_ids(g.tokenizer, [line], start=False)
        if not self.history:  # a pretrained Llama's conversation starts with <s>
            self.history = transcript_ids(g.tokenizer, [])
        self.history += turn
        block = g.model.config.block_size
        window_keep = max(1, block - block // 4) if s.slide_keep is None else min(block, s.slide_keep)
        context = self.history if len(self.history) <= block else self.history[-window_keep:]
        if len(turn) > len(context):
            yield Notice(f"the line has {len(turn):,} tokens, more than the context keeps ({len(context):,}); the model sees its last {len(context):,}")
        finished = yield from self.respond(context, line, started)
        # the reply as it was shown (a stop string cut off, end-of-text dropped) is what the next turn sees
        self.history += transcript_ids(g.tokenizer, [finished.result.text], start=False)
        yield finished

    def respond(self, context: list[int], prompt: str, started: float) -> Iterator[Event]:
        """Run `context` (reusing what the cache holds of it) and yield the reply's Chunk events; returns the
        Finished event, for the caller to give out once its conversation holds the reply. `started`: when the
        turn began, for the prefill time."""
        g = self.generator
        logits = self._prime(context)
        g.timing.prefill_seconds += time.perf_counter() - started
        started = time.perf_counter()
        window = self.window
        assert window is not None

        def completion(b: int, row, reason: str) -> Completion:
            return Completion(0, 0, prompt, len(context), row.text.text, row.tokens, None, reason, token_texts=row.text.pieces)

        finished = None
        for event in g.sampling_loop(window, logits, None, [0], completion, [context]):
            if isinstance(event, Finished):
                finished = event
            else:
                yield event
        assert finished is not None
        g.timing.decode_seconds += time.perf_counter() - started
        g.timing.new_tokens += len(finished.result.tokens)
        return finished

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
