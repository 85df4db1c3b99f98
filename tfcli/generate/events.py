"""What decoding yields: text chunks as they are made, finished completions, notices, and at the end every
completion with the timing. The CLI renders them; the loops never print."""

from __future__ import annotations

import dataclasses


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
    # the text each token added after the prompt (a character split across tokens: the token completing it);
    # joined, they are `text` before a stop string was cut off
    token_texts: list[str] = dataclasses.field(default_factory=list)


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
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "prefill_seconds": round(self.prefill_seconds, 6),
            "decode_seconds": round(self.decode_seconds, 6),
            "total_seconds": round(self.total_seconds, 6),
            "tokens_per_second": round(self.tokens_per_second, 3),
        }


@dataclasses.dataclass
class Done:
    completions: list[Completion]
    timing: Timing
    seed: int | None


Event = Chunk | Finished | Notice | Done
