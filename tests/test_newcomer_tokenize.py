"""A newcomer's tokenize mistakes and the world's files: UTF-16 and UTF-32 text, a CSV named .jsonl, a CSV cut by
semicolons, a GGUF file given as the tokenizer, BERT's words in other scripts, a lone combining mark shown, labeled
sets without input, and encoding memory that does not grow with the input. Each is read right, or one line
(exit 2)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, normalizers, pre_tokenizers

from tests.helpers import run
from tfcli.data.labeled import read_labeled
from tfcli.errors import TfcliError
from tfcli.tokenizer.show import DOTTED_CIRCLE, label_text
from tfcli.tokenizer.trace import wordpiece_words

TEXT = "Héllo wörld, the café 😀 is open.\n\n東京は晴れです。\n"


def _documents(shard_dir: Path, tokenizer: Path) -> list[str]:
    """The shards' documents decoded by `tokenizers` itself, train then validation."""
    meta = json.loads((shard_dir / "meta.json").read_text())
    hf = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    texts = []
    for split in ("train", "val"):
        ids = np.fromfile(shard_dir / f"{split}.bin", dtype=meta["dtype"]).tolist()
        while ids:
            end = ids.index(meta["eos_id"])
            texts.append(hf.decode(ids[:end]))
            ids = ids[end + 1 :]
    return texts


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be-bom", "utf-32", "utf-8-sig"])
def test_text_with_a_byte_order_mark_is_read_as_the_mark_says(cli, trained_tokenizer, tmp_path, encoding):
    """UTF-16 with its BOM (Windows' "Unicode" text, Excel's exports) was refused as binary for its zero bytes, and
    skipped as binary in a folder; a UTF-8 BOM became a character of the vocabulary. Now each is its characters."""
    data = b"\xfe\xff" + TEXT.encode("utf-16-be") if encoding == "utf-16-be-bom" else TEXT.encode(encoding)
    assert b"\x00" in data or encoding == "utf-8-sig"
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "notes.txt").write_bytes(data)

    result = cli("tokenize", "train", tmp_path / "corpus", "-o", tmp_path / "char", "--model", "char", "--vocab-size", "100", "--json")
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["skipped_binary"] == [] and summary["invalid_bytes"] == 0
    vocab = json.loads((tmp_path / "char" / "tokenizer.json").read_text())["model"]["vocab"]
    assert {"é", "ö", "😀", "東"} <= set(vocab) and not {"\x00", "\ufeff", "\ufffd"} & set(vocab)

    result = cli("tokenize", "encode", tmp_path / "corpus" / "notes.txt", "-t", trained_tokenizer, "-o", tmp_path / "shards", "--val-fraction", "0")
    assert result.code == 0, result.stderr
    assert _documents(tmp_path / "shards", trained_tokenizer) == ["Héllo wörld, the café 😀 is open.", "東京は晴れです。"]


def test_bad_bytes_in_utf16_are_replaced_and_counted_like_bad_utf8(cli, tmp_path):
    """A lone surrogate (2 bytes) and an odd byte at the end: 3 bytes replaced with U+FFFD and counted."""
    corpus = tmp_path / "broken.txt"
    corpus.write_bytes(b"\xff\xfe" + "ab".encode("utf-16-le") + b"\x00\xd8" + "cd\n".encode("utf-16-le") + b"x")
    result = cli("tokenize", "train", corpus, "-o", tmp_path / "char", "--model", "char", "--vocab-size", "50", "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["invalid_bytes"] == 3
    vocab = json.loads((tmp_path / "char" / "tokenizer.json").read_text())["model"]["vocab"]
    assert {"a", "b", "c", "d", "\ufffd"} <= set(vocab)


def test_utf16_records_are_read_too(cli, tmp_path):
    (tmp_path / "a.jsonl").write_bytes('{"text": "json en UTF-16 é"}\n'.encode("utf-16"))
    (tmp_path / "b.tsv").write_bytes("text\tlabel\nexport ß\t1\n".encode("utf-16"))
    result = cli("tokenize", "train", tmp_path / "a.jsonl", tmp_path / "b.tsv", "-o", tmp_path / "char", "--model", "char", "--vocab-size", "60")
    assert result.code == 0, result.stderr
    vocab = json.loads((tmp_path / "char" / "tokenizer.json").read_text())["model"]["vocab"]
    assert {"é", "ß"} <= set(vocab) and "{" not in vocab and "\t" not in vocab


@pytest.mark.parametrize(("name", "content", "kind"), [("data.jsonl", 'text,label\n"a, b",1\n', "CSV"), ("data.json", "text\tlabel\nhi\t1\n", "TSV")])
def test_a_table_named_as_json_lines_is_named_as_the_table_it_is(cli, tmp_path, name, content, kind):
    path = tmp_path / name
    path.write_text(content)
    result = cli("tokenize", "train", path, "-o", tmp_path / "tok")
    assert result.code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert f"it looks like a {kind} header ('text', 'label')" in lines[0]
    assert f"name the file .{kind.lower()} or pass --input-format {kind.lower()}" in lines[0]
    assert cli("tokenize", "train", path, "-o", tmp_path / "tok", "--input-format", kind.lower(), "--model", "char", "--vocab-size", "40").code == 0


def test_labeled_data_named_jsonl_but_csv_gets_the_hint_without_an_option_it_lacks(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("text,label\ngood,1\nbad,0\n")
    with pytest.raises(TfcliError) as caught:
        read_labeled(path, "classify")
    assert "it looks like a CSV header ('text', 'label')" in str(caught.value)
    assert caught.value.hint == "name the file .csv, or convert it to JSON lines"


def test_plain_text_named_jsonl_is_not_called_a_table(cli, tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_text("hello world, again\n")
    result = cli("tokenize", "train", path, "-o", tmp_path / "tok")
    assert result.code == 2 and "looks like" not in result.stderr and "--input-format text" in result.stderr


@pytest.mark.parametrize(("separator", "hint"), [(";", "convert the file"), ("\t", "--input-format tsv")])
def test_a_csv_cut_by_another_separator_names_it(cli, tmp_path, separator, hint):
    path = tmp_path / "data.csv"
    path.write_text(f"\ufefftext{separator}label\nhello{separator}1\n")
    result = cli("tokenize", "train", path, "-o", tmp_path / "tok")
    assert result.code == 2
    assert f"seems to separate columns with {separator!r}, not ','" in result.stderr and hint in result.stderr


def test_a_gguf_file_as_the_tokenizer_says_how_to_get_its_tokenizer(cli, tiny_corpus, tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 64)
    for args in (("encode", tiny_corpus, "-o", tmp_path / "shards"), ("show", "hello")):
        result = cli("tokenize", *args, "-t", gguf)
        assert result.code == 2
        assert (
            result.stderr.strip()
            == f"error: {gguf} is a GGUF file (llama.cpp's), not a tokenizer.json; import it first (tfcli import {gguf} -o RUN), then pass the run folder: -t RUN"
        )
    assert not (tmp_path / "shards").exists()


@pytest.mark.parametrize(
    "text",
    [
        "e\u0301e\u0301 e\u0301 caf\u00e9",  # combining marks stay in their word
        "東京は晴れです。",  # CJK ideographs alone, kana together
        "family 👨\u200d👩\u200d👧 ok!",  # emoji stay in their word, the zero-width joiner dropped
        "שלום, עולם مرحبا",
        "US$5 a+b=c ~x `y` {z} «q» x\x1by",
    ],
)
def test_trace_cuts_words_as_bert_does(text):
    """The trace's WordPiece words against `tokenizers`' own BERT normalizer and pre-tokenizer (accents and case kept).
    Combining marks and emoji used to be cut off as punctuation, and CJK ideographs kept together."""
    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False)
    reference = [word for word, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(normalizer.normalize_str(text))]
    assert wordpiece_words(text) == reference


def test_trace_merges_a_word_with_combining_marks(cli):
    result = cli("tokenize", "trace", "e\u0301e\u0301 e\u0301", "--model", "wordpiece", "--json")
    assert result.code == 0
    trace = json.loads(result.stdout)
    assert trace["text"] == "e\u0301e\u0301 e\u0301"
    assert trace["merges"][0]["pair"] == ["e", "##\u0301"]  # the accent was a word of its own, never merged
    printed = cli("tokenize", "trace", "e\u0301e\u0301 e\u0301", "--model", "wordpiece").stdout
    assert f"start (6 tokens): ##{DOTTED_CIRCLE}\u0301 3, e 2, ##e 1" in printed  # not a mark on the # before it


def test_a_token_that_starts_with_a_combining_mark_is_drawn_on_a_dotted_circle(cli, trained_tokenizer):
    """A lone U+0301 printed after the padding of the token before it sat on that space, and read as nothing."""
    assert label_text("\u0301") == DOTTED_CIRCLE + "\u0301"
    assert label_text(" \u0301") == "\u2423" + DOTTED_CIRCLE + "\u0301"
    assert label_text("e\u0301") == "e\u0301"
    result = cli("tokenize", "show", "e\u0301", "-t", trained_tokenizer)
    assert result.code == 0 and DOTTED_CIRCLE + "\u0301" in result.stdout


@pytest.mark.parametrize(("task", "record"), [("classify", {"text": "", "label": "a"}), ("seq2seq", {"source": " ", "target": "x"})])
def test_a_labeled_set_whose_inputs_are_all_empty_is_refused(tmp_path, task, record):
    """It trained on 0 input tokens a step without a word."""
    path = tmp_path / "data.jsonl"
    other = dict(record, label="b") if task == "classify" else record
    path.write_text(json.dumps(record) + "\n" + json.dumps(other) + "\n")
    with pytest.raises(TfcliError) as caught:
        read_labeled(path, task)
    first = "text" if task == "classify" else "source"
    assert caught.value.message == f"every {first!r} in {path} is empty (2 records), so there is no input to learn from"
    assert f"--{first}-field" in caught.value.hint


ENCODE_PEAK = """
import re, sys
from pathlib import Path
from tfcli.cli.app import main
try:
    main(["tokenize", "encode", sys.argv[1], "-t", sys.argv[2], "-o", sys.argv[3], "--val-fraction", "0"])
except SystemExit as exc:
    assert not exc.code, exc.code
print(re.search(r"VmHWM:\\s*(\\d+)", Path("/proc/self/status").read_text()).group(1))  # not ru_maxrss: it keeps the forking parent's
"""


@pytest.mark.slow
def test_encode_memory_does_not_grow_with_a_long_line(tmp_path):
    """One line of 64 MB against one of 6 MB, of the sample stories' words: glibc kept the megabyte blocks encoding
    frees, and the peak grew with the input (by 23 MB here, 73 MB for a 200 MB line); freed memory handed back
    after each batch, it stays within a few MB."""
    stories = Path(__file__).parents[1] / "sample_data" / "corpus" / "stories.txt"
    tokenizer = tmp_path / "tok"
    assert run("tokenize", "train", stories, "-o", tokenizer, "--vocab-size", "1000").code == 0
    words = stories.read_text().split()
    rng = random.Random(0)
    peaks = []
    for megabytes in (6, 64):
        line = tmp_path / f"line{megabytes}.txt"
        with open(line, "w") as handle:
            for _ in range(megabytes * 10):
                handle.write(" ".join(rng.choices(words, k=20_000)) + " ")
        ran = subprocess.run(
            [sys.executable, "-c", ENCODE_PEAK, str(line), str(tokenizer), str(tmp_path / f"shards{megabytes}")],
            capture_output=True,
            text=True,
            check=True,
        )
        peaks.append(int(ran.stdout.split()[-1]))
    assert peaks[1] - peaks[0] < 12_000, peaks  # kB


def test_unigram_too_small_names_a_size_that_trains(cli, tiny_corpus, tmp_path):
    """Asked for the alphabet plus the special tokens, Unigram's trainer returned more pieces than asked, and the
    error then asked for that very size again; it names one that trains."""
    result = cli("tokenize", "train", tiny_corpus, "-o", tmp_path / "big", "--model", "unigram", "--vocab-size", "1000", "--json")
    assert result.code == 0, result.stderr
    alphabet = json.loads(result.stdout)["alphabet_size"]
    result = cli("tokenize", "train", tiny_corpus, "-o", tmp_path / "small", "--model", "unigram", "--vocab-size", alphabet + 5)
    assert result.code == 2
    assert f"pass --vocab-size {alphabet + 6} or more" in result.stderr and "--limit-alphabet" not in result.stderr
    result = cli("tokenize", "train", tiny_corpus, "-o", tmp_path / "small", "--model", "unigram", "--vocab-size", alphabet + 6, "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["vocab_size"] == alphabet + 6


@pytest.mark.parametrize(("codec", "named"), [("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE")])
def test_utf16_without_its_mark_is_named_with_the_command_that_converts_it(cli, tmp_path, codec, named):
    """Without a byte-order mark there is no telling UTF-16 for sure, so it stays refused, but as what it likely is."""
    path = tmp_path / "notes.txt"
    path.write_bytes("Hello world, café.\n".encode(codec) * 20)
    result = cli("tokenize", "train", path, "-o", tmp_path / "tok")
    assert result.code == 2
    assert result.stderr.strip() == (
        f"error: {path} looks like {named} text without a byte-order mark (every other byte is NUL); "
        f"convert it to UTF-8: iconv -f {named} -t UTF-8 {path} > {tmp_path / 'notes.utf8.txt'}"
    )
    image = tmp_path / "image.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00")
    assert "looks like a binary file (it holds NUL bytes)" in cli("tokenize", "train", image, "-o", tmp_path / "tok").stderr
