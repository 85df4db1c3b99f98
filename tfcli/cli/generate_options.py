"""The decoding options of `tfcli generate`, as typed: refused where a mode generates no text, else made into the
GenerationSettings the decoder runs with."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class DecodingOptions:
    """The options that shape decoding, as typed (None: not given): they make the GenerationSettings."""

    max_new_tokens: int
    strategy: str | None
    temperature: float | None
    top_k: int | None
    top_p: float | None
    min_p: float | None
    repetition_penalty: float
    num_beams: int
    length_penalty: float
    early_stopping: bool
    num_samples: int
    seed: int | None
    stop: list[str] | None
    ignore_eos: bool
    no_stream: bool
    no_cache: bool
    batch_size: int
    steer: list[str] | None = None  # SAE:F:COEF, each a feature's direction added while decoding (tfcli.sae.steer)

    @classmethod
    def of(cls, parameters: dict[str, Any]) -> DecodingOptions:
        """The decoding options among `tfcli generate`'s parameters (its `locals()`)."""
        return cls(**{f.name: parameters[f.name] for f in fields(cls) if f.name in parameters})

    def refuse_given(self, mode: str, *, fill_mask: bool) -> None:
        """Refuse a decoding option given to a mode that generates no text (--top-k counts only for --classify)."""
        from tfcli.errors import TfcliError

        given = {
            "--max-new-tokens": self.max_new_tokens != 128,
            "--strategy": self.strategy is not None,
            "--temperature": self.temperature is not None,
            "--top-k": self.top_k is not None and not fill_mask,
            "--top-p": self.top_p is not None,
            "--min-p": self.min_p is not None,
            "--repetition-penalty": self.repetition_penalty != 1.0,
            "--num-beams": self.num_beams != 1,
            "--length-penalty": self.length_penalty != 1.0,
            "--no-early-stopping": not self.early_stopping,
            "--num-samples": self.num_samples != 1,
            "--seed": self.seed is not None,
            "--stop": bool(self.stop),
            "--ignore-eos": self.ignore_eos,
            "--no-stream": self.no_stream,
            "--no-cache": self.no_cache,
            "--batch-size": self.batch_size != 16,
            "--steer": bool(self.steer),
        }
        names = [name for name, on in given.items() if on]
        if names:
            raise TfcliError(
                f"{names[0]} does not apply to {mode}, which generates no text",
                hint="drop it" + ("; --top-k sets how many fillers to list" if fill_mask else ""),
            )

    def settings(self, *, interactive: bool, json_output: bool):
        """The GenerationSettings: defaults filled in, the strategy resolved (a plain conversation's reply is a line)."""
        from tfcli.generate.settings import GenerationSettings, resolve_strategy

        sampling_given = any(v is not None for v in (self.temperature, self.top_k, self.top_p, self.min_p, self.seed))
        return GenerationSettings(
            strategy=resolve_strategy(self.strategy, num_beams=self.num_beams, sampling_options_given=sampling_given),
            max_new_tokens=self.max_new_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=self.top_k or 0,
            top_p=1.0 if self.top_p is None else self.top_p,
            min_p=self.min_p or 0.0,
            repetition_penalty=self.repetition_penalty,
            num_beams=self.num_beams,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
            num_samples=self.num_samples,
            stop=tuple(self.stop or ()) if (self.stop or not interactive) else ("\n",),
            seed=self.seed,
            stop_at_eos=not self.ignore_eos,
            use_cache=not self.no_cache,
            logprobs=json_output,
        )
