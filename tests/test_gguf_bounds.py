"""GGUF import bounded by what a vocabulary can be, and GGUF export and import that leave nothing half-written.

A token past its cap and an array longer than a vocabulary are refused in one line from the lengths and counts
alone, before what they count is read (a sparse file of 2**26 empty strings costs no memory); the merges a
SentencePiece-style vocabulary implies are found in work linear in its characters (a 300 KB token is no longer
22 s of slicing) and are exactly those of the definition. A full disk during an export is one line with no file
left; what a killed export or import left is removed by the next one to the same place; a killed import leaves
no half-made run folder.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, snapshot
from tests.gguf_files import gguf_copy, new_gguf
from tests.helpers import mounted_tmpfs

gguf = pytest.importorskip("gguf")

SPECIALS = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
SPECIAL_TYPES = [2, 3, 3, *[6] * 256]
HALF = "ab" * 75_000  # 150 KB
LONG = HALF + HALF  # 300 KB: its one split is HALF + HALF
OLD = time.time() - 3600  # an hour ago: what a killed writer left is that old


def _write_llama(path: Path, tokens: list[str], types: list[int], d: int = 16) -> Path:
    """A tiny SentencePiece-style llama GGUF (one layer, random weights) with this vocabulary."""
    with new_gguf(path, "llama") as writer:
        writer.add_context_length(32)
        writer.add_embedding_length(d)
        writer.add_block_count(1)
        writer.add_feed_forward_length(32)
        writer.add_rope_dimension_count(d // 2)
        writer.add_head_count(2)
        writer.add_head_count_kv(2)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_rope_freq_base(10000.0)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores([0.0] * len(tokens))
        writer.add_token_types(types)
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        rng = np.random.default_rng(0)
        shapes = {"token_embd": (len(tokens), d), "output_norm": (d,)}
        shapes |= {f"blk.0.{name}": (d, d) for name in ("attn_q", "attn_k", "attn_v", "attn_output")}
        shapes |= {"blk.0.ffn_gate": (32, d), "blk.0.ffn_up": (32, d), "blk.0.ffn_down": (d, 32), "blk.0.attn_norm": (d,), "blk.0.ffn_norm": (d,)}
        for name, shape in shapes.items():
            writer.add_tensor(f"{name}.weight", rng.standard_normal(shape).astype(np.float32))
    return path


def _small_vocab() -> tuple[list[str], list[int]]:
    tokens = [*SPECIALS, "a", "b", "ab", "▁a", "▁ab"]
    return tokens, [*SPECIAL_TYPES, *[1] * 5]


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> Path:
    return _write_llama(tmp_path_factory.mktemp("gguf") / "small.gguf", *_small_vocab())


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, small_gguf) -> Path:
    from tfcli.gguf import import_gguf

    run = tmp_path_factory.mktemp("run") / "run"
    import_gguf(small_gguf, run)
    return run


def _one_line_refusal(result, *named: str) -> None:
    assert result.code == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    for words in named:
        assert words in result.stderr, (words, result.stderr)


def _staging_left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# ---- item 8: what a vocabulary can be ----------------------------------------------------------------------


def test_a_300_kb_token_is_refused_naming_the_key_and_the_cap(cli, tmp_path):
    tokens, types = _small_vocab()
    path = _write_llama(tmp_path / "long.gguf", [*tokens, HALF, LONG], [*types, 1, 1])
    result = cli("import", path, "-o", tmp_path / "run")
    _one_line_refusal(result, "metadata tokenizer.ggml.tokens item 264 (150,000 bytes)", "64 KiB", "TFCLI_MAX_GGUF_TOKEN_BYTES")
    assert not (tmp_path / "run").exists() and _staging_left(tmp_path) == []


def test_a_300_kb_token_within_a_raised_cap_imports_with_work_linear_in_the_vocabulary(cli, tmp_path, monkeypatch):
    """Every character is hashed once as a token's and once more as a piece's, and each side of each cut is
    at most one lookup; the quadratic way sliced the 300 KB piece at each of its 300,000 cuts (22 s in the audit)."""
    from tfcli.gguf import splits

    tokens, types = _small_vocab()
    tokens, types = [*tokens, HALF, LONG], [*types, 1, 1]
    path = _write_llama(tmp_path / "long.gguf", tokens, types)
    hashed = {"characters": 0, "substrings": 0}
    prefix_sums, keys = splits._Hasher.prefix_sums, splits._Hasher.keys

    def counted_prefix_sums(self, text):
        hashed["characters"] += len(text)
        return prefix_sums(self, text)

    def counted_keys(self, sums, starts, ends):
        hashed["substrings"] += len(starts)
        return keys(self, sums, starts, ends)

    monkeypatch.setattr(splits._Hasher, "prefix_sums", counted_prefix_sums)
    monkeypatch.setattr(splits._Hasher, "keys", counted_keys)
    monkeypatch.setenv("TFCLI_MAX_GGUF_TOKEN_BYTES", "1M")
    result = cli("import", path, "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    pieces = [t for t, kind in zip(tokens, types) if kind == 1 and len(t) > 1]
    assert hashed["characters"] == sum(map(len, tokens)) + sum(map(len, pieces))  # each token, then each piece, once
    cuts = sum(len(p) - 1 for p in pieces)
    assert len(tokens) + cuts <= hashed["substrings"] <= len(tokens) + 2 * cuts  # each token, each cut's left side, its right where needed
    spec = json.loads((tmp_path / "run" / "tokenizer.json").read_text(encoding="utf-8"))
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in spec["model"]["merges"]]
    assert merges == [["a", "b"], ["▁a", "b"], [HALF, HALF]]  # "▁" is no token here; HALF has no split in two tokens
    assert spec["model"]["vocab"][LONG] == len(tokens) - 1


def _reference_merges(tokens: list[str], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """The definition, as the quadratic code wrote it: every cut of every piece whose two sides are tokens."""
    vocab = set(tokens)
    merges = []
    for i, (piece, kind) in enumerate(zip(tokens, types)):
        if kind != 1 or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            if piece[:cut] in vocab and piece[cut:] in vocab:
                merges.append((-scores[i], i, cut, piece[:cut], piece[cut:]))
    return [(left, right) for *_, left, right in sorted(merges)]


def _vocab(tokens: list[str], types: list[int], scores: list[float]):
    from tfcli.gguf.vocab import Vocab

    metadata = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
    }
    return Vocab(metadata, "test.gguf")


@pytest.mark.parametrize("collisions", [False, True], ids=["hashes as they are", "hashes mod 7 and 5"])
@pytest.mark.parametrize("seed", range(6))
def test_the_merges_are_those_of_the_definition(seed, collisions, monkeypatch):
    """Against the definition, on random vocabularies; with primes so small that most hashes collide too, which
    the check on the strings must absorb."""
    from tfcli.gguf import splits

    if collisions:
        monkeypatch.setattr(splits, "PRIMES", (7, 5))
    rng = random.Random(seed)
    alphabet = ["ab", "abc", "a▁b🦊", "xyzw", "日本語"][seed % 5]
    longest = [3, 8, 40, 3, 8, 200][seed]
    tokens = list(dict.fromkeys("".join(rng.choice(alphabet) for _ in range(rng.randint(1, longest))) for _ in range(600)))
    types = [rng.choice([1, 1, 1, 3, 4, 6]) for _ in tokens]
    scores = [float(rng.choice([0, -1, -rng.randint(1, 50)])) for _ in tokens]
    vocab = _vocab(tokens, types, scores)
    assert vocab._sentencepiece_merges({t: i for i, t in enumerate(tokens)}) == _reference_merges(tokens, types, scores)


def test_token_splits_finds_every_split_of_the_example():
    from tfcli.gguf.splits import token_splits

    found = [tuple(row) for arrays in token_splits(["a", "b", "ab", "abb", "bb"], [2, 3]) for row in zip(*(a.tolist() for a in arrays))]
    assert found == [(2, 1, 0, 1), (3, 1, 0, 4), (3, 2, 2, 1)]


def test_merges_past_what_a_tokenizer_json_holds_are_refused(monkeypatch):
    """60 pieces a, aa, ..., a*60: 1,830 characters of tokens imply 1,770 merges of 72,000 characters."""
    tokens = ["a" * n for n in range(1, 61)]
    vocab = _vocab(tokens, [1] * 60, [0.0] * 60)
    monkeypatch.setenv("TFCLI_MAX_TOKENIZER_BYTES", "8K")
    with pytest.raises(Exception, match="merges .* more than 8 KiB of text, the limit on a tokenizer.json; set TFCLI_MAX_TOKENIZER_BYTES"):
        vocab.tokenizer_json()


def _header(keys: list[bytes]) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(keys)) + b"".join(keys)


def _key(name: str, kind: int, body: bytes) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", kind) + body


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def _sparse_gguf(path: Path, key: str, item_type: int, count: int, width: int) -> Path:
    """A GGUF whose array `key` claims `count` items, in a sparse file as large as they would be (zeros: empty
    strings, or zero numbers), which takes no disk and passes every check on the file's size."""
    arch = _key("general.architecture", 8, _string("llama"))
    model = _key("tokenizer.ggml.model", 8, _string("llama"))
    head = _header([arch, model, _key(key, 9, struct.pack("<IQ", item_type, count))])
    with open(path, "wb") as handle:
        handle.write(head)
        handle.truncate(len(head) + count * width + 4096)
    return path


SPARSE = {
    "2**26 empty tokens": ("tokenizer.ggml.tokens", 8, 8),  # string items: each its 8-byte length
    "2**26 scores": ("tokenizer.ggml.scores", 6, 4),  # float32
}


@pytest.mark.parametrize("case", list(SPARSE))
def test_an_array_longer_than_a_vocabulary_is_refused_before_it_is_read(cli, tmp_path, case):
    key, item_type, width = SPARSE[case]
    path = _sparse_gguf(tmp_path / "sparse.gguf", key, item_type, 1 << 26, width)
    result = cli("import", path, "-o", tmp_path / "run")
    _one_line_refusal(result, f"metadata {key} claims 67,108,864 items", "4,194,304 tokens a vocabulary may have")
    assert not (tmp_path / "run").exists()
    code = (
        "import resource\n"
        "from pathlib import Path\n"
        "from tfcli.errors import TfcliError\n"
        "from tfcli.gguf.reader import read_gguf\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        f"    read_gguf(Path({str(path)!r}))\n"
        "except TfcliError as exc:\n"
        "    print(exc)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    message, grown = done.stdout.strip().splitlines()
    assert "claims 67,108,864 items" in message
    assert int(grown) < 32, f"the peak memory grew by {grown} MB"  # the audit's file took 764 MB


def test_a_metadata_string_past_its_cap_is_refused_from_its_length(cli, tmp_path, small_gguf, monkeypatch):
    monkeypatch.setenv("TFCLI_MAX_GGUF_STRING_BYTES", "1K")
    path = tmp_path / "template.gguf"
    with gguf_copy(small_gguf, path) as writer:
        writer.add_chat_template("{{ messages }}" * 100)
    result = cli("import", path, "-o", tmp_path / "run")
    _one_line_refusal(result, "metadata tokenizer.chat_template (1,400 bytes)", "1 KiB", "TFCLI_MAX_GGUF_STRING_BYTES")


def test_the_strings_of_an_array_are_capped_together(cli, tmp_path, small_gguf, monkeypatch):
    monkeypatch.setenv("TFCLI_MAX_TOKENIZER_BYTES", "1K")  # the 259 specials alone are 1.5 KiB
    result = cli("import", small_gguf, "-o", tmp_path / "run")
    _one_line_refusal(result, "the strings of metadata tokenizer.ggml.tokens come to more than 1 KiB", "TFCLI_MAX_TOKENIZER_BYTES")


# ---- item 9: export, nothing half-written --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "No space left on device"),
        (OSError("16384 requested and 8696 written"), "16384 requested and 8696 written"),  # numpy's tofile drops the errno
    ],
    ids=["ENOSPC", "numpy's short write"],
)
def test_a_write_error_during_an_export_is_one_line_and_leaves_no_file(cli, tmp_path, small_run, monkeypatch, error, said):
    def fails_half_way(self, *args, **kwargs):
        self.fout[0].write(b"\0" * 4096)
        raise error

    monkeypatch.setattr(gguf.gguf_writer.GGUFWriter, "write_tensors_to_file", fails_half_way)
    target = tmp_path / "new" / "x.gguf"
    result = cli("export", small_run, "--to", "gguf", "-o", target)
    _one_line_refusal(result, f"could not write {target}: {said}")
    assert not (tmp_path / "new").exists(), list((tmp_path / "new").iterdir())  # the folder -o made goes too
    (tmp_path / "new").mkdir()
    result = cli("export", small_run, "--to", "gguf", "-o", target)
    _one_line_refusal(result, f"could not write {target}: {said}")
    assert snapshot(tmp_path / "new") == {}


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KB tmpfs, where this process may mount one (root on Linux); skipped elsewhere."""
    with mounted_tmpfs(tmp_path / "disk", "256k") as disk:
        yield disk


def test_an_export_to_a_full_disk_for_real(cli, tmp_path, small_disk):
    """numpy's tofile reports the full disk without its errno; the message still says what it was."""
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    tokens, types = _small_vocab()
    _write_llama(tmp_path / "small.gguf", tokens, types)
    assert cli("import", tmp_path / "small.gguf", "-o", tmp_path / "small").code == 0
    tokenizer = TextTokenizer.load(tmp_path / "small" / "tokenizer.json")
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, block_size=32, n_layers=2, n_heads=2, d_model=64, positions="rotary", norm="rmsnorm", activation="swiglu", bias=False
    )
    save_checkpoint(tmp_path / "wide", Transformer(config), tokenizer)  # 1 MB of weights for a 256 KB disk
    result = cli("export", tmp_path / "wide", "--to", "gguf", "-o", small_disk / "x.gguf")
    _one_line_refusal(result, f"could not write {small_disk / 'x.gguf'}: No space left on device")
    assert snapshot(small_disk) == {}


def _killed_while_holding(target: Path, folder: bool) -> None:
    """A process that was writing `target` (a temp file, or a staging folder) and was killed with SIGKILL."""
    code = (
        "import os, signal\n"
        "from pathlib import Path\n"
        "from tfcli.fsutil import held_temp_file, held_temp_folder\n"
        f"with (held_temp_folder if {folder} else held_temp_file)(Path({str(target)!r})) as tmp:\n"
        "    ((tmp / 'tokenizer.json') if tmp.is_dir() else tmp).write_bytes(b'half' * 1000)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr


def test_the_next_export_removes_what_a_killed_export_left_and_only_that(cli, tmp_path, small_run):
    from tfcli.fsutil import held_temp_file

    target = tmp_path / "x.gguf"
    _killed_while_holding(target, folder=False)
    (killed,) = _staging_left(tmp_path)
    by_hand = tmp_path / ".x.gguf.abcd1234.tmp"  # one an older tfcli left: no lock
    young = tmp_path / ".x.gguf.young123.tmp"  # too new to tell from an export that has not locked it yet
    others = [tmp_path / ".y.gguf.abcd1234.tmp", tmp_path / "x.gguf.abcd1234.tmp", tmp_path / ".x.gguf.abcd1234.tmp.keep"]
    for path in [by_hand, young, *others]:
        path.write_bytes(b"half")
    for path in [tmp_path / killed, by_hand, *others]:
        os.utime(path, (OLD, OLD))
    with held_temp_file(target) as live:  # an export at work (here, in this process): held, so kept however old
        live.write_bytes(b"mine")
        os.utime(live, (OLD, OLD))
        result = cli("export", small_run, "--to", "gguf", "-o", target)
        assert result.code == 0, result.stderr
        assert "note: removed 2 temporary files left by an interrupted run" in result.stderr, result.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, young.name, "x.gguf", *(p.name for p in others)])
    gguf.GGUFReader(target)  # the export itself is whole


def test_an_interrupted_export_leaves_nothing_even_after_its_rename(cli, tmp_path, small_run, monkeypatch):
    """A Ctrl-C that lands once the file is in place (exit 130) takes the file away too: interrupted is nothing."""
    import tfcli.gguf.convert

    def interrupted(folder):
        raise KeyboardInterrupt

    monkeypatch.setattr(tfcli.gguf.convert, "fsync_dir", interrupted)
    result = cli("export", small_run, "--to", "gguf", "-o", tmp_path / "x.gguf")
    assert result.code == 130, result.stderr
    assert list(tmp_path.iterdir()) == []


# ---- item 9: import, staged whole ----------------------------------------------------------------------------


def test_an_import_that_fails_after_the_tokenizer_leaves_no_folder_and_the_next_succeeds(cli, tmp_path, small_gguf, monkeypatch):
    import tfcli.gguf.convert

    save_checkpoint = tfcli.gguf.convert.save_checkpoint
    seen = []

    def killed(folder, *args, **kwargs):
        seen.append(sorted(p.name for p in Path(folder).iterdir()))
        raise KeyboardInterrupt

    monkeypatch.setattr(tfcli.gguf.convert, "save_checkpoint", killed)
    for run, made in ((tmp_path / "run", False), (tmp_path / "empty", True), (tmp_path / "mine", True)):
        if made:
            run.mkdir()
        if run.name == "mine":
            (run / "notes.txt").write_text("mine\n")
        before = snapshot(run) if run.exists() else None
        result = cli("import", small_gguf, "-o", run)
        assert result.code == 130, result.stderr
        assert (snapshot(run) if run.exists() else None) == before, run
        assert _staging_left(tmp_path) == []
    assert seen[0] == ["tokenizer.json", "tokenizer_config.json"]  # the tokenizer was written, in the staging folder
    monkeypatch.setattr(tfcli.gguf.convert, "save_checkpoint", save_checkpoint)
    for run in ("run", "empty", "mine"):
        result = cli("import", small_gguf, "-o", tmp_path / run)
        assert result.code == 0, result.stderr
        names = sorted(p.name for p in (tmp_path / run).iterdir())
        expected = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
        assert names == sorted([*expected, "notes.txt"] if run == "mine" else expected), run
        assert cli("generate", tmp_path / run, "-p", "ab", "--max-new-tokens", "2").code == 0
    assert _staging_left(tmp_path) == []


def test_a_killed_import_leaves_only_a_staging_folder_that_the_next_import_removes(cli, tmp_path, small_gguf):
    run = tmp_path / "run"
    code = (
        "import os, signal\n"
        "from pathlib import Path\n"
        "import tfcli.gguf.convert as convert\n"
        "def killed(folder, *args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "convert.save_checkpoint = killed\n"
        f"convert.import_gguf(Path({str(small_gguf)!r}), Path({str(run)!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not run.exists()
    (staging,) = _staging_left(tmp_path)
    assert staging.startswith(".run.") and sorted(p.name for p in (tmp_path / staging).iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    os.utime(tmp_path / staging, (OLD, OLD))
    _killed_while_holding(tmp_path / "other", folder=True)  # another place's: not this import's to remove
    result = cli("import", small_gguf, "-o", run)
    assert result.code == 0, result.stderr
    assert f"note: removed 1 temporary file left by an interrupted run in {tmp_path}: {staging}" in result.stderr, result.stderr
    assert [name for name in _staging_left(tmp_path) if name.startswith(".run.")] == []
    assert len([name for name in _staging_left(tmp_path) if name.startswith(".other.")]) == 1
    assert (run / "config.json").is_file()


@pytest.mark.parametrize("counts, words", [((0, 1 << 30), "1,073,741,824 metadata keys"), ((1 << 30, 0), "1,073,741,824 tensors")])
def test_key_and_tensor_counts_past_their_caps_are_refused_before_anything_is_read(cli, tmp_path, counts, words):
    """A sparse file of 64 GiB holds room for a billion keys or tensors by its size: the counts' own caps refuse them."""
    path = tmp_path / "counts.gguf"
    with open(path, "wb") as handle:
        handle.write(b"GGUF" + struct.pack("<IQQ", 3, *counts))
        handle.truncate(1 << 36)  # no disk: the rest reads as zeros
    result = cli("import", path, "-o", tmp_path / "run")
    variable = "TFCLI_MAX_GGUF_KEYS" if "keys" in words else "TFCLI_MAX_GGUF_TENSORS"
    _one_line_refusal(result, words, variable)
    assert not (tmp_path / "run").exists()
