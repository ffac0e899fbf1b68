"""Fusion, by hand: reciprocal rank fusion of the retrieval paths (or a weighted sum of their normalised scores),
then the second stage's vote.

Hand-built on purpose: the integ-test distribution has no `rrf` retriever (and the fused order
must be the same on every cluster), and the second stage's scores come from a model outside
Elasticsearch. Both are a few lines of arithmetic over ranks and scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import zip_longest

import numpy as np

from atlas.core import constants as C


def rrf_fuse(rankings: dict[str, list[str]], *,
             rank_constant: int = C.RRF_RANK_CONSTANT) -> list[tuple[str, float, dict[str, int]]]:
    """Reciprocal rank fusion: [(key, score, {path: rank})], best first; ties keep first-seen order."""
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for path, keys in rankings.items():
        for rank, key in enumerate(keys, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (rank_constant + rank)
            ranks.setdefault(key, {})[path] = rank
    order = sorted(scores, key=lambda key: -scores[key])
    return [(key, scores[key], ranks[key]) for key in order]


def zscore(values: np.ndarray) -> np.ndarray:
    """Standardise within the pool, so scores of different models can be added."""
    std = float(values.std())
    return (values - values.mean()) / std if std > 1e-9 else np.zeros_like(values)


def minmax(values: np.ndarray) -> np.ndarray:
    """Rescale within the pool to [0, 1], the terms of a convex combination."""
    span = float(values.max() - values.min())
    return (values - values.min()) / span if span > 1e-12 else np.zeros_like(values)


def score_fuse(scores: dict[str, dict[str, float]], weights: dict[str, float], *,
               normalise: C.ScoreNormalisation) -> list[tuple[str, float]]:
    """Weighted sum of each path's normalised scores: [(key, score)], best first; ties keep first-seen order.

    A path's scores are normalised over the candidates it returned (`zscore` or `minmax`); a candidate a path
    did not return gets that path's lowest normalised score, as if it ranked just below its window.
    """
    keys = list(dict.fromkeys(key for path in scores.values() for key in path))
    total = np.zeros(len(keys))
    for path, found in scores.items():
        scale = zscore if normalise == "zscore" else minmax
        normalised = dict(zip(found, scale(np.asarray(list(found.values()), dtype=float)), strict=True))
        floor = min(normalised.values(), default=0.0)
        total += weights[path] * np.asarray([normalised.get(key, floor) for key in keys])
    order = sorted(range(len(keys)), key=lambda i: -total[i])
    return [(keys[i], float(total[i])) for i in order]


def combine(rrf: np.ndarray, second: np.ndarray, *, rrf_weight: float = C.RERANK_RRF_WEIGHT) -> np.ndarray:
    """The final score of each candidate in the pool: rrf_weight * z(rrf) + z(second).

    Z-scores make a cross-encoder's logits, an endpoint's 0-1 relevances and a cosine weigh alike.
    """
    return rrf_weight * zscore(rrf) + zscore(second)


def interleave(ranked: Sequence[str], groups: Sequence[Sequence[str]], *, keep: int) -> list[str]:
    """The first `keep` of `ranked`, then the groups' keys in turns (each group's first, then each one's second,
    ...), then the rest of `ranked`: every key once, at its first place."""
    out = dict.fromkeys(ranked[:keep])
    for tier in zip_longest(*groups):
        out.update(dict.fromkeys(key for key in tier if key is not None))
    out.update(dict.fromkeys(ranked))
    return list(out)
