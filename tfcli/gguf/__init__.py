"""GGUF interop: export a run to one file llama.cpp (and Ollama, LM Studio, llama-cpp-python) loads, and
import a GGUF file into a run directory. Written with `gguf`, llama.cpp's own package; read by a parser
that trusts nothing in the file."""

from __future__ import annotations

from tfcli.gguf.convert import TYPES, Exported, Imported, default_type, export_gguf, gguf_path, import_gguf
from tfcli.gguf.reader import read_gguf

__all__ = ["TYPES", "Exported", "Imported", "default_type", "export_gguf", "gguf_path", "import_gguf", "read_gguf"]
