"""A training job's data fingerprint: what a resumed run checks its data against (the shards' tokenizer,
counts, sources and content; a labeled or chat file's checksum)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tfcli.data.shards import load_shard_meta, verify_shards
from tfcli.fsutil import sha256_file


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def shard_fingerprint(shard_dir: Path) -> str:
    meta = load_shard_meta(shard_dir)
    verify_shards(shard_dir, meta, full=os.environ.get("TFCLI_VERIFY_SHARDS", "") == "full")
    described = {
        "tokenizer": meta.tokenizer_sha256,
        "train": meta.train_tokens,
        "val": meta.val_tokens,
        "sources": [s.to_json() for s in meta.sources],
        "seed": meta.seed,
    }
    if meta.checks:  # the content too (older shards have only their counts, and keep their old fingerprint)
        described["sha256"] = {split: check.sha256 for split, check in sorted(meta.checks.items())}
    return digest(described)


def file_fingerprint(*paths: Path | None) -> str:
    return digest([sha256_file(p) if p else None for p in paths])
