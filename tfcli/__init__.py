"""tfcli: from raw text to a trained transformer, and a look inside it.

This package must stay cheap to import: no torch, tokenizers or numpy at the top level.
"""

__version__ = "0.1.0"
