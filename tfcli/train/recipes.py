"""Training recipes (`train pretrain --recipe`): named sets of model and training settings, laid over the
preset and under a config file, `--set` and the options (so any one of them can still be changed).

- classic: nanoGPT's 2023 recipe, tfcli's settings as they have been: AdamW, cosine decay, GELU, LayerNorm,
  learned positions, biases, the output layer tied to the token embeddings.
- modern: what the modded-nanogpt speedrun found, where it also helps a small model on a CPU, in a shape
  the model formats hold (a modern run exports as Qwen3, to Hugging Face and to GGUF):
  - Muon on the blocks' weight matrices (AdamW on embeddings, head, norms and biases);
  - a warm-up, stable, decay schedule (the decay over the last fifth);
  - rotary positions, RMSNorm without biases, a SwiGLU MLP;
  - QK-norm, output projections initialised at zero;
  - an untied output layer.
  Two of the speedrun's tricks are left off (OTHER_TRICKS), measured at the one-command path's size (`tiny`, a
  vocabulary of a few thousand): logits soft-capped at 30 did not lower the validation loss at equal steps
  and made a step 1.5x slower; ReLU² in a plain MLP was level with SwiGLU, but no format llama.cpp or
  transformers reads holds it beside rotary positions.

`tfcli bench recipe` measures one against the other (and, with --ablate, modern with each of its tricks
left out and with each other trick put in) at equal wall time on texts of different kinds;
docs/benchmarks.md holds the figures.
"""

from __future__ import annotations

from typing import Any

from tfcli.errors import TfcliError

CLASSIC: dict[str, Any] = {}
# Each trick by name, with the settings it takes: those the modern recipe turns on, and those measured and left off.
MODERN_TRICKS: dict[str, dict[str, Any]] = {
    "muon": {"train.optimizer": "muon"},
    "wsd": {"train.schedule": "wsd"},
    "rotary": {"model.positions": "rotary"},
    "rmsnorm": {"model.norm": "rmsnorm", "model.bias": False},
    "swiglu": {"model.activation": "swiglu"},
    "qk_norm": {"model.qk_norm": True},
    "zero_init_proj": {"model.zero_init_proj": True},
    "untied": {"model.tie_embeddings": False},
}
OTHER_TRICKS: dict[str, dict[str, Any]] = {
    "relu2": {"model.activation": "relu2"},  # in place of SwiGLU
    "softcap": {"model.logit_softcap": 30.0},
}
RECIPES: dict[str, dict[str, Any]] = {
    "classic": CLASSIC,
    "modern": {key: value for trick in MODERN_TRICKS.values() for key, value in trick.items()},
}


def recipe_settings(name: str, *, without: tuple[str, ...] = (), adding: tuple[str, ...] = ()) -> dict[str, Any]:
    """The settings of a recipe (dotted keys, as a config file's [model] and [train] tables give them), with the
    modern tricks named in `without` left out and the other tricks in `adding` put in. Example:
    recipe_settings("modern", without=("muon",)) has no train.optimizer."""
    if name not in RECIPES:
        raise TfcliError(f"unknown recipe {name!r}", hint=f"use one of {', '.join(RECIPES)}")
    for tricks, known in ((without, MODERN_TRICKS), (adding, OTHER_TRICKS)):
        unknown = [trick for trick in tricks if trick not in known]
        if unknown:
            raise TfcliError(f"unknown trick {unknown[0]!r}", hint=f"the tricks are {', '.join(known)}")
    left_out = {key for trick in without for key in MODERN_TRICKS[trick]}
    settings = {key: value for key, value in RECIPES[name].items() if key not in left_out}
    return settings | {key: value for trick in adding for key, value in OTHER_TRICKS[trick].items()}
