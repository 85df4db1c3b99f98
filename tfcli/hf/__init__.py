"""Hugging Face interop: import a transformers model folder (GPT-2, Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma 3, BERT) into a run
directory, and export a run to a folder `from_pretrained` loads. Needs no transformers; reads safetensors only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfcli.hf import gpt2
from tfcli.hf.convert import export_hf, import_hf
from tfcli.model.config import ModelConfig

__all__ = ["export_gpt2", "export_hf", "gpt2_config", "gpt2_incompatibility", "import_hf"]


def gpt2_incompatibility(config: ModelConfig) -> str | None:
    """The first option GPT-2 cannot express, as a sentence, or None (the benches build GPT-2 shapes)."""
    return gpt2.incompatible(config, "GPT2LMHeadModel")


def gpt2_config(config: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return gpt2.hf_config(config, "GPT2LMHeadModel", {} if eos_id is None else {"eos": eos_id})


def export_gpt2(run_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Export a run with GPT-2's options (export_hf picks GPT2LMHeadModel for it)."""
    return export_hf(run_dir, out_dir)[1]
