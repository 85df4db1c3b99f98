"""Reading corpora: path resolution, bad inputs, invalid UTF-8, bounded pieces, document boundaries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import join_documents
from tfcli.corpus.documents import iter_document_pieces
from tfcli.corpus.reader import ReadStats, iter_lines, read_text_blocks, resolve_corpus, split_long
from tfcli.errors import TfcliError


def test_resolves_files_folders_and_globs_in_order_once(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "b" / "c.txt").write_text("c")
    (tmp_path / "b" / ".hidden.txt").write_text("h")
    corpus = resolve_corpus([tmp_path / "a.txt", tmp_path, str(tmp_path / "**" / "*.txt")])
    names = [f.path.name for f in corpus.files]
    assert names == ["a.txt", "c.txt"]
    assert corpus.total_bytes == 2


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing.txt", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "holds no files"),
        (lambda p: str(p / "*.nomatch"), "no file matches"),
    ],
)
def test_bad_paths_are_clear_errors(tmp_path, make, message):
    with pytest.raises(TfcliError, match=message):
        resolve_corpus([make(tmp_path)])


def test_named_binary_file_is_an_error_but_skipped_inside_a_folder(tmp_path):
    (tmp_path / "img.bin").write_bytes(b"\x89PNG\x00\x00\x01")
    (tmp_path / "text.txt").write_text("hello")
    with pytest.raises(TfcliError, match="binary"):
        resolve_corpus([tmp_path / "img.bin"])
    corpus = resolve_corpus([tmp_path])
    assert [f.path.name for f in corpus.files] == ["text.txt"]
    assert [p.name for p in corpus.skipped_binary] == ["img.bin"]


def test_only_binary_files_is_an_error(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"\x00" * 10)
    with pytest.raises(TfcliError, match="no text files"):
        resolve_corpus([tmp_path])


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"caf\xc3\xa9 \xff\xfe ok \xe2\x82")  # a truncated 3-byte sequence at the end
    stats = ReadStats()
    text = "".join(read_text_blocks(path, stats, block_bytes=3))  # blocks split characters too
    assert text == "café \ufffd\ufffd ok \ufffd\ufffd"
    assert stats.invalid_bytes == 4
    assert stats.files_with_invalid_utf8 == {path}
    assert stats.bytes_read == path.stat().st_size


def test_multibyte_characters_survive_block_boundaries(tmp_path):
    path = tmp_path / "u.txt"
    text = "🦊é中" * 1000
    path.write_text(text, encoding="utf-8")
    stats = ReadStats()
    assert "".join(read_text_blocks(path, stats, block_bytes=7)) == text
    assert stats.invalid_bytes == 0


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab \n\t中"), max_size=300), st.integers(min_value=1, max_value=40))
def test_split_long_keeps_the_text_and_bounds_pieces(text, limit):
    pieces = split_long(text, limit)
    assert "".join(pieces) == text
    assert all(len(p) <= limit for p in pieces)


def test_split_long_cuts_before_spaces():
    assert split_long("aaa bbb ccc", 5) == ["aaa", " bbb", " ccc"]


def test_a_huge_line_comes_in_bounded_pieces(tmp_path):
    path = tmp_path / "long.txt"
    text = "word " * 200_000 + "\nnext line\n"
    path.write_text(text)
    pieces = list(iter_lines(path, ReadStats(), limit=4096))
    assert "".join(pieces) == text
    assert max(map(len, pieces)) <= 4096
    assert pieces[-1] == "next line\n"


@pytest.mark.parametrize(
    "boundary, expected",
    [
        ("paragraph", ["one\ntwo", "three", "four"]),
        ("line", ["one", "two", "three", "four"]),
        ("file", ["one\ntwo\n\n \nthree\n\n\nfour"]),
    ],
)
def test_document_boundaries(tmp_path, boundary, expected):
    path = tmp_path / "docs.txt"
    path.write_text("one\ntwo\n\n \nthree\n\n\nfour\n")
    assert join_documents(iter_document_pieces(resolve_corpus([path]), boundary, ReadStats())) == expected


def test_long_documents_come_in_bounded_pieces(tmp_path):
    path = tmp_path / "long.txt"
    path.write_text(("line of text " * 50 + "\n") * 400)
    pieces = list(iter_document_pieces(resolve_corpus([path]), "paragraph", ReadStats(), limit=2000))
    assert sum(p.ends_document for p in pieces) == 1 and pieces[-1].ends_document
    assert max(len(p.text) for p in pieces) <= 2000
    assert "".join(p.text for p in pieces) == path.read_text().rstrip("\n")


def _reference_paragraphs(text: str) -> list[str]:
    """Documents the slow, obvious way: groups of consecutive non-blank lines."""
    documents, current = [], []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line.strip():
            current.append(line)
        elif current:
            documents.append("\n".join(current))
            current = []
    if current:
        documents.append("\n".join(current))
    return documents


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(["a", "b", " ", "\n", "\r", "é"]), max_size=120), st.integers(min_value=1, max_value=9))
def test_paragraphs_match_the_obvious_reading_across_block_boundaries(tmp_path_factory, text, block):
    import tfcli.corpus.reader as corpus_module

    path = tmp_path_factory.mktemp("p") / "t.txt"
    path.write_bytes(text.encode("utf-8"))
    original = corpus_module.READ_BLOCK_BYTES
    corpus_module.READ_BLOCK_BYTES = block
    try:
        pieces = list(iter_document_pieces(resolve_corpus([path]), "paragraph", ReadStats(), limit=1000))
    finally:
        corpus_module.READ_BLOCK_BYTES = original
    documents, current = [], ""
    for piece in pieces:
        current += piece.text
        if piece.ends_document:
            documents.append(current.replace("\r\n", "\n").replace("\r", "\n"))  # breaks are kept as written
            current = ""
    assert documents == _reference_paragraphs(text)


def test_crlf_paragraphs(tmp_path):
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"one\r\ntwo\r\n\r\nthree\r\n")
    pieces = list(iter_document_pieces(resolve_corpus([path]), "paragraph", ReadStats()))
    assert [p.text for p in pieces] == ["one\r\ntwo", "three"]


def test_line_documents_with_a_long_last_line(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("first\n\n  \nsecond line\n" + "z " * 3000)  # the last line has no newline
    pieces = list(iter_document_pieces(resolve_corpus([path]), "line", ReadStats(), limit=1000))
    documents, current = [], ""
    for piece in pieces:
        assert len(piece.text) <= 1000
        current += piece.text
        if piece.ends_document:
            documents.append(current)
            current = ""
    assert documents == ["first", "second line", "z " * 3000]


def test_symlink_loops_are_named_in_one_line_and_skipped_inside_a_folder(cli, tmp_path):
    """A link to itself, two links to each other: `resolve` raised RuntimeError ("Symlink loop") inside a folder
    or a glob. Met while walking they are skipped, as a dangling link is; named, they are one line."""
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    (folder / "loop").symlink_to("loop")
    (folder / "ping").symlink_to("pong")
    (folder / "pong").symlink_to("ping")
    (folder / "gone").symlink_to("missing.txt")
    assert [f.path.name for f in resolve_corpus([folder]).files] == ["a.txt"]
    assert [f.path.name for f in resolve_corpus([str(folder / "*")]).files] == ["a.txt"]
    with pytest.raises(TfcliError, match="is a symbolic link that leads back to itself"):
        resolve_corpus([folder / "ping"])
    with pytest.raises(TfcliError, match="is a symbolic link to missing.txt, which does not exist"):
        resolve_corpus([folder / "gone"])
    result = cli("train", "pretrain", "--data", folder / "loop", "-o", tmp_path / "run")
    assert result.code == 2 and "loop is a symbolic link that leads back to itself" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()
    result = cli("train", "pretrain", "--data", folder, "-o", tmp_path / "run", "--max-steps", "1")
    assert result.code == 2 and "too little to train on" in result.stderr and "Traceback" not in result.stderr, result.stderr
