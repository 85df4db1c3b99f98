"""BPE tokenizers: training on HF `tokenizers`, loading with special-token roles, and the teaching trace."""
