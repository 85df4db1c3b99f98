"""The vocabulary tensors a fine-tune grows when its tokenizer gains tokens (a chat template's markers), and
the modules that hold them. Here, under both, because training grows them and the Hugging Face export of a
LoRA run rebuilds the grown base the adapter was trained on.
"""

from __future__ import annotations

import torch

from tfcli.model.config import ModelConfig

VOCABULARY_TENSORS = ("tok_emb.weight", "lm_head.weight", "lm_head.bias")


def grow_vocabulary(weights: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """The parent's weights with the vocabulary tensors grown to `vocab_size` rows, new rows at the mean of the old.
    Example: tok_emb.weight (2048, d) -> (2050, d)."""
    grown = dict(weights)
    for name in VOCABULARY_TENSORS:
        tensor = weights.get(name)
        if tensor is not None and tensor.shape[0] < vocab_size:
            extra = tensor.mean(dim=0, keepdim=True).expand(vocab_size - tensor.shape[0], *tensor.shape[1:])
            grown[name] = torch.cat([tensor, extra])
    return grown


def vocabulary_modules(config: ModelConfig) -> list[str]:
    """The modules with a row per token: the embedding, and the output layer unless it is the same matrix.
    Example: a GPT-2 (tied) -> ["tok_emb"]; a Llama (untied) -> ["tok_emb", "lm_head"]."""
    return ["tok_emb"] if config.tie_embeddings else ["tok_emb", "lm_head"]
