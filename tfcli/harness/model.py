"""lm-eval's model API over a tfcli run, registered with the harness as `tfcli`
(`lm_eval --model tfcli --model_args run=runs/x` once this module is imported). Log-likelihoods come from the
shared scorer (`tfcli.generate.scoring`), text from tfcli's decoding loop; no Hugging Face folder is made.

It tokenizes, cuts and windows exactly as the harness's `hf` model does with the same run exported
(`tfcli export --to hf`), so the two give the same numbers: a context longer than the window is cut from
the left, `loglikelihood_rolling` reads the harness's own rolling windows of the run's context length, and a
generation's prompt keeps its last (window - max_gen_toks) tokens."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import lm_eval.models  # noqa: F401  the harness's own models register first (its registry loads them only when empty)
from lm_eval import utils as harness_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

from tfcli.errors import TfcliError
from tfcli.generate.decoding import Generator
from tfcli.generate.events import Done
from tfcli.generate.scoring import DEFAULT_BATCH_SIZE, score_continuations
from tfcli.generate.settings import GenerationSettings
from tfcli.loader import load_run
from tfcli.tokenizer.chat_template import ChatTemplate, Message
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE

DEFAULT_MAX_GEN_TOKS = 256  # the harness's default for a generation task that names no max_gen_toks
ENCODED_KEPT = 4096  # texts whose token ids are kept for the next request that asks (a question's choices share its context)


@register_model("tfcli")
class TfcliLM(TemplateLM):
    """A tfcli decoder run as an lm-eval model. `run` is the run directory; `checkpoint`, a run already loaded
    (`tfcli.loader.load_run(run, "decode")`), takes its place where the caller holds one."""

    def __init__(
        self,
        run: str | Path | None = None,
        *,
        checkpoint: Any = None,
        batch_size: int | str | None = DEFAULT_BATCH_SIZE,
        device: str | None = "auto",
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        **_ignored: Any,  # what simple_evaluate passes every model (max_batch_size, ...)
    ) -> None:
        super().__init__()
        if checkpoint is None:
            if run is None:
                raise TfcliError("the tfcli model needs a run", hint="pass --model_args run=RUN_DIR")
            checkpoint = load_run(run, "decode", device)
        self.checkpoint = checkpoint
        self.run = Path(run) if run is not None else checkpoint.tokenizer.path.parent
        self.model, self.tokenizer = checkpoint.model, checkpoint.tokenizer
        arch = self.model.config.arch
        if arch != "decoder":
            raise TfcliError(f"{self.run} is an {arch}; lm-eval tasks score a decoder (a language model)", hint="evaluate a decoder run")
        self.batch_size = int(batch_size) if isinstance(batch_size, int) or str(batch_size).isdigit() else DEFAULT_BATCH_SIZE
        self.max_gen_toks = int(max_gen_toks)
        self._device = next(self.model.parameters()).device  # not lm_head.weight: a quantized head dequantizes on each read
        self._template = None
        self._specials_read_as_specials = False  # a chat-templated prompt holds the template's special tokens
        self._encoded: dict[tuple, tuple[int, ...]] = {}  # recent encodings, at most ENCODED_KEPT

    # -- what the harness asks of a model ----------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.require("eos")

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and the first rolling window start from: BOS where the tokenizer has one,
        else EOS (as the harness's `hf` model)."""
        return self.tokenizer.special_ids.get("bos", self.eot_token_id)

    @property
    def max_length(self) -> int:
        return self.model.config.block_size

    @property
    def tokenizer_name(self) -> str:
        return str(self.run).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None, **_: Any) -> list[int]:
        """Token ids of `string`, with BOS first where the tokenizer adds one (a pretrained Llama's <s>). A
        question's context is encoded once for all its choices (the harness asks once per choice)."""
        key = (string, add_special_tokens, self._specials_read_as_specials)
        ids = self._encoded.get(key)
        if ids is None:
            if len(self._encoded) >= ENCODED_KEPT:
                self._encoded.clear()
            ids = self._encoded[key] = self._encode(string, add_special_tokens)
        return list(ids[-left_truncate_len:] if left_truncate_len else ids)

    def _encode(self, string: str, add_special_tokens: bool | None) -> tuple[int, ...]:
        if self._specials_read_as_specials:
            previous, self.tokenizer.hf.encode_special_tokens = self.tokenizer.hf.encode_special_tokens, False
            try:
                ids = self.tokenizer.hf.encode(string, add_special_tokens=False).ids
            finally:
                self.tokenizer.hf.encode_special_tokens = previous
        else:
            ids = self.tokenizer.encode(string)
        bos = self.tokenizer.special_ids.get("bos")
        if add_special_tokens is not False and self.tokenizer.adds_bos and ids[:1] != [bos]:
            ids = [bos] + ids
        return tuple(ids)

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return super().loglikelihood(requests, disable_tqdm=True)  # tfcli says what it scores in one line, without bars

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **_: Any) -> list[tuple[float, bool]]:
        """requests: ((context, continuation), context ids, continuation ids) each, as TemplateLM makes them."""
        scores = score_continuations(self.model, [(context, continuation) for _, context, continuation in requests], batch_size=self.batch_size)
        results = []
        for (key, _, _), score in zip(requests, scores):
            result = (score.logprob, score.greedy)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
            results.append(result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text, in the harness's rolling windows of the run's context
        length (every token predicted once, each window after the first starting from the token before it)."""
        windows: list[tuple[list[int], list[int]]] = []
        owners: list[int] = []
        for index, (text,) in enumerate(request.args for request in requests):
            made = harness_utils.get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1
            )
            for window in map(harness_utils.make_disjoint_window, made):
                windows.append(window)
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, score in zip(owners, score_continuations(self.model, windows, batch_size=self.batch_size)):
            totals[owner] += score.logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or, where a task asks, sampled) text through tfcli's decoding loop, until a stop string,
        the end of text or max_gen_toks; requests with the same generation settings are decoded together."""
        results: list[str | None] = [None] * len(requests)
        by_settings: dict[str, list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            by_settings[repr(sorted(request.args[1].items()))].append(index)
        eos_text = self.tokenizer.decode([self.eot_token_id])
        for indices in by_settings.values():
            kwargs = normalize_gen_kwargs(requests[indices[0]].args[1], self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
            max_gen_toks = int(kwargs.pop("max_gen_toks"))
            if max_gen_toks >= self.max_length:
                raise TfcliError(
                    f"a task asks for {max_gen_toks:,} new tokens, as many as the run's whole context ({self.max_length:,})",
                    hint="set generation_kwargs.max_gen_toks lower in the task",
                )
            prompts = [self.tok_encode(requests[i].args[0], left_truncate_len=self.max_length - max_gen_toks) for i in indices]
            texts = self._generate(prompts, until, max_gen_toks, kwargs)
            for index, text in zip(indices, texts):
                results[index] = postprocess_generated_text(text, until, None)
                self.cache_hook.add_partial("generate_until", requests[index].args, results[index])
        return results  # type: ignore[return-value]

    def _generate(self, prompts: list[list[int]], until: list[str], max_gen_toks: int, kwargs: dict[str, Any]) -> list[str]:
        sample = bool(kwargs.get("do_sample")) and float(kwargs.get("temperature") or 0.0) > 0
        settings = GenerationSettings(
            strategy="sample" if sample else "greedy",
            max_new_tokens=max_gen_toks,
            temperature=float(kwargs.get("temperature") or 1.0) if sample else 1.0,
            top_p=float(kwargs.get("top_p") or 1.0),
            top_k=int(kwargs.get("top_k") or 0),
            stop=tuple(s for s in until if s),
            seed=0 if sample else None,
        )
        generator = Generator(self.model, self.tokenizer, settings, batch_size=self.batch_size)
        if self._template is not None:
            generator.end_ids |= self._template.end_of_turn_ids
        done = [event for event in generator.run_ids(prompts) if isinstance(event, Done)][-1]
        return [completion.text for completion in done.completions]

    def get_model_info(self) -> dict[str, Any]:
        """What the harness records of the model in its results' config."""
        return {
            "model_run": str(self.run),
            "model_num_parameters": self.model.parameter_count(),
            "model_dtype": str(next(self.model.parameters()).dtype),
            "model_block_size": self.max_length,
        }

    # -- chat --------------------------------------------------------------------------------------------

    @property
    def template(self):
        """The run's chat template (tokenizer_config.json's chat_template), or a clear error without one."""
        if self._template is None:
            path = self.tokenizer.path.parent / TOKENIZER_CONFIG_FILE
            config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            self._template = ChatTemplate.for_tokenizer(self.tokenizer, config, str(self.run))
            if self._template is None:
                raise TfcliError(f"{self.run} has no chat template", hint="drop --chat-template, or fine-tune the run with --task chat")
        return self._template

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.template.source if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation as the run's template writes it; without the generation prompt, the last
        (assistant) message is left open, for the harness to score its continuation."""
        template = self.template
        self._specials_read_as_specials = True
        messages = [Message(m["role"], m["content"]) for m in chat_history]
        if add_generation_prompt or not messages:
            return template.render(messages, add_generation_prompt=True)
        before = template.render(messages[:-1], add_generation_prompt=True)
        return before + messages[-1].content
