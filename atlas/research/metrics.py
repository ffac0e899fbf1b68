"""Retrieval metrics and their aggregation, free of Elasticsearch.

Every per-question metric returns a float so that a mean over questions is the
reported number. A question without relevant items cannot be scored; the
metrics refuse it rather than silently counting it as a hit or a miss, so the
caller decides (and states) how such questions enter a benchmark.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np


def _top_k(ranked: Sequence[str], relevant: Collection[str], k: int) -> tuple[set[str], set[str]]:
    """Distinct items of the top k and of the relevant set, after checking the arguments."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if not relevant:
        raise ValueError("no relevant items: the question cannot be scored")
    return set(ranked[:k]), set(relevant)


def recall_fraction(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Fraction of the relevant items found in the top k (the LoCoMo paper's recall).

    Duplicates in ``ranked`` (several hits on one turn) count once.
    """
    top, rel = _top_k(ranked, relevant, k)
    return len(top & rel) / len(rel)


def recall_any(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """1.0 if at least one relevant item is in the top k, else 0.0."""
    top, rel = _top_k(ranked, relevant, k)
    return float(bool(top & rel))


def recall_all(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """1.0 if every relevant item is in the top k, else 0.0: what a multi-hop answer needs."""
    top, rel = _top_k(ranked, relevant, k)
    return float(rel <= top)


def ndcg(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Normalised discounted cumulative gain at k with binary gains (1 / log2(rank + 1) per relevant item)."""
    _, rel = _top_k(ranked, relevant, k)
    gain = sum(1.0 / np.log2(rank + 1) for rank, item in enumerate(distinct(ranked)[:k], start=1) if item in rel)
    ideal = sum(1.0 / np.log2(rank + 1) for rank in range(1, min(k, len(rel)) + 1))
    return float(gain / ideal)


def distinct(ranked: Iterable[str]) -> list[str]:
    """Items in order of first appearance: a ranking of units (sessions) taken from a ranking of their parts."""
    return list(dict.fromkeys(ranked))


def reciprocal_rank(ranked: Sequence[str], relevant: Collection[str]) -> float:
    """1 / rank of the first relevant item (rank 1 is the top), 0.0 if none is retrieved."""
    if not relevant:
        raise ValueError("no relevant items: the question cannot be scored")
    rel = set(relevant)
    for rank, item in enumerate(ranked, start=1):
        if item in rel:
            return 1.0 / rank
    return 0.0


def bootstrap_ci(
    values: Sequence[float], *, n_resamples: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean.

    Seeded, so a rerun of a notebook reports the same interval. By hand on purpose: a few lines of
    numpy, where `scipy.stats.bootstrap` would add scipy for one function (and defaults to BCa).
    """
    if not values:
        raise ValueError("no values to resample")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(n_resamples, len(data)))].mean(axis=1)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def percentiles(values: Sequence[float], *, ps: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """Percentiles keyed ``"p50"``, ``"p95"``, ... (linear interpolation), e.g. for latencies."""
    if not values:
        raise ValueError("no values")
    points = np.percentile(np.asarray(values, dtype=float), list(ps))
    return {f"p{p:g}": float(v) for p, v in zip(ps, points, strict=True)}


def _aggregate(rows: Sequence[Mapping], metrics: Sequence[str], ci: bool, seed: int) -> dict:
    """Count and mean (and optionally the bootstrap interval) of each metric over rows."""
    out: dict = {"n": len(rows)}
    for name in metrics:
        values = [float(row[name]) for row in rows]
        out[name] = float(np.mean(values))
        if ci:
            out[f"{name}_ci"] = bootstrap_ci(values, seed=seed)
    return out


def summarise(
    per_question: Sequence[Mapping],
    group_by: str | None,
    metrics: Sequence[str],
    *,
    ci: bool = False,
    seed: int = 0,
) -> dict[str, dict]:
    """Mean of each metric over all rows (``"overall"``) and per value of ``group_by``.

    Returns ``{"overall": {"n": ..., metric: mean, [metric + "_ci": (lo, hi)]}, group: {...}}``;
    group keys are ``str(value)`` in order of first appearance, so the result is JSON-ready.
    Every row must carry every metric: filter unscorable questions before.
    """
    if not per_question:
        raise ValueError("no rows to summarise")
    summary = {"overall": _aggregate(per_question, metrics, ci, seed)}
    if group_by is not None:
        groups: dict[str, list[Mapping]] = {}
        for row in per_question:
            groups.setdefault(str(row[group_by]), []).append(row)
        if "overall" in groups:
            raise ValueError(f"group {group_by!r} has a value 'overall', which would clash")
        summary |= {key: _aggregate(rows, metrics, ci, seed) for key, rows in groups.items()}
    return summary
