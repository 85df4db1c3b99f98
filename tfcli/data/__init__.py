"""Corpora, token shards and labeled data sets: everything between text on disk and batches."""
