"""The other things a run can do with text: fill in masked tokens (an encoder trained as a masked LM) and
classify texts (a run with a classification head). Both return data; the CLI renders it."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from tfcli.data.labeled import classification_ids
from tfcli.errors import TfcliError, a_or_an
from tfcli.model.transformer import HIDDEN, Transformer
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.detokenize import decode_completion

MASK_PLACEHOLDER = "[MASK]"


@dataclasses.dataclass
class Filler:
    token_id: int
    token: str  # the text the token adds after the text before the mask, as the tokenizer's decoder writes it
    # (may start with a space: byte-level and metaspace tokens carry the space before a word; a byte that is
    # only part of a character shows as U+FFFD); WordPiece: its vocabulary entry ("##ed")
    probability: float
    text: str  # the input with this token in place of the mask (other masks left as they were)


@dataclasses.dataclass
class MaskPrediction:
    position: int  # index of the mask among the masks in the text (0 = the first)
    fillers: list[Filler]


def fill_mask(model: Transformer, tokenizer: TextTokenizer, text: str, *, top_k: int = 5) -> list[MaskPrediction]:
    """The top_k most likely tokens for each mask in `text`, written `[MASK]` (or as the tokenizer's own mask
    token). The text is encoded in pieces around the masks, with the mask id inserted by id and [cls] in
    front, as masked-LM training reads it. With a byte-level, metaspace or WordPiece tokenizer, a space just
    before a mask goes to the filler (words carry their leading space in those vocabularies; a WordPiece
    `##` piece continues the word before the mask).

    Example: "The [MASK] sat on the mat" -> [MaskPrediction(0, [Filler(" cat", 0.41, "The cat sat on the mat"), ...])]
    """
    config = model.config
    if config.arch != "encoder":
        hint = {"decoder": "use --prompt to continue text", "encoder-decoder": "use --prompt SOURCE to write its target"}.get(config.arch)
        raise TfcliError(f"--fill-mask needs an encoder run (a masked LM); this run is {a_or_an(config.arch)}", hint=hint)
    if top_k < 1:
        raise TfcliError(f"--top-k must be at least 1 for --fill-mask, not {top_k}")
    mask_id = tokenizer.require("mask")
    cls_id = tokenizer.require("cls")
    mask_text = tokenizer.hf.id_to_token(mask_id) or MASK_PLACEHOLDER
    pattern = "|".join(re.escape(m) for m in dict.fromkeys([MASK_PLACEHOLDER, mask_text]))
    pieces = re.split(pattern, text)
    if len(pieces) < 2:
        raise TfcliError(f"the text has no {MASK_PLACEHOLDER} to fill in", hint=f'write one where a word is missing: "The {MASK_PLACEHOLDER} sat on the mat"')
    n_masks = len(pieces) - 1
    written = pieces
    if tokenizer.words_carry_their_space:  # the filler brings its own space (a WordPiece "##" filler none)
        pieces = [p[:-1] if p.endswith(" ") and i < n_masks else p for i, p in enumerate(pieces)]
    ids = [cls_id]
    mask_positions = []
    before_mask: list[list[int]] = []  # the ids of the text just before each mask, which its filler's text follows
    for i, piece in enumerate(pieces):
        piece_ids = tokenizer.encode(piece) if piece else []
        ids += piece_ids
        if i < len(pieces) - 1:
            before_mask.append(piece_ids)
            mask_positions.append(len(ids))
            ids.append(mask_id)
    if "sep" in tokenizer.special_ids:  # BERT's text ends with [SEP]
        ids.append(tokenizer.special_ids["sep"])
    if len(ids) > config.block_size:
        raise TfcliError(f"the text is {len(ids):,} tokens, more than the model's context ({config.block_size:,})", hint="shorten it")
    device = model.lm_head.weight.device
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=device)).logits[0, mask_positions].float()  # (masks, vocab)
    limit = min(tokenizer.vocab_size, config.vocab_size)
    logits = logits[:, :limit]
    specials = sorted({i for i in tokenizer.special_ids.values() if i < limit} | {i for i in tokenizer.hf.get_added_tokens_decoder() if i < limit})
    probs = torch.softmax(logits, dim=-1)
    if specials:  # a filler is text: special tokens are never proposed (probabilities stay the model's own)
        probs[:, specials] = 0.0
    top = probs.topk(min(top_k, limit - len(specials)), dim=-1)
    predictions = []
    for m in range(len(mask_positions)):
        fillers = []
        for p, token_id in zip(top.values[m].tolist(), top.indices[m].tolist()):
            text = decode_completion(tokenizer, before_mask[m], [token_id])  # what the decoder writes after the text before the mask
            # WordPiece: the vocabulary entry (a "##ed" continues the word before: its text is "ed", no space)
            token = tokenizer.hf.id_to_token(token_id) if tokenizer.family == "wordpiece" else text
            # where words do not carry their space, the text before the mask kept its own
            word = text if tokenizer.words_carry_their_space else text.lstrip(" ")
            filled = "".join(pieces[m] + word if i == m else written[i] + MASK_PLACEHOLDER for i in range(n_masks)) + written[-1]
            fillers.append(Filler(token_id, token, p, filled))
        predictions.append(MaskPrediction(m, fillers))
    return predictions


def label_names(training: dict[str, Any] | None, n_classes: int) -> list[str]:
    """The class names of a classifier run: config.json's training.labels when it has them (index = class id),
    else "class 0" .. "class n-1"."""
    labels = (training or {}).get("labels")
    if isinstance(labels, list) and len(labels) == n_classes and all(isinstance(x, str) for x in labels):
        return list(labels)
    return [f"class {i}" for i in range(n_classes)]


def classify(model: Transformer, tokenizer: TextTokenizer, texts: list[str], labels: list[str]) -> list[list[tuple[str, float]]]:
    """Label probabilities of each text, most likely first. The text is read as classifier training reads
    it: [cls] + text for an encoder, text + [eos] for a decoder (cropped to the context)."""
    config = model.config
    if not config.n_classes:
        raise TfcliError("this run has no classification head", hint="fine-tune one with `tfcli train finetune --task classify`, or use --prompt to generate")
    if any(not t.strip() for t in texts):
        raise TfcliError("the text to classify is empty", hint="pass some text with --classify")
    rows = classification_ids(tokenizer, config.arch, texts, config.block_size)
    longest = max(len(r) for r in rows)
    pad = tokenizer.special_ids.get("pad", 0)
    device = model.lm_head.weight.device
    ids = torch.tensor([r + [pad] * (longest - len(r)) for r in rows], device=device)  # right padding
    real = torch.tensor([[True] * len(r) + [False] * (longest - len(r)) for r in rows], device=device)
    with torch.inference_mode():
        class_logits = model(ids, real, head=HIDDEN).class_logits.float()  # (B, n_classes)
    probs = torch.softmax(class_logits, dim=-1).tolist()
    return [sorted(zip(labels, row), key=lambda pair: -pair[1]) for row in probs]
