from __future__ import annotations

import math

import pytest

from atlas.research.metrics import (
    bootstrap_ci,
    distinct,
    ndcg,
    percentiles,
    recall_all,
    recall_any,
    recall_fraction,
    reciprocal_rank,
    summarise,
)

RANKED = ["a", "x", "b", "y", "c"]
RELEVANT = {"a", "b", "c", "d"}


@pytest.mark.parametrize(("k", "expected"), [(1, 0.25), (2, 0.25), (3, 0.5), (5, 0.75), (100, 0.75)])
def test_recall_fraction(k: int, expected: float) -> None:
    assert recall_fraction(RANKED, RELEVANT, k) == expected


def test_recall_fraction_counts_a_duplicate_hit_once() -> None:
    assert recall_fraction(["a", "a", "a"], ["a", "b"], 3) == 0.5


def test_recall_any_and_all() -> None:
    assert recall_any(RANKED, {"b"}, 2) == 0.0
    assert recall_any(RANKED, {"b"}, 3) == 1.0
    assert recall_all(RANKED, {"a", "b"}, 2) == 0.0
    assert recall_all(RANKED, {"a", "b"}, 3) == 1.0
    assert recall_all(RANKED, RELEVANT, 5) == 0.0


def test_ndcg_by_hand() -> None:
    assert ndcg(RANKED, {"a"}, 5) == 1.0
    assert ndcg(RANKED, {"x"}, 5) == pytest.approx(1 / math.log2(3))
    # a, b at ranks 1 and 3 of the 5; the ideal puts the four relevant items at ranks 1-4
    ideal = sum(1 / math.log2(r + 1) for r in range(1, 5))
    assert ndcg(RANKED, RELEVANT, 3) == pytest.approx((1 + 0.5) / (1 + 1 / math.log2(3) + 0.5))
    assert ndcg(RANKED, RELEVANT, 5) == pytest.approx((1 + 0.5 + 1 / math.log2(6)) / ideal)
    assert ndcg(["y", "x"], {"a"}, 2) == 0.0
    assert ndcg(["a", "a", "b"], {"a", "b"}, 2) == 1.0, "a repeated item counts once, at its first place"


def test_distinct_keeps_first_appearance() -> None:
    assert distinct(["s2", "s1", "s2", "s3", "s1"]) == ["s2", "s1", "s3"]


def test_reciprocal_rank() -> None:
    assert reciprocal_rank(RANKED, RELEVANT) == 1.0
    assert reciprocal_rank(RANKED, {"b", "c"}) == pytest.approx(1 / 3)
    assert reciprocal_rank(RANKED, {"z"}) == 0.0
    assert reciprocal_rank([], {"z"}) == 0.0


@pytest.mark.parametrize("metric", [recall_fraction, recall_any, recall_all, ndcg])
def test_unscorable_question_is_refused(metric) -> None:
    with pytest.raises(ValueError, match="no relevant"):
        metric(RANKED, set(), 5)
    with pytest.raises(ValueError, match="k must"):
        metric(RANKED, RELEVANT, 0)


def test_reciprocal_rank_refuses_empty_relevant() -> None:
    with pytest.raises(ValueError):
        reciprocal_rank(RANKED, [])


def test_bootstrap_is_deterministic_and_contains_the_mean() -> None:
    values = [1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 1.0, 0.25, 1.0, 0.0] * 5
    mean = sum(values) / len(values)
    low, high = bootstrap_ci(values, seed=7)
    assert (low, high) == bootstrap_ci(values, seed=7)
    assert low < mean < high
    assert 0.0 <= low and high <= 1.0
    narrow = bootstrap_ci(values, alpha=0.5, seed=7)
    assert low <= narrow[0] <= narrow[1] <= high


def test_bootstrap_of_constant_values_is_a_point() -> None:
    assert bootstrap_ci([0.5] * 10) == (0.5, 0.5)
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_percentiles() -> None:
    values = list(range(1, 101))  # 1..100
    result = percentiles(values)
    assert list(result) == ["p50", "p95", "p99"]
    assert result["p50"] == pytest.approx(50.5)
    assert result["p95"] == pytest.approx(95.05)
    assert percentiles([3.0], ps=(99.9,)) == {"p99.9": 3.0}


def test_summarise_overall_and_groups() -> None:
    rows = [
        {"cat": "a", "r@5": 1.0, "mrr": 1.0},
        {"cat": "a", "r@5": 0.0, "mrr": 0.5},
        {"cat": "b", "r@5": 0.5, "mrr": 0.0},
    ]
    summary = summarise(rows, "cat", ["r@5", "mrr"])
    assert list(summary) == ["overall", "a", "b"]
    assert summary["overall"] == {"n": 3, "r@5": 0.5, "mrr": 0.5}
    assert summary["a"] == {"n": 2, "r@5": 0.5, "mrr": 0.75}
    assert summary["b"] == {"n": 1, "r@5": 0.5, "mrr": 0.0}
    assert summarise(rows, None, ["r@5"]) == {"overall": {"n": 3, "r@5": 0.5}}


def test_summarise_with_ci() -> None:
    rows = [{"cat": i % 2, "r@5": float(i % 3 == 0)} for i in range(30)]
    summary = summarise(rows, "cat", ["r@5"], ci=True)
    assert set(summary) == {"overall", "0", "1"}
    low, high = summary["overall"]["r@5_ci"]
    assert low <= summary["overall"]["r@5"] <= high
    assert summary == summarise(rows, "cat", ["r@5"], ci=True)


def test_summarise_refuses_empty_and_missing_metric() -> None:
    with pytest.raises(ValueError):
        summarise([], None, ["r@5"])
    with pytest.raises(KeyError):
        summarise([{"r@5": 1.0}], None, ["mrr"])
