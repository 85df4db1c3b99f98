"""Looking inside attention: capture the weights of every layer and head (through the model's explicit
attention path, never a second copy of the math), summarise heads, and render them for a terminal, a
self-contained HTML page, a PNG or JSON.

In a notebook: `from tfcli import inspect; inspect.attention("runs/x", "The cat sat")` shows the page
inline; `inspect.logit_lens`, `inspect.ablate` and `inspect.patch` likewise (see `notebook.py`). They
import torch when called, never when this package is imported."""

from __future__ import annotations

from typing import Any


def attention(run, text: str, **options: Any):
    """Every layer and head of `text` through the run at `run`, shown inline (`notebook.attention`)."""
    from tfcli.inspect.notebook import attention as view

    return view(run, text, **options)


def logit_lens(run, text: str, **options: Any):
    """What each layer already predicts (`notebook.logit_lens`)."""
    from tfcli.inspect.notebook import logit_lens as view

    return view(run, text, **options)


def ablate(run, text: str, **options: Any):
    """The loss change when heads are knocked out (`notebook.ablate`)."""
    from tfcli.inspect.notebook import ablate as view

    return view(run, text, **options)


def patch(run, clean: str, corrupt: str, answer: str, wrong: str | None = None, **options: Any):
    """Activation patching from a corrupted text back to a clean one (`notebook.patch`)."""
    from tfcli.inspect.notebook import patch as view

    return view(run, clean, corrupt, answer, wrong, **options)


def features(run, sae, **options: Any):
    """What an SAE's features respond to: one feature, the most active ones, or those on a text (`feature_views.features`)."""
    from tfcli.inspect.feature_views import features as view

    return view(run, sae, **options)
