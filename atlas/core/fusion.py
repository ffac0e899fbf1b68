"""Fusion, by hand: reciprocal rank fusion of the retrieval paths (or a weighted sum of their normalised scores),
then the second stage's vote.

Hand-built on purpose: the integ-test distribution has no `rrf` retriever (and the fused order
must be the same on every cluster), and the second stage's scores come from a model outside
Elasticsearch. Both are a few lines of arithmetic over ranks and scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from atlas import constants as C


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


def combine(rrf: np.ndarray, second: np.ndarray, *, rrf_weight: float = C.RERANK_RRF_WEIGHT) -> np.ndarray:
    """The final score of each candidate in the pool: rrf_weight * z(rrf) + z(second).

    Z-scores make a cross-encoder's logits, an endpoint's 0-1 relevances and a cosine weigh alike.
    """
    return rrf_weight * zscore(rrf) + zscore(second)


def held(cosines: np.ndarray, hubs: Sequence[float | None], *, penalty: float = C.HUB_PENALTY) -> np.ndarray:
    """The second stage's cosines lowered by `penalty` x each candidate's hubness; a candidate without one counts
    as the mean of the others (nothing changes when none has one)."""
    known = [h for h in hubs if h is not None]
    if not known or not penalty:
        return cosines
    mean = float(np.mean(known))
    return cosines - penalty * np.asarray([mean if h is None else h for h in hubs], dtype=cosines.dtype)


def rank_pool(fused: Sequence[float], second: np.ndarray, hubs: Sequence[float | None], keys: Sequence[str], *,
              rrf_weight: float = C.RERANK_RRF_WEIGHT, hub_penalty: float = C.HUB_PENALTY
              ) -> tuple[list[int], np.ndarray]:
    """The second stage's order of a pool: (indices best first, each candidate's held score).

    A candidate's final value is `combine` of its fused score and its second-stage score less `hub_penalty` x its
    hubness (`held`); ties keep the fused order. Pure, so `recall` and the research replays rank alike.
    """
    held_scores = held(np.asarray(second), hubs, penalty=hub_penalty)
    final = combine(np.asarray(fused), held_scores, rrf_weight=rrf_weight)
    return sorted(range(len(keys)), key=lambda i: -final[i]), held_scores
