"""How to decode: strategy, sampling knobs, beams, limits and stop conditions. Torch-free; every
combination is checked here, so a bad one is one clear line before the model is even loaded."""

from __future__ import annotations

import dataclasses

from tfcli.errors import TfcliError

STRATEGIES = ("greedy", "sample", "beam")
MAX_NEW_TOKENS = 1_000_000_000  # days of decoding at any speed; more is a typo (and 10**30 overflows a tensor's int64)
MIN_TEMPERATURE = 1e-3  # below this, sampling is argmax (logits / 1e-38 overflow float32 to inf, and softmax to nan)


@dataclasses.dataclass
class GenerationSettings:
    strategy: str = "greedy"  # greedy (argmax) | sample (temperature, top-k, top-p, min-p) | beam
    max_new_tokens: int = 128  # new tokens per completion, at most
    temperature: float = 1.0  # sample: logits / temperature; 0 (and anything below MIN_TEMPERATURE) means greedy
    top_k: int = 0  # sample: keep the k most likely tokens (0: all)
    top_p: float = 1.0  # sample: keep the smallest set of tokens whose probability reaches p (nucleus)
    min_p: float = 0.0  # sample: drop tokens less likely than min_p x the most likely one
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the text (CTRL's penalty)
    num_beams: int = 1  # beam: hypotheses kept per prompt
    length_penalty: float = 1.0  # beam: a finished hypothesis scores sum(logprob) / length ** length_penalty
    early_stopping: bool = True  # beam: stop once num_beams hypotheses are finished (False: while one could still win)
    num_samples: int = 1  # completions per prompt (beam: the best num_samples hypotheses)
    stop: tuple[str, ...] = ()  # stop when the text contains any of these (the stop string is not kept)
    stop_at_eos: bool = True  # stop at the end-of-text token
    seed: int | None = None  # sampling draws come from a generator seeded with this
    use_cache: bool = True  # KV cache (False: re-run the whole window for every token, for comparison)
    slide_keep: int | None = None  # tokens kept when decoding slides past the context (default: 3/4 of it)
    logprobs: bool = False  # record each chosen token's log-probability (costs a log-softmax per step)

    def __post_init__(self) -> None:
        self.stop = tuple(self.stop)
        if self.strategy not in STRATEGIES:
            raise TfcliError(f"unknown strategy {self.strategy!r}", hint=f"use one of {', '.join(STRATEGIES)}")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise TfcliError(
                f"--max-new-tokens must be between 1 and {MAX_NEW_TOKENS:,}, not {self.max_new_tokens:,}",
                hint="past the context the window slides: a long run needs no more"
                if self.max_new_tokens > MAX_NEW_TOKENS
                else "it is how many tokens to write after the prompt (--max-new-tokens 50 writes 50)",
            )
        if not self.temperature >= 0 or self.temperature > 100:
            raise TfcliError(f"--temperature must be between 0 and 100, not {self.temperature}")
        if self.top_k < 0:
            raise TfcliError(f"--top-k must be 0 (off) or positive, not {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise TfcliError(f"--top-p must be in (0, 1], not {self.top_p}", hint="0.9 keeps the tokens that make up 90% of the probability")
        if not 0 <= self.min_p < 1:
            raise TfcliError(f"--min-p must be in [0, 1), not {self.min_p}")
        if not self.repetition_penalty > 0 or self.repetition_penalty > 100:
            raise TfcliError(f"--repetition-penalty must be positive (1 is off), not {self.repetition_penalty}")
        if not -10 <= self.length_penalty <= 10:  # also refuses nan
            raise TfcliError(
                f"--length-penalty must be between -10 and 10, not {self.length_penalty}",
                hint="1 divides a hypothesis' log-probability by its length; above 1 favours longer texts",
            )
        if self.num_beams < 1 or self.num_beams > 1024:
            raise TfcliError(f"--num-beams must be between 1 and 1024, not {self.num_beams}")
        if self.num_samples < 1 or self.num_samples > 1024:
            raise TfcliError(f"--num-samples must be between 1 and 1024, not {self.num_samples}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise TfcliError(f"--seed must fit in 64 bits, not {self.seed}")
        if any(not s for s in self.stop):
            raise TfcliError("a --stop string is empty", hint="pass the text to stop at, e.g. --stop '\\n\\n'")
        sampling_knobs = [
            name
            for name, on in (
                ("--temperature", self.temperature != 1.0),
                ("--top-k", self.top_k > 0),
                ("--top-p", self.top_p < 1.0),
                ("--min-p", self.min_p > 0),
            )
            if on
        ]
        if self.strategy == "beam":
            if sampling_knobs:
                raise TfcliError(
                    f"{sampling_knobs[0]} is a sampling option, and beam search does not sample", hint="drop it, or use --strategy sample without --num-beams"
                )
            if self.num_samples > self.num_beams:
                raise TfcliError(f"--num-samples {self.num_samples} asks for more hypotheses than --num-beams {self.num_beams} keeps")
        elif self.num_beams > 1:
            raise TfcliError(f"--num-beams {self.num_beams} needs --strategy beam, not {self.strategy}", hint="beam search and sampling do not mix: pick one")
        if self.strategy == "greedy":
            if sampling_knobs:
                raise TfcliError(f"{sampling_knobs[0]} is a sampling option, but the strategy is greedy", hint="add --strategy sample")
            if self.num_samples > 1:
                raise TfcliError(
                    "greedy decoding gives the same text every time, so --num-samples > 1 would repeat it",
                    hint="add --strategy sample, or --strategy beam with --num-beams",
                )
        if self.strategy != "beam" and (self.length_penalty != 1.0 or not self.early_stopping):
            raise TfcliError("--length-penalty and --no-early-stopping are beam-search options", hint="add --strategy beam --num-beams N")
        if self.slide_keep is not None and self.slide_keep < 1:
            raise TfcliError(f"slide_keep must be at least 1, not {self.slide_keep}")

    @property
    def greedy(self) -> bool:
        """Argmax decoding: the greedy strategy, or sampling at temperature 0."""
        return self.strategy == "greedy" or (self.strategy == "sample" and self.temperature < MIN_TEMPERATURE)

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["stop"] = list(self.stop)
        return data


def resolve_strategy(strategy: str | None, *, num_beams: int, sampling_options_given: bool) -> str:
    """The strategy a user means when they do not name one: beam if they ask for beams, sample if they
    set a sampling option (--temperature, --top-k, --top-p, --min-p, --seed), else greedy.

    Example: resolve_strategy(None, num_beams=1, sampling_options_given=True) -> "sample"
    """
    if strategy is not None:
        return strategy
    if num_beams > 1:
        return "beam"
    return "sample" if sampling_options_given else "greedy"
