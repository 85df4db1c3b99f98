"""Head statistics on weights built by hand: each known pattern is recognised, entropy, distance and the
divergences are the textbook numbers."""

from __future__ import annotations

import numpy as np
import pytest

from tfcli.inspect.stats import (
    PATTERNS,
    classify,
    head_changes,
    jensen_shannon,
    mean_distance,
    mean_entropy,
    pattern_scores,
    repeated_random_ids,
    row_entropy,
    summarize_heads,
)
from tfcli.inspect.terminal import aggregate

HALF = 8
IDS = repeated_random_ids(range(100, 300), HALF, seed=3)  # r0..r7 r0..r7
T = len(IDS)


def _head(targets: dict[int, int]) -> np.ndarray:
    """A causal head: query q puts all its weight on key targets.get(q, q) (itself by default)."""
    w = np.zeros((T, T))
    for q in range(T):
        k = targets.get(q, q)
        assert k <= q
        w[q, k] = 1.0
    return w


def _uniform() -> np.ndarray:
    return np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]


HEADS = {
    "previous-token": _head({q: q - 1 for q in range(1, T)}),
    "first-token": _head({q: 0 for q in range(T)}),
    "duplicate": _head({q: q - HALF for q in range(HALF, T)}),
    "induction": _head({q: q - HALF + 1 for q in range(HALF, T)}),
    "none": _uniform(),
}


def test_the_example_sequence_is_a_repeat_of_distinct_ids():
    assert IDS[:HALF] == IDS[HALF:] and len(set(IDS[:HALF])) == HALF


@pytest.mark.parametrize("expected", list(HEADS))
def test_each_hand_built_head_is_classified_as_its_pattern(expected):
    weights = HEADS[expected][None, None]  # (1, 1, T, T)
    scores = {name: float(s[0, 0]) if s is not None else None for name, s in pattern_scores(weights, IDS).items()}
    pattern, score = classify(scores)
    assert pattern == expected
    if expected != "none":
        assert score == pytest.approx(1.0)
        assert all(scores[other] < 0.5 for other in PATTERNS if other != expected), scores


def test_summary_of_a_layer_of_known_heads():
    weights = np.stack(list(HEADS.values()))[None]  # (1, 5, T, T)
    summaries = summarize_heads(weights, IDS, causal=True, probe_weights=weights, probe_ids=IDS)
    assert [s.pattern for s in summaries] == list(HEADS)
    previous = summaries[0]
    assert previous.distance == pytest.approx((T - 1) / T)  # every query but the first looks one back
    assert previous.entropy == pytest.approx(0.0)
    assert summaries[4].entropy == pytest.approx(np.mean([np.log2(n) for n in range(1, T + 1)]))
    data = summaries[3].to_json()
    assert data["pattern"] == "induction" and data["scores"]["induction"] == 1.0 and set(data["scores"]) == set(PATTERNS)


def test_duplicate_and_induction_come_from_the_probe():
    # On a text without repeats the text cannot show them; the probe (a repeated random sequence) does.
    text_ids = list(range(10, 10 + T))
    weights = HEADS["induction"][None, None]
    assert pattern_scores(weights, text_ids)["induction"] is None
    summary = summarize_heads(weights, text_ids, probe_weights=weights, probe_ids=IDS)[0]
    assert summary.pattern == "induction"


def test_the_docstring_example_of_induction():
    ids = [5, 7, 9, 5, 7, 9]
    w = np.zeros((1, 1, 6, 6))
    for q, k in [(0, 0), (1, 0), (2, 0), (3, 1), (4, 2), (5, 3)]:
        w[0, 0, q, k] = 1
    scores = pattern_scores(w, ids)
    assert scores["induction"][0, 0] == pytest.approx(1.0)
    assert scores["previous-token"][0, 0] == pytest.approx(0.2)


def test_bidirectional_duplicate_sees_later_copies():
    ids = [1, 2, 1]
    w = np.array([[0, 0, 1.0], [0, 1.0, 0], [1.0, 0, 0]])[None, None]
    assert pattern_scores(w, ids, causal=False)["duplicate"][0, 0] == pytest.approx(1.0)  # queries 0 and 2
    assert pattern_scores(w, ids, causal=True)["duplicate"][0, 0] == pytest.approx(1.0)  # query 2 only


def test_entropy_distance_and_divergence_examples():
    assert row_entropy(np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])).tolist() == [1.0, 0.0]
    assert mean_entropy(np.full((1, 1, 2, 4), 0.25))[0, 0] == pytest.approx(2.0)
    prev = np.array([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0]])[None, None]
    assert mean_distance(prev)[0, 0] == pytest.approx(2 / 3)
    assert jensen_shannon(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)
    assert jensen_shannon(np.array([0.5, 0.5]), np.array([0.5, 0.5])) == pytest.approx(0.0)


def test_head_changes_rank_the_changed_head_first():
    a = np.stack([HEADS["previous-token"], HEADS["first-token"], HEADS["none"]])[None]  # (1, 3, T, T)
    b = a.copy()
    b[0, 1] = HEADS["previous-token"]  # head 1 changed completely
    b[0, 2] = 0.9 * HEADS["none"] + 0.1 * HEADS["first-token"]  # head 2 a little
    changes = head_changes(a, b)
    assert [(c.layer, c.head) for c in changes] == [(0, 1), (0, 2), (0, 0)]
    assert changes[-1].js == 0.0 and changes[0].js > changes[1].js > 0
    assert 0 < changes[0].l1 <= 1


def test_classify_needs_a_clear_score():
    assert classify({"previous-token": 0.3, "first-token": 0.2, "duplicate": None, "induction": None}) == ("none", 0.3)
    assert classify(dict.fromkeys(PATTERNS)) == ("none", 0.0)


def test_aggregate_keeps_rows_summing_to_one():
    w = np.array([[1, 0, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 1, 0], [0, 0, 0.5, 0.5]])
    assert aggregate(w, 2).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    rows = np.random.default_rng(0).dirichlet(np.ones(37), size=23)
    assert np.allclose(aggregate(rows, 5).sum(axis=1), 1.0)
