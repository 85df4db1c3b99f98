"""Input formats of `tokenize train` / `tokenize encode` and of labeled sets: JSON lines, CSV / TSV, Parquet,
compressed files told by extension or magic bytes, standard input; skipped records counted and named; bad
files one line with exit code 2 and nothing on disk changed."""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import sys

import numpy as np
import pytest

from tests.conftest import snapshot
from tests.helpers import join_documents
from tfcli.corpus.documents import iter_document_pieces
from tfcli.corpus.reader import ReadStats, resolve_corpus
from tfcli.data.shards import META_FILE, ShardMeta
from tfcli.errors import TfcliError
from tfcli.tokenizer.core import TextTokenizer

DOCS = [f'Story {i}: the fox met a bird,\nsaid "hi" and left.\tZoë 🦊 中文 {i * 7}' for i in range(30)]


def _read(paths, **options) -> tuple[list[str], ReadStats]:
    stats = ReadStats()
    return join_documents(iter_document_pieces(resolve_corpus(paths, **options), "paragraph", stats)), stats


def _shard_documents(folder, tokenizer: TextTokenizer) -> list[str]:
    meta = ShardMeta.load(folder / META_FILE)
    ids = np.concatenate([np.fromfile(folder / f"{s}.bin", dtype="<u2") for s in ("train", "val")]).tolist()
    documents, current = [], []
    for token in ids:
        if token == meta.eos_id:
            documents.append(tokenizer.decode(current))
            current = []
        else:
            current.append(token)
    return documents


def _jsonl(records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def test_gzipped_json_lines_are_encoded_record_by_record(cli, tmp_path, trained_tokenizer):
    records = [{"text": d, "id": i} for i, d in enumerate(DOCS)]
    records[3] = {"body": "no text field"}
    records[7] = {"text": None}
    records[9] = {"text": ["a", "list"]}
    path = tmp_path / "part-0.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(_jsonl(records) + "\n\n")  # blank lines are not records
    out = tmp_path / "shards"
    result = cli("tokenize", "encode", path, "-t", trained_tokenizer, "-o", out, "--val-fraction", "0.2", "--json")
    assert result.code == 0, result.stderr
    meta = json.loads(result.stdout)
    assert meta["skipped_records"] == 3 and meta["field"] == "text"
    assert meta["skipped_record_examples"] == [
        f"{path} line 4 has no 'text' field (it has 'body')",
        f"{path} line 8: 'text' is null",
        f"{path} line 10: 'text' is a list, not a string",
    ]
    assert meta["sources"] == [{"path": str(path), "bytes": path.stat().st_size}]
    kept = [d for i, d in enumerate(DOCS) if i not in (3, 7, 9)]
    # each record is one document, its line breaks kept
    assert sorted(_shard_documents(out, TextTokenizer.load(trained_tokenizer))) == sorted(kept)
    table = cli("tokenize", "encode", path, "-t", trained_tokenizer, "-o", out)
    assert "skipped records" in table.stdout and "3 records" in table.stdout and "line 4" in table.stdout


def test_dotted_paths_reach_nested_fields(tmp_path):
    path = tmp_path / "nested.jsonl"
    path.write_text(
        _jsonl(
            [
                {"meta": {"body": "one"}},
                {"meta": {"body": "two", "x": 1}},
                {"meta": {}},
                {"a.b": "a key with a dot"},
                {"turns": [{"text": "first"}, {"text": "second"}]},
            ]
        )
    )
    documents, stats = _read([path], field="meta.body")
    assert documents == ["one", "two"] and stats.skipped_records == 3
    assert _read([path], field="a.b")[0] == ["a key with a dot"]
    assert _read([path], field="turns.1.text")[0] == ["second"]


def test_csv_with_quoted_newlines_and_tsv(tmp_path):
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="", encoding="utf-8-sig") as handle:  # with a byte-order mark, as Excel writes
        writer = csv.writer(handle)
        writer.writerow(["id", "text", "note"])
        for i, doc in enumerate(DOCS[:5]):
            writer.writerow([i, doc, 'quoted "note", with a comma\r\nand a CRLF'])
        handle.write("99\r\n")  # a short row: no text column
    documents, stats = _read([path])
    assert documents == DOCS[:5]
    assert stats.skipped_records == 1 and stats.skipped_examples[0].startswith(f"{path} line 17 has no value for the column 'text'")
    assert _read([path], field="note")[0] == ['quoted "note", with a comma\r\nand a CRLF'] * 5

    tsv = tmp_path / "rows.tsv"
    tsv.write_text('text\tlabel\nhello there\tpos\n"tab\tinside"\tneg\n', encoding="utf-8")
    assert _read([tsv])[0] == ["hello there", "tab\tinside"]
    with pytest.raises(TfcliError, match=r"rows.csv has no column 'body' \(its header: 'id', 'text', 'note'\)"):
        _read([path], field="body")


def test_parquet_is_read_in_row_groups_one_batch_at_a_time(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import tfcli.corpus.records as records

    texts = DOCS + [None, ""]
    table = pa.table({"id": list(range(len(texts))), "text": texts, "meta": [{"title": f"t{i}", "n": i} for i in range(len(texts))]})
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(table, path, row_group_size=4)
    assert pq.ParquetFile(path).metadata.num_row_groups == 8
    documents, stats = _read([path])
    assert documents == DOCS
    assert stats.skipped_records == 1 and stats.skipped_examples == [f"{path} row 31: 'text' is null"]
    assert stats.bytes_read == path.stat().st_size  # progress reaches the file's size
    assert _read([path], field="meta.title")[0] == [f"t{i}" for i in range(len(texts))]
    documents, stats = _read([path], field="id")
    assert documents == [] and stats.skipped_examples[0] == f"{path} row 1: 'id' is a number, not a string"
    with pytest.raises(TfcliError, match=r"has no column 'body' \(its columns: 'id', 'text', 'meta'\)"):
        _read([path], field="body")

    # streaming: the first document comes after one batch is read, not the whole file
    monkeypatch.setattr(records, "PARQUET_BATCH_ROWS", 3)
    read_batches = []
    original = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        for batch in original(self, *args, **kwargs):
            read_batches.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    pieces = iter_document_pieces(resolve_corpus([path]), "paragraph", ReadStats())
    assert next(pieces).text == DOCS[0] and read_batches == [3]
    assert len(list(pieces)) == len(DOCS) - 1 and len(read_batches) == 11


@pytest.mark.parametrize("kind", ["gz", "zst", "xz", "bz2"])
def test_compressed_text_by_extension_or_by_magic_bytes(tmp_path, kind):
    text = "\n\n".join(DOCS) + "\n"
    data = text.encode("utf-8")
    if kind == "zst":
        zstandard = pytest.importorskip("zstandard")
        packed = zstandard.ZstdCompressor().compress(data)
    else:
        packed = {"gz": gzip.compress, "xz": lzma.compress, "bz2": bz2.compress}[kind](data)
    named = tmp_path / f"stories.txt.{kind}"
    named.write_bytes(packed)
    unnamed = tmp_path / "stories-without-extension"  # told by its magic bytes
    unnamed.write_bytes(packed)
    for path in (named, unnamed):
        documents, stats = _read([path])
        assert documents == DOCS and stats.bytes_read == len(packed)


def test_json_lines_compressed_by_magic_and_a_folder_that_mixes_formats(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "mixed"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("plain one\n\nplain two\n", encoding="utf-8")
    (folder / "b.jsonl").write_bytes(gzip.compress(_jsonl([{"text": "json one"}]).encode()))  # gzip without .gz
    (folder / "sub" / "c.csv").write_text("text\ncsv one\n", encoding="utf-8")
    pq.write_table(pa.table({"text": ["parquet one"]}), folder / "sub" / "d.parquet")
    (folder / "e.bin").write_bytes(b"\x00\x01\x02binary")
    corpus = resolve_corpus([folder])
    assert [(f.path.name, f.format, f.compression) for f in corpus.files] == [
        ("a.txt", "text", None),
        ("b.jsonl", "jsonl", "gzip"),
        ("c.csv", "csv", None),
        ("d.parquet", "parquet", None),
    ]
    assert [p.name for p in corpus.skipped_binary] == ["e.bin"]
    assert join_documents(iter_document_pieces(corpus, "paragraph", ReadStats())) == ["plain one", "plain two", "json one", "csv one", "parquet one"]


def test_standard_input(cli, tmp_path, trained_tokenizer, monkeypatch):
    def stdin(data: bytes):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))

    out = tmp_path / "s"
    stdin(gzip.compress(_jsonl({"text": d} for d in DOCS).encode()))  # compressed JSON lines, told by the bytes
    result = cli("tokenize", "encode", "-", "-t", trained_tokenizer, "-o", out, "--val-fraction", "0", "--json")
    assert result.code == 0, result.stderr
    meta = json.loads(result.stdout)
    assert meta["train_documents"] == len(DOCS) and meta["sources"][0]["path"] == "-" and meta["sources"][0]["bytes"] > 0
    assert sorted(_shard_documents(out, TextTokenizer.load(trained_tokenizer))) == sorted(DOCS)

    stdin(b'text,label\n"a, b",x\n')
    result = cli("tokenize", "encode", "-", "-t", trained_tokenizer, "-o", out, "--val-fraction", "0", "--input-format", "csv", "--json")
    assert result.code == 0 and json.loads(result.stdout)["train_documents"] == 1

    stdin(b"plain text\n\nfrom a pipe\n")
    result = cli("tokenize", "train", "-", "-o", tmp_path / "tok", "--vocab-size", "300", "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["bytes_read"] == len("plain text\n\nfrom a pipe\n")


def test_tokenizer_training_reads_records_and_reports_skips(cli, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(_jsonl([{"text": d} for d in DOCS] + [{"txt": "typo"}]), encoding="utf-8")
    result = cli("tokenize", "train", path, "-o", tmp_path / "tok", "--vocab-size", "300", "--json")
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["skipped_records"] == 1 and summary["skipped_examples"] == [f"{path} line 31 has no 'text' field (it has 'txt')"]
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    assert tokenizer.decode(tokenizer.encode(DOCS[0])) == DOCS[0]

    wrong = cli("tokenize", "train", path, "-o", tmp_path / "tok2", "--vocab-size", "300", "--field", "body")
    assert wrong.code == 2
    assert "no record in the corpus has text in 'body': 31 skipped" in wrong.stderr and "--field" in wrong.stderr
    assert "Traceback" not in wrong.stderr and not (tmp_path / "tok2" / "tokenizer.json").exists()


def test_bad_files_are_one_line_and_keep_earlier_shards(cli, tmp_path, trained_tokenizer):
    good = tmp_path / "good.txt"
    good.write_text("\n\n".join(DOCS), encoding="utf-8")
    out = tmp_path / "s"
    assert cli("tokenize", "encode", good, "-t", trained_tokenizer, "-o", out).code == 0
    before = snapshot(out)
    (tmp_path / "fake.gz").write_text("not gzip at all")
    (tmp_path / "page.parquet").write_text("<html>404</html>")
    (tmp_path / "array.json").write_text('[{"text": "a"},\n {"text": "b"}]\n')
    (tmp_path / "pretty.jsonl").write_text('{\n  "text": "a"\n}\n')
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(_jsonl({"text": d} for d in DOCS * 50).encode())[:300])
    (tmp_path / "bad.csv").write_text('text\n"never closed\n', encoding="utf-8")
    cases = [
        ("fake.gz", [], "fake.gz is not gzip-compressed, as its name says"),
        ("page.parquet", [], "page.parquet is not a Parquet file"),
        ("array.json", [], "array.json holds a JSON array, not JSON lines"),
        ("pretty.jsonl", [], "pretty.jsonl line 1 is not valid JSON, so the file is not JSON lines"),
        ("cut.jsonl.gz", [], "cut.jsonl.gz is damaged or truncated (gzip:"),
        ("bad.csv", [], "bad.csv line 2 is not valid CSV"),
        ("good.txt", ["--input-format", "xml"], "unknown --input-format 'xml'"),
        ("good.txt", ["--field", ""], "--field cannot be empty"),
    ]
    for name, extra, message in cases:
        result = cli("tokenize", "encode", tmp_path / name, "-t", trained_tokenizer, "-o", out, *extra)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.code == 2 and len(lines) == 1 and message in lines[0], (name, result.stderr)
        assert snapshot(out) == before


def test_missing_optional_packages_are_named(cli, tmp_path, trained_tokenizer, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    zstandard = pytest.importorskip("zstandard")
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "d.parquet")
    (tmp_path / "t.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"hello"))
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    for name, needle in (
        ("d.parquet", "d.parquet is a Parquet file; reading it needs the pyarrow package"),
        ("t.txt.zst", "t.txt.zst is zstd-compressed; reading it needs the zstandard package"),
    ):
        result = cli("tokenize", "encode", tmp_path / name, "-t", trained_tokenizer, "-o", tmp_path / "s")
        assert result.code == 2 and needle in result.stderr and "pip install" in result.stderr, result.stderr


def test_memory_stays_flat_in_the_size_of_a_json_lines_file(tmp_path, trained_tokenizer, monkeypatch):
    """Python-level peak memory of encoding a JSON lines file 16x larger is about the same."""
    import tracemalloc

    import tfcli.corpus.reader as corpus_module
    import tfcli.data.shards as shards
    from tfcli.data.shards import encode_corpus

    monkeypatch.setattr(shards, "BATCH_CHARS", 1 << 15)
    monkeypatch.setattr(corpus_module, "READ_BLOCK_BYTES", 1 << 15)
    tokenizer = TextTokenizer.load(trained_tokenizer)
    peaks = []
    for copies in (1, 1, 16):  # the first run imports and builds what every later one reuses
        path = tmp_path / f"x{copies}.jsonl"
        path.write_text(_jsonl({"text": d} for d in DOCS * 40 * copies), encoding="utf-8")
        tracemalloc.start()
        encode_corpus(resolve_corpus([path]), tokenizer, tmp_path / f"s{copies}", val_fraction=0.1)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    size = (tmp_path / "x16.jsonl").stat().st_size
    assert peaks[2] < peaks[1] + size / 2, (peaks, size)  # holding the file would add more than its size


def test_labeled_sets_in_every_format_with_renamed_fields(tmp_path, trained_tokenizer):
    from tfcli.data.labeled import load_labeled, read_labeled

    tokenizer = TextTokenizer.load(trained_tokenizer)
    rows = [("the fox ran", "pos"), ("a sad, wet day", "neg"), ("sun\nand fun", "pos")]
    csv_path = tmp_path / "reviews.csv.gz"
    with gzip.open(csv_path, "wt", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "stars"])
        writer.writerows(rows)
    examples = read_labeled(csv_path, "classify", {"text": "review", "label": "stars"})
    assert [(e.input, e.output) for e in examples] == rows and [e.line for e in examples] == [2, 3, 4]
    data, labels = load_labeled(csv_path, "classify", tokenizer, "decoder", 16, fields={"text": "review", "label": "stars"})
    assert labels == ["neg", "pos"] and len(data) == 3

    nested = tmp_path / "pairs.jsonl"
    nested.write_text(_jsonl([{"q": {"en": "one"}, "a": "un"}, {"q": {"en": "two"}, "a": "deux"}]))
    pairs = read_labeled(nested, "seq2seq", {"source": "q.en", "target": "a"})
    assert [(e.input, e.output) for e in pairs] == [("one", "un"), ("two", "deux")]

    with pytest.raises(TfcliError, match=r"reviews.csv.gz has no column 'text' \(its header: 'review', 'stars'\)"):
        read_labeled(csv_path, "classify")
    with pytest.raises(TfcliError, match="--source-field does not apply to --task classify"):
        read_labeled(csv_path, "classify", {"source": "review"})
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    parquet = tmp_path / "reviews.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c"], "label": [1, None, 0]}), parquet)
    with pytest.raises(TfcliError, match=r"reviews.parquet row 2: 'label' must be a string or an integer, not None"):
        read_labeled(parquet, "classify")
    pq.write_table(pa.table({"text": ["a", "b"], "label": [1, 0]}), parquet)
    data, labels = load_labeled(parquet, "classify", tokenizer, "decoder", 16)
    assert labels == ["0", "1"] and data.targets == [1, 0]


def test_skipped_json_lines_are_counted_in_one_line_once(cli, tmp_path, trained_tokenizer, caplog):
    """`train pretrain --data X.jsonl` read the file twice (tokenizer, shards) and dropped its broken rows without
    a word; now one line on stderr says how many and where the first is, once. Labeled data stays strict (a bad
    record is an error by file and line); a corpus is lenient, and one with no text at all is refused."""
    import logging

    path = tmp_path / "mixed.jsonl"
    rows = [json.dumps({"text": d}) for d in DOCS * 40]
    rows[3:3] = ['{"txt": "a typo"}', "[1, 2]", "not json", '{"text": 7}']
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    caplog.set_level(logging.WARNING, logger="tfcli.corpus")
    expected = (
        f"skipped 4 of {len(rows):,} rows of {path} that were not JSON objects with a string in 'text' (the first: line 4 has no 'text' field (it has 'txt'))"
    )
    run = tmp_path / "run"
    tiny = ["--set", "d_model=16", "--set", "n_heads=2", "--set", "n_layers=1", "--block-size", "16", "--batch-size", "2", "--max-steps", "1"]
    result = cli("train", "pretrain", "--data", path, "-o", run, *tiny)
    assert result.code == 0, result.stderr
    assert [r.getMessage() for r in caplog.records if r.name == "tfcli.corpus"] == [expected]  # once, not once a pass

    caplog.clear()
    result = cli("tokenize", "encode", path, "-t", trained_tokenizer, "-o", tmp_path / "shards", "--field", "body")
    assert result.code == 2 and "no record in the corpus has text in 'body'" in result.stderr

    import subprocess

    # outside pytest (no logging set up, as in the command): the bare line on stderr
    code = "from tfcli.corpus.reader import ReadStats, resolve_corpus\nfrom tfcli.corpus.documents import iter_document_pieces\n"
    code += f"list(iter_document_pieces(resolve_corpus([{str(path)!r}]), 'line', ReadStats()))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr == expected + "\n"
