"""`tokenize show` prints token text as data (never markup or terminal control); `tokenize trace`
replays BPE merges exactly as the lecture does."""

from __future__ import annotations

import json

import pytest

from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.show import token_views, visible
from tfcli.tokenizer.trace import bpe_trace, merge_pair, pair_counts

RHYME = "a_sailor_went_to_sea_sea_sea_to_see_what_he_could_see_see_see_but_all_that_he_could_see_see_see_was_the_bottom_of_the_deep_blue_sea_sea_sea_"


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
    assert token_rows == visible(text).replace(" ", "␣")  # markup printed, escapes escaped, spaces marked, nothing lost
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


def test_a_character_split_across_tokens_shows_on_each_of_them(trained_tokenizer):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    views = token_views(tokenizer, "東")  # unseen in training: three byte tokens
    assert len(views) == 3
    # the character belongs to the token that completes it; the two before hold parts of it and show it too
    assert [v.piece for v in views] == ["", "", "東"] and [v.part for v in views] == ["東", "東", ""]
    assert [v.text for v in views] == ["東"] * 3


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
    assert {t: final.pop(t) for t in ("see_", "sea_", "could_", "he_", "the_", "to_")} == {"see_": 7, "sea_": 6, "could_": 2, "he_": 2, "the_": 2, "to_": 2}
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


@pytest.mark.parametrize(
    "args, message",
    [
        (["x", "--merges", "-1"], "--merges"),
        (["x", "--min-count", "0"], "--min-count"),
        (["x" * 20_001], "small texts"),
    ],
)
def test_trace_bad_input(cli, args, message):
    result = cli("tokenize", "trace", *args)
    assert result.code == 2 and message in result.stderr


# -- WordPiece: show marks ## continuations; trace scores pairs --------------------------------------------

HUGS = "hug hug hug pug pun bun hugs"


@pytest.fixture(scope="module")
def wordpiece_tokenizer(tmp_path_factory):
    from tests.conftest import TINY_TEXT
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    folder = tmp_path_factory.mktemp("wordpiece")
    (folder / "c.txt").write_text(TINY_TEXT * 20, encoding="utf-8")
    train_tokenizer(resolve_corpus([folder / "c.txt"]), folder / "tok", TokenizerTrainingConfig(vocab_size=120, model="wordpiece"))
    return folder / "tok"


def test_show_marks_wordpiece_continuations(cli, wordpiece_tokenizer):
    tokenizer = TextTokenizer.load(wordpiece_tokenizer)
    text = "The fox played happily."
    tokens = [tokenizer.hf.id_to_token(i) for i in tokenizer.encode(text)]
    continuations = [t for t in tokens if t.startswith("##")]
    assert continuations  # "happily" is not one token of this small vocabulary
    data = json.loads(cli("tokenize", "show", text, "-t", wordpiece_tokenizer, "--json").stdout)
    assert [t["token"] for t in data["tokens"]] == tokens
    for entry in data["tokens"]:
        assert entry["continuation"] == entry["token"].startswith("##")
        assert entry["text"] == entry["token"].removeprefix("##")  # the vocabulary entry, without the space before a word
    result = cli("tokenize", "show", text, "-t", wordpiece_tokenizer)
    assert result.code == 0
    shown = result.stdout.splitlines()[0::2][:-1]
    # each continuation printed with its ## in front; a word after a space with ␣ (the decoder writes none before ".")
    assert "".join(shown).split() == [t if i == 0 or t.startswith("##") or t == "." else f"␣{t}" for i, t in enumerate(tokens)]


def test_show_json_of_other_families_has_no_continuations(cli, trained_tokenizer):
    data = json.loads(cli("tokenize", "show", "The fox", "-t", trained_tokenizer, "--json").stdout)
    assert [t["continuation"] for t in data["tokens"]] == [False, False]


def test_wordpiece_helpers():
    from tfcli.tokenizer.trace import join_tokens, longest_match_first, wordpiece_split, wordpiece_words

    assert wordpiece_words("the cat's_hat.") == ["the", "cat", "'", "s", "hat", "."]
    assert wordpiece_split("hug") == ["h", "##u", "##g"]
    assert (join_tokens("h", "##u", "##"), join_tokens("##g", "##s", "##"), join_tokens("a", "##", "")) == ("hu", "##gs", "a##")
    vocab = {"h", "hu", "hug", "##s", "##g", "##gs"}
    assert longest_match_first("hugs", vocab) == ["hug", "##s"]
    assert longest_match_first("hugx", vocab) is None
    assert merge_pair(["h", "##u", "##g"], ("h", "##u"), "##") == ["hu", "##g"]


def test_wordpiece_trace_scores_pairs_where_bpe_counts_them():
    from fractions import Fraction

    from tfcli.tokenizer.trace import wordpiece_trace

    bpe = bpe_trace(HUGS, max_merges=1)
    assert (bpe.steps[0].token, bpe.steps[0].count) == ("ug", 5)
    trace = wordpiece_trace(HUGS, max_merges=4)
    assert trace.initial_table == [("##u", 7), ("##g", 5), ("h", 4), ("##n", 2), ("p", 2), ("b", 1), ("##s", 1)]
    first = trace.steps[0]
    # ##g + ##s: once, but ##s never occurs otherwise: 1 / (5 * 1) beats u + g's 5 / (7 * 5)
    assert (first.left, first.right, first.token, first.count) == ("##g", "##s", "##gs", 1)
    assert (first.left_count, first.right_count, first.score) == (5, 1, Fraction(1, 5))
    # then every pair scores 1/7; the tie goes to the older tokens: b (first in code-point order) + ##u
    assert [(s.token, s.score) for s in trace.steps[1:]] == [("bu", Fraction(1, 7)), ("bun", Fraction(1, 2)), ("hu", Fraction(1, 6))]
    assert trace.tokens == ["hu", "##g", "hu", "##g", "hu", "##g", "p", "##u", "##g", "p", "##u", "##n", "bun", "hu", "##gs"]
    assert trace.encoded == trace.tokens


def test_wordpiece_encoding_can_differ_from_the_merges():
    from tfcli.tokenizer.trace import wordpiece_trace

    trace = wordpiece_trace("cb cbc", max_merges=2)
    assert [s.token for s in trace.steps] == ["##bc", "cb"]
    assert trace.tokens == ["cb", "c", "##bc"]  # the merges, in the order they were learned
    assert trace.encoded == ["cb", "cb", "##c"]  # WordPiece's encoding: the longest entry from the start of the word


def test_wordpiece_trace_cli(cli):
    result = cli("tokenize", "trace", HUGS, "--model", "wordpiece", "--merges", "2")
    assert result.code == 0, result.stderr
    assert "merge 1: ##g + ##s -> ##gs (1x; score 1/(5*1) = 0.2)" in result.stdout
    assert "merge 2: b + ##u -> bu (1x; score 1/(1*7) = 0.1429)" in result.stdout
    assert "start (22 tokens): ##u 7, ##g 5, h 4" in result.stdout
    data = json.loads(cli("tokenize", "trace", HUGS, "--model", "wordpiece", "--merges", "1", "--json").stdout)
    assert data["model"] == "wordpiece"
    assert data["merges"][0] | {"table": None} == {
        "merge": 1,
        "pair": ["##g", "##s"],
        "token": "##gs",
        "count": 1,
        "left_count": 5,
        "right_count": 1,
        "score": 0.2,
        "score_fraction": "1/5",
        "table": None,
    }
    assert data["text"] == HUGS and data["encoded"] == data["tokens"]
    assert "score" not in json.loads(cli("tokenize", "trace", HUGS, "--json").stdout)["merges"][0]
    # --min-count: a pair occurring fewer times is never merged, for WordPiece as for BPE
    data = json.loads(cli("tokenize", "trace", HUGS, "--model", "wordpiece", "--min-count", "2", "--json").stdout)
    assert all(m["count"] >= 2 for m in data["merges"]) and data["merges"]
    result = cli("tokenize", "trace", "x", "--model", "unigram")
    assert result.code == 2 and "trace replays merges of --model bpe or wordpiece" in result.stderr
