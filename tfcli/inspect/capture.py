"""Capture attention weights from a run: text -> tokens -> one forward pass with every attention's
`hook_pattern` read (which puts it on its explicit path) -> `[layer, head, query_pos, key_pos]` as a numpy array.

Nothing here computes attention itself; it only reads the weights the model computes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

import numpy as np
import torch

from tfcli.errors import TfcliError, a_or_an
from tfcli.inspect.hooks import Hooks
from tfcli.inspect.stats import repeated_random_ids, summarize_heads
from tfcli.limits import within_context
from tfcli.model.transformer import HIDDEN, DecoderInput
from tfcli.tokenizer.show import TokenView, token_views, visible

if TYPE_CHECKING:
    from tfcli.checkpoint import Checkpoint
    from tfcli.inspect.stats import HeadSummary
    from tfcli.model.config import ModelConfig
    from tfcli.tokenizer.core import TextTokenizer

KINDS: tuple[str, ...] = ("encoder", "decoder", "cross")
CROP_HINT = "shorten it, or pass --crop to keep the first tokens that fit"
PROBE_LENGTH = 50  # tokens in each half of the repeated random sequence the summary scores induction on


@dataclasses.dataclass
class AttentionCapture:
    """The weights of every layer and head of one attention kind, for one text.

    `weights` is float32 `[layer, head, query_pos, key_pos]`; each row sums to 1 and masked keys are exactly
    0. For self-attention `keys` is `queries`; for cross-attention the queries are the target's tokens and
    the keys the source's.
    """

    run: str
    kind: str  # encoder | decoder | cross
    text: str  # the text (the source, for an encoder-decoder)
    target: str | None  # an encoder-decoder's target text
    queries: list[TokenView]
    keys: list[TokenView]
    weights: np.ndarray
    causal: bool
    source_ids: list[int]  # what went into the model (to re-run it, e.g. for the summary's probe)
    decoder_ids: list[int] | None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def self_attention(self) -> bool:
        return self.kind != "cross"

    @property
    def queries_from(self) -> str:
        """Whose tokens the queries are: an encoder-decoder's decoder and cross-attention query the target."""
        return "the target" if self.target is not None and self.kind != "encoder" else "the text"

    @property
    def query_ids(self) -> list[int]:
        return [v.id for v in self.queries]


def attention_kinds(config: ModelConfig) -> tuple[str, ...]:
    """The attention kinds a model has. Example: encoder-decoder -> ("encoder", "decoder", "cross")"""
    return {"decoder": ("decoder",), "encoder": ("encoder",)}.get(config.arch, KINDS)


def default_kind(config: ModelConfig) -> str:
    return {"decoder": "decoder", "encoder": "encoder"}.get(config.arch, "cross")


def _start_view(tokenizer: TextTokenizer) -> TokenView | None:
    """The token an encoder-decoder's decoder starts from (training feeds [eos] + target)."""
    start = tokenizer.special_ids.get("eos")
    if start is None:
        return None
    token = tokenizer.hf.id_to_token(start) or ""
    return TokenView(id=start, token=token, text=visible(token))  # no piece: the start token is no text


def _fit(views: list[TokenView], limit: int, crop: bool, what: str, notes: list[str], start: bool = False) -> list[TokenView]:
    """`views`, or its first `limit` with --crop; `start`: the first view is the decoder's start token."""
    if not views:
        raise TfcliError(f"the {what} is empty (no tokens)", hint="pass some text")
    if len(views) <= limit:
        return views
    if not crop:
        size = f"{len(views) - 1:,} tokens and the start token" if start else f"{len(views):,} tokens"
        raise TfcliError(f"the {what} is {size}, longer than the model's block size ({limit:,})", hint=CROP_HINT)
    notes.append(f"the {what} was cropped to its first {limit:,} of {len(views):,} tokens (--crop)")
    return views[:limit]


def capture_attention(checkpoint: Checkpoint, text: str, *, target: str | None = None, kind: str | None = None, crop: bool = False) -> AttentionCapture:
    """Run `text` (and, for an encoder-decoder, `target`) through the model and keep one kind's weights.

    Text longer than the block size is an error, or with `crop` cut to its first block-size tokens.
    An encoder-decoder's decoder reads the start token (eos) followed by the whole target, as in training.
    """
    config = checkpoint.config.model
    kind = kind or default_kind(config)
    kinds = attention_kinds(config)
    if kind not in kinds:
        raise TfcliError(f"this {config.arch} model has no {kind} attention", hint=f"use --attention {' or '.join(kinds)}")
    if config.arch == "encoder-decoder" and target is None and kind != "encoder":
        raise TfcliError(
            f"an encoder-decoder's {kind} attention needs a target text as well as the source",
            hint="pass --target TEXT (the decoder's text); --text is the source",
        )
    if config.arch != "encoder-decoder" and target is not None:
        raise TfcliError(f"--target is for encoder-decoder models; this one is {a_or_an(config.arch)}", hint="drop --target")
    tokenizer = checkpoint.tokenizer
    notes: list[str] = []
    limit = config.block_size
    text = within_context(text, limit, "text", crop=crop, hint=CROP_HINT)
    source = _fit(token_views(tokenizer, text), limit, crop, "text", notes)
    decoder: list[TokenView] | None = None
    if target is not None:
        start = _start_view(tokenizer)
        target_views = token_views(tokenizer, within_context(target, limit, "target", crop=crop, hint=CROP_HINT))
        if not target_views:
            raise TfcliError("the target is empty (no tokens)", hint="pass some text with --target")
        decoder = _fit(([start] if start else []) + target_views, limit, crop, "target", notes, start=start is not None)
    weights = forward_weights(checkpoint.model, kind, [v.id for v in source], None if decoder is None else [v.id for v in decoder])
    queries = source if kind == "encoder" else (decoder if decoder is not None else source)
    keys = source if kind in ("encoder", "cross") else queries
    return AttentionCapture(
        run=str(checkpoint.path),
        kind=kind,
        text=text,
        target=target,
        queries=queries,
        keys=keys,
        weights=weights,
        causal=kind == "decoder",
        source_ids=[v.id for v in source],
        decoder_ids=None if decoder is None else [v.id for v in decoder],
        notes=notes,
    )


def forward_weights(model, kind: str, ids: list[int], decoder_ids: list[int] | None = None) -> np.ndarray:
    """One forward pass reading the attention patterns; returns float32 [layer, head, query_pos, key_pos] for `kind`."""
    device = next(model.parameters()).device
    with torch.inference_mode(), Hooks() as hooks:
        patterns = hooks.attention_patterns(model)
        src = torch.tensor([ids], dtype=torch.long, device=device)  # (1, S)
        if decoder_ids is None and model.config.arch == "encoder-decoder":  # the encoder alone (no target)
            model.encode(src)
        else:
            decoder = None if decoder_ids is None else DecoderInput(torch.tensor([decoder_ids], dtype=torch.long, device=device))  # (1, T)
            model(src, head=HIDDEN, decoder=decoder)
        stacked = torch.cat(patterns[kind], dim=0)  # per layer (1, nh, T, S) -> (L, nh, T, S)
        return stacked.float().cpu().numpy()


def probe(checkpoint: Checkpoint, capture: AttentionCapture, seed: int = 0) -> tuple[np.ndarray, list[int]] | None:
    """Weights on a repeated random sequence (the same kind as `capture`), for duplicate and induction
    scores; None for cross-attention or a block too small to hold a repeat."""
    if not capture.self_attention:
        return None
    config = checkpoint.config.model
    length = min(PROBE_LENGTH, config.block_size // 2)
    if length < 2:
        return None
    reserved = set(checkpoint.tokenizer.special_ids.values()) | set(checkpoint.tokenizer.hf.get_added_tokens_decoder())
    vocab = [i for i in range(config.vocab_size) if i not in reserved] or list(range(config.vocab_size))
    ids = repeated_random_ids(vocab, length, seed)
    if config.arch != "encoder-decoder":
        return forward_weights(checkpoint.model, capture.kind, ids), ids
    if capture.kind == "encoder":
        return forward_weights(checkpoint.model, "encoder", ids, capture.decoder_ids), ids
    return forward_weights(checkpoint.model, "decoder", capture.source_ids, ids), ids


def summarize_capture(checkpoint: Checkpoint, capture: AttentionCapture) -> list[HeadSummary]:
    """Every head's summary of `capture`, its duplicate and induction scores read on `probe`'s repeated random
    sequence (self-attention only)."""
    probed = probe(checkpoint, capture)
    return summarize_heads(
        capture.weights,
        capture.query_ids if capture.self_attention else None,
        causal=capture.causal,
        probe_weights=None if probed is None else probed[0],
        probe_ids=None if probed is None else probed[1],
    )


def find_token(views: list[TokenView], word: str, occurrence: int = 1, where: str = "the text") -> tuple[int, str]:
    """The position of WORD among the tokens, and a note saying what was picked.

    WORD is looked for in the text the tokens spell, as a whole word first, then anywhere, then ignoring
    case; a word of several tokens is represented by its last token (the one that has read all of it).
    A character split over several byte-level tokens belongs to the one that completes it.
    `occurrence` picks the n-th match (1 = the first); `where` names the tokens' text in messages.
    """
    needle = word.strip()
    if not needle:
        raise TfcliError("--token is empty", hint="pass a word from the text")
    spelled = ""
    owner: list[int] = []  # character -> token position
    for position, view in enumerate(views):
        spelled += view.piece
        owner.extend([position] * len(view.piece))
    escaped = re.escape(needle)
    matches: list[re.Match[str]] = []
    for pattern, flags in ((rf"(?<!\w){escaped}(?!\w)", 0), (escaped, 0), (rf"(?<!\w){escaped}(?!\w)", re.IGNORECASE), (escaped, re.IGNORECASE)):
        matches = list(re.finditer(pattern, spelled, flags))
        if matches:
            break
    if not matches:
        shown = " ".join(f"'{v.label}'" for v in views[:12]) + (" ..." if len(views) > 12 else "")
        raise TfcliError(f"--token {word!r} is not in {where}; its tokens are {shown}", hint=f"pass a word of {where}")
    if not 1 <= occurrence <= len(matches):
        raise TfcliError(
            f"--occurrence {occurrence}: {word!r} occurs {'once' if len(matches) == 1 else f'{len(matches)} times'} in {where}",
            hint=f"pass a number from 1 to {len(matches)}",
        )
    match = matches[occurrence - 1]
    first, last = owner[match.start()], owner[match.end() - 1]
    notes = []
    if len(matches) > 1:
        notes.append(f"occurrence {occurrence} of {len(matches)} (--occurrence picks another)")
    if last > first:
        notes.append(f"{last - first + 1} tokens; showing the last")
    return last, "; ".join(notes)


def check_comparable(a: Checkpoint, b: Checkpoint) -> None:
    """--compare-run: the two runs must share the attention shape and the tokenizer."""
    ca, cb = a.config.model, b.config.model
    for name in ("arch", "n_layers", "decoder_layers", "n_heads", "block_size"):
        va, vb = getattr(ca, name), getattr(cb, name)
        if va != vb:
            raise TfcliError(
                f"the runs differ in shape: {a.path} has {name} {va}, {b.path} has {vb}",
                hint="--compare-run needs two runs of one shape (e.g. a model and its fine-tuned child)",
            )
    if a.tokenizer.sha256 != b.tokenizer.sha256:
        raise TfcliError(
            f"the runs use different tokenizers ({a.path} and {b.path})",
            hint="--compare-run needs two runs with the same tokenizer, so the text becomes the same tokens",
        )


def parse_index(spec: str | None, count: int, what: str, default: int | None = 0, *, written: str | None = None) -> list[int]:
    """ "all" -> every index; "3" -> [3]; "-1" -> the last; None -> [default] (or every index if default is None).
    `written` is the option as the user wrote it where it named more than this index ("--head 1.9"): a mistake
    names it so, and the hint offers no 'all'.

    Example: parse_index("all", 3, "layer") -> [0, 1, 2]; parse_index("-1", 3, "layer") -> [2]
    """
    if spec is None:
        return list(range(count)) if default is None else [default]
    value = _index_value(spec, what, written)
    if value is None:
        return list(range(count))
    if not -count <= value < count:
        named = f"{written}: {what} {value}" if written else f"--{what} {value}"
        raise TfcliError(
            f"{named} is out of range (this attention has {count} {what}{'s' if count != 1 else ''})",
            hint=f"pick {index_choices(count)}" + ("" if written else ", or 'all'"),
        )
    return [value % count]


def index_choices(count: int) -> str:
    """The indices a layer or head may take, negative ones counting from the end.

    Example: index_choices(2) -> "0 to 1, or -1 to -2 from the end"; index_choices(1) -> "0, or -1 from the end"
    """
    if count == 1:
        return "0, or -1 from the end"
    return f"0 to {count - 1}, or -1 to -{count} from the end"


def _index_value(spec: str, what: str, written: str | None) -> int | None:
    """An index as written ("-1"), or None for 'all'; anything else is a TfcliError naming the option."""
    if spec.strip().lower() == "all":
        return None
    try:
        return int(spec)
    except ValueError:
        named = f"{written}: the {what}" if written else f"--{what}"
        raise TfcliError(f"{named} must be a number or 'all', not {spec!r}") from None


def split_layer_head(layer: str | None, head: str | None) -> tuple[str | None, str | None]:
    """--head LAYER.HEAD as --layer LAYER --head HEAD. Example: (None, "1.0") -> ("1", "0")"""
    if head is None or "." not in head:
        return layer, head
    if layer is not None:
        raise TfcliError(f"--head {head} names its layer already", hint="drop --layer, or pass --head as a head number")
    layer_part, _, head_part = head.partition(".")
    if not layer_part.strip() or not head_part.strip() or "." in head_part:
        raise TfcliError(f"--head {head!r} is not LAYER.HEAD", hint="write 1.0 for layer 1, head 0")
    return layer_part.strip(), head_part.strip()


def check_layer_and_head(layer: str | None, head: str | None) -> None:
    """Before any work: --layer and --head (or --head LAYER.HEAD) are numbers or 'all'; the ranges need the model."""
    layer_spec, head_spec = split_layer_head(layer, head)
    written = _written_head(head, head_spec)
    for spec, what in ((layer_spec, "layer"), (head_spec, "head")):
        if spec is not None:
            _index_value(spec, what, written)


def parse_layers_and_heads(
    layer: str | None, head: str | None, n_layers: int, n_heads: int, default_layer: int | None = 0, default_head: int | None = 0
) -> tuple[list[int], list[int]]:
    """--layer and --head, or --head LAYER.HEAD, as the layers and heads they pick (`parse_index` each); a
    mistake in LAYER.HEAD names it as written ("--head 1.9: head 9 is out of range").

    Example: parse_layers_and_heads(None, "1.-1", 2, 4) -> ([1], [3])
    """
    layer_spec, head_spec = split_layer_head(layer, head)
    written = _written_head(head, head_spec)
    return (
        parse_index(layer_spec, n_layers, "layer", default_layer, written=written),
        parse_index(head_spec, n_heads, "head", default_head, written=written),
    )


def _written_head(head: str | None, head_spec: str | None) -> str | None:
    """--head as the user wrote it ("--head 1.9") where it named its layer too; None for a plain head number."""
    return f"--head {head.strip()}" if head is not None and head_spec != head else None
