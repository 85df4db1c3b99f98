"""`tokenize show` prints token text as data (never markup or terminal control); `tokenize trace`
replays BPE merges exactly as the lecture does."""

from __future__ import annotations

import json

import pytest

from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.show import token_views, visible
from tfcli.tokenizer.trace import bpe_trace, merge_pair, pair_counts

RHYME = ("a_sailor_went_to_sea_sea_sea_to_see_what_he_could_see_see_see_but_all_that_he_could_see_see_see_"
         "was_the_bottom_of_the_deep_blue_sea_sea_sea_")


def test_visible_escapes_control_and_format_characters():
    assert visible("a\x1b]0;x\x07b") == "a\\x1b]0;x\\x07b"
    assert visible("tab\there\nnew\r") == "tab\\there\\nnew\\r"
    assert visible("\u202eevil\u200b") == "\\u202eevil\\u200b"
    assert visible("[/] [bold]x[/bold] café 🦊") == "[/] [bold]x[/bold] café 🦊"


def test_show_prints_escape_sequences_and_markup_as_text(cli, trained_tokenizer):
    text = "[/] [bold]x[/bold] \x1b]0;pwned\x07 done"
    result = cli("tokenize", "show", text, "-t", trained_tokenizer)
    assert result.code == 0, result.stderr
    assert "\x1b]0" not in result.stdout and "\x07" not in result.stdout
    rows = result.stdout.splitlines()[:-1]  # token row, id row, token row, ... then the count line
    token_rows = "".join(rows[0::2]).replace(" ", "")
    assert token_rows == visible(text).replace(" ", "")  # markup printed, escapes escaped, nothing lost
    tokenizer = TextTokenizer.load(trained_tokenizer)
    for token_id in tokenizer.encode(text):
        assert str(token_id) in result.stdout
    assert f"{len(tokenizer.encode(text))} tokens" in result.stdout


def test_show_json_lists_every_token(cli, trained_tokenizer):
    result = cli("tokenize", "show", "The fox 🦊 <|endoftext|>", "-t", trained_tokenizer, "--json")
    assert result.code == 0
    data = json.loads(result.stdout)
    tokenizer = TextTokenizer.load(trained_tokenizer)
    assert [t["id"] for t in data["tokens"]] == tokenizer.encode("The fox 🦊 <|endoftext|>")
    assert data["count"] == len(data["tokens"])
    assert 0 not in [t["id"] for t in data["tokens"]]  # the literal end-of-text stays text


def test_a_character_split_across_tokens_shows_its_bytes(trained_tokenizer):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    views = token_views(tokenizer, "東")  # unseen in training: three byte tokens
    assert len(views) == 3
    assert "".join(v.text for v in views) == "\\xe6\\x9d\\xb1"


def test_pair_counts_and_merge_pair():
    assert pair_counts(list("aaab_c")) == {("a", "a"): 1, ("a", "b"): 1, ("b", "_"): 1}
    assert pair_counts(list("aaaa")) == {("a", "a"): 2}
    assert merge_pair(list("aaa"), ("a", "a")) == ["aa", "a"]


def test_rhyme_trace_matches_the_lecture():
    trace = bpe_trace(RHYME)
    assert trace.initial_table[:6] == [("_", 33), ("e", 28), ("s", 15), ("a", 12), ("t", 11), ("o", 8)]
    first, second = trace.steps[0], trace.steps[1]
    assert (first.left, first.right) == ("s", "e")
    assert dict(first.table)["se"] == 13 and dict(first.table)["e"] == 15
    assert (second.left, second.right) == ("e", "_")
    assert dict(second.table)["_"] == 21 and dict(second.table)["e_"] == 12
    final = dict(trace.steps[-1].table)
    assert {t: final.pop(t) for t in ("see_", "sea_", "could_", "he_", "the_", "to_")} == {
        "see_": 7, "sea_": 6, "could_": 2, "he_": 2, "the_": 2, "to_": 2}
    assert set(final.values()) == {1}
    assert all(t.endswith("_") and "_" not in t[:-1] for t in trace.tokens)  # whole words only
    assert "".join(trace.tokens) == RHYME


def test_spaces_and_underscores_are_the_same_blackboard():
    assert bpe_trace(RHYME.replace("_", " ")).to_json() == bpe_trace(RHYME).to_json()


def test_wikipedia_example_ties_go_to_older_tokens():
    trace = bpe_trace("aaabdaaabac", min_count=2)
    assert [(s.left, s.right) for s in trace.steps] == [("a", "a"), ("a", "b"), ("aa", "ab")]
    assert trace.tokens == ["aaab", "d", "aaab", "a", "c"]
    assert bpe_trace("aaabdaaabac", max_merges=3).tokens == ["aaab", "d", "aaab", "a", "c"]


def test_trace_cli(cli):
    result = cli("tokenize", "trace", RHYME, "--merges", "2")
    assert result.code == 0
    assert "merge 1: s + e -> se (13x)" in result.stdout
    assert "merge 2: e + _ -> e_ (12x)" in result.stdout
    assert "merge 3" not in result.stdout
    data = json.loads(cli("tokenize", "trace", "aaabdaaabac", "--min-count", "2", "--json").stdout)
    assert [m["token"] for m in data["merges"]] == ["aa", "ab", "aaab"]
    assert data["tokens"] == ["aaab", "d", "aaab", "a", "c"]
    assert "end (1 token, 1 merge): aa" in cli("tokenize", "trace", "aa").stdout


@pytest.mark.parametrize("args, message", [
    (["x", "--merges", "-1"], "--merges"),
    (["x", "--min-count", "0"], "--min-count"),
    (["x" * 20_001], "small texts"),
])
def test_trace_bad_input(cli, args, message):
    result = cli("tokenize", "trace", *args)
    assert result.code == 2 and message in result.stderr
