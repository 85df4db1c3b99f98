"""Everything that makes a device faster than plain PyTorch, attached to a built model by one call.

The model (`tfcli/model/`) is plain PyTorch and imports nothing from here. `accelerate(model)` changes a
built model in place, keeping its parameters and state dict:
- its nn.Linear modules become `products.Linear`: each product, in each direction, goes through the library
  measured fastest on this machine for its class of shapes (PyTorch's own, oneDNN, or for one row tfcli's
  C matrix-vector loop);
- its loss over the vocabulary becomes `fused_loss.VocabularyLoss`: the fused loss unless the plain one
  measured clearly faster (not where the config soft-caps the logits: the fused loss has no cap, and the
  model scores capped logits with the plain loss);
- its batch-1 decoding step on the CPU may be tfcli's C decoder step (`decode_step.py`), for the settings
  that step is known to implement, where it measured faster than PyTorch's step; or the step compiled by
  torch.compile (`compiled_step.py`), where an explicit tuning (`tfcli bench generate`) measured it the
  fastest of the three;
- a quantized run's linear layers (`tfcli.quant.linear.QuantLinear`) multiply through tfcli's C code for their
  block format (`quant.py`, a build per SIMD path), where it measured faster than the dequantized product.
The loader also moves a decoding fp32 model's weights into transparent huge pages on Linux (`memory.py`).
Every choice is measured on the machine at hand (`choices.py`) and checked against plain PyTorch before
use. `TFCLI_ACCEL=0` turns all of it off; `report()` says what was chosen here and why.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from tfcli.accel import choices, compiled_step, decode_step, fused_loss, native, products, quant
from tfcli.accel.machine import processor_name, vector_extensions

OFF_VALUES = ("0", "false", "no", "off")


def enabled() -> bool:
    return os.environ.get("TFCLI_ACCEL", "1").strip().lower() not in OFF_VALUES


def accelerate(model):
    """Attach this machine's faster paths to `model` (a tfcli Transformer), in place; returns it. With
    TFCLI_ACCEL=0 the model stays plain."""
    if not enabled():
        return model

    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = products.Linear  # the same object, parameters and hooks; another forward
    model.vocabulary_loss = fused_loss.VocabularyLoss()
    model.fast_decode_step = compiled_step.bind  # (model, cache) -> the compiled step or the C step as measured, or None
    quant.attach(model)  # a quantized run's linear layers: tfcli's C products for their block formats (quant.py)
    return model


def report() -> dict[str, Any]:
    """This machine, the libraries tfcli can use here, and every decision measured on it so far."""
    data: dict[str, Any] = {
        "processor": processor_name(),
        "vector_extensions": vector_extensions(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "accel": "on" if enabled() else "off (TFCLI_ACCEL=0)",
    }
    if not enabled():
        return data
    store = choices.choices()
    data.update(
        {
            "onednn": "checked against PyTorch" if products.available(products.ONEDNN) else "not available in this torch build",
            "c_code": "built and checked against PyTorch" if native.library() is not None else f"not used: {native.problem()}",
            "c_decoder_step": decode_step.describe(),
            "decisions_file": str(store.path) if store.path is not None else None,
            "notes": list(store.notes),
            "decisions": {key: decision.to_json() for key, decision in sorted(store.decisions.items())},
            "measured_busy": [key for key, decision in sorted(store.decisions.items()) if decision.measured_busy()],
        }
    )
    return data
