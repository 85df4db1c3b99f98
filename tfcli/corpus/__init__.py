"""Reading raw input: text files, folders and globs, JSON lines, CSV, Parquet, compressed files and standard
input, in bounded pieces, with invalid UTF-8 replaced and counted. Below the tokenizer and the data layers,
which both read corpora; it knows nothing of tokens."""
