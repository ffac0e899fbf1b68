"""Fusion as a study: RRF against weighted z-score fusion and a convex combination, on candidates captured once.

Each question is recalled once in the default mode with the second stage run over every fused candidate
(`capture`), so each candidate keeps its rank and score in each path and the second model's score. Any
fusion of the paths is then replayed offline (`replay`): fuse, take the top `pool`, let the second stage vote
(`atlas.core.fusion.combine`), cut. The RRF arm replays the default mode exactly, which `capture`'s caller can
check against the recorded run. A weight is chosen by leave-one-conversation-out cross-validation
(`cross_validate`): each conversation is scored with the weight that did best on the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from tqdm.auto import tqdm

from atlas import constants as C
from atlas.core.fusion import rank_pool, rrf_fuse, zscore
from atlas.core.recall import Tuning, paths_of, recall
from atlas.core.store import Store
from atlas.reporting import Table, table
from atlas.research.evaluate import LOCOMO_KS, PERSONA_KS, EvalQuestion, score, session_scores, warm_query_vectors
from atlas.research.locomo import CATEGORY_NAMES, MAIN_CATEGORIES
from atlas.research.metrics import bootstrap_ci

#: The arms of the study: RRF has no weight; the score fusions weigh the BM25 path by w and the kNN path by 1 - w.
Arm = Literal["rrf", "zscore", "minmax"]
#: How `score_fuse` puts each path's scores on one scale.
ScoreNormalisation = Literal["zscore", "minmax"]
ARMS: tuple[Arm, ...] = get_args(Arm)
#: Weights of the BM25 path tried by the score fusions.
WEIGHTS: tuple[float, ...] = tuple(round(w, 1) for w in np.arange(0.1, 1.0, 0.1))


@dataclass(frozen=True)
class Candidate:
    """One fused candidate of a question: its key, its rank and score in each path, the second model's score (before
    hubness is held against it)."""

    key: str
    ranks: dict[str, int]
    scores: dict[str, float]
    second: float
    #: The memory's hubness, which the second stage holds against it (`atlas.core.hubness.held`).
    hubness: float | None = None


@dataclass(frozen=True)
class Captured:
    question: EvalQuestion
    candidates: tuple[Candidate, ...]



def minmax(values: np.ndarray) -> np.ndarray:
    """Rescale within the pool to [0, 1], the terms of a convex combination."""
    span = float(values.max() - values.min())
    return (values - values.min()) / span if span > 1e-12 else np.zeros_like(values)


def score_fuse(scores: dict[str, dict[str, float]], weights: dict[str, float], *,
               normalise: ScoreNormalisation) -> list[tuple[str, float]]:
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


def capture(store: Store, questions: Sequence[EvalQuestion], *, window: int = C.RRF_WINDOW,
            progress: bool = True) -> list[Captured]:
    """Every question's candidates from both paths, each re-scored by the second stage (one recall each).

    `recall` widens each path to k, so asking for 2 * window keeps each path's top 2 * window; `fused` reads
    only its top `window` again, which are the same turns (kNN keeps `num_candidates`). A candidate of a
    path's top `window` that the wider fusion put below place 2 * window is lost: only the tail can differ.
    The capture holds no hubness against the second stage's cosines (`hub_penalty=0`): `replay` does.
    """
    warm_query_vectors(store, [q.query for q in questions])
    out = []
    for q in tqdm(questions, desc="capture", unit="q", disable=not progress):
        result = recall(store.at(q.now), q.user_id, q.query, k=2 * window, mode=C.DEFAULT_RECALL_MODE,
                        tuning=Tuning(window=window, pool=2 * window, hub_penalty=0.0))
        out.append(Captured(q, tuple(Candidate(hit.source.get("source_key") or hit.id, hit.ranks, hit.path_scores,
                                               float(hit.second_stage_score or 0.0), hit.hubness)
                                     for hit in result.hits)))
    return out


def fused(captured: Captured, arm: Arm, weight: float, *, window: int = C.RRF_WINDOW) -> list[tuple[str, float]]:
    """The first-stage order of one arm over each path's top `window`: [(key, fused score)], best first."""
    by_path = {p: sorted((c for c in captured.candidates if c.ranks.get(p, window + 1) <= window),
                         key=lambda c: c.ranks[p]) for p in paths_of("hybrid")}
    if arm == "rrf":
        return [(key, value) for key, value, _ in rrf_fuse({p: [c.key for c in found] for p, found in by_path.items()})]
    return score_fuse({p: {c.key: c.scores[p] for c in found} for p, found in by_path.items()},
                      {"bm25": weight, "dense": 1.0 - weight}, normalise="zscore" if arm == "zscore" else "minmax")


def replay(captured: Captured, arm: Arm, weight: float, *, second_stage: bool = True,
           pool: int = C.RERANK_POOL, hub_penalty: float = C.HUB_PENALTY) -> list[str]:
    """The ranked keys one arm gives: fused, then (in the default mode) the top `pool` re-scored as `recall` does,
    hubness held against each candidate by `hub_penalty`."""
    order = fused(captured, arm, weight)
    if not second_stage:
        return [key for key, _ in order]
    by_key = {c.key: c for c in captured.candidates}
    head = order[:pool]
    ranked, _ = rank_pool([value for _, value in head], np.asarray([by_key[key].second for key, _ in head]),
                          [by_key[key].hubness for key, _ in head], [key for key, _ in head], hub_penalty=hub_penalty)
    return [head[i][0] for i in ranked] + [key for key, _ in order[pool:]]


def rows(captured: Sequence[Captured], arm: Arm, weight: float, ks: Sequence[int], *,
         second_stage: bool = True, sessions: bool = False, hub_penalty: float = C.HUB_PENALTY) -> list[dict]:
    """One scored row per question, as `atlas.research.evaluate.ask` writes them (without latencies)."""
    out = []
    for cap in captured:
        ranked = replay(cap, arm, weight, second_stage=second_stage, hub_penalty=hub_penalty)
        row = {"qid": cap.question.qid, "user_id": cap.question.user_id, "group": cap.question.group,
               "ranked": ranked, **score(cap.question, ranked, ks)}
        if sessions and cap.question.relevant:
            row |= {f"session_{m}": v for m, v in session_scores(cap.question, ranked).items()}
        out.append(row)
    return out


def main_r10(rows: Sequence[dict]) -> float:
    """Mean R@10 of the LoCoMo main set (categories 1-4, questions with evidence): what the folds maximise."""
    main = {CATEGORY_NAMES[c] for c in MAIN_CATEGORIES}
    return float(np.mean([r["r@10"] for r in rows if r["group"] in main and "r@10" in r]))


@dataclass(frozen=True)
class Folds:
    """Leave-one-conversation-out result of one arm."""

    #: Each tenant's rows, scored with the weight chosen on the other tenants.
    rows: list[dict]
    #: The weight each fold chose (empty for RRF, which has none).
    chosen: dict[str, float]
    #: The weight best on every tenant at once: what would be adopted.
    best: float


def cross_validate(captured: Sequence[Captured], arm: Arm, *, weights: Sequence[float] = WEIGHTS,
                   second_stage: bool = True) -> Folds:
    """Leave one conversation out: each tenant's rows are scored with the weight whose `main_r10` was best on
    the other tenants."""
    if arm == "rrf":
        return Folds(rows(captured, arm, 0.0, LOCOMO_KS, second_stage=second_stage, sessions=True), {}, 0.0)
    by_weight = {w: rows(captured, arm, w, LOCOMO_KS, second_stage=second_stage, sessions=True) for w in weights}
    out, chosen = [], {}
    for tenant in dict.fromkeys(cap.question.user_id for cap in captured):
        best = max(weights, key=lambda w: main_r10([r for r in by_weight[w] if r["user_id"] != tenant]))
        chosen[tenant] = best
        out += [r for r in by_weight[best] if r["user_id"] == tenant]
    return Folds(out, chosen, max(weights, key=lambda w: main_r10(by_weight[w])))


def study(locomo: Sequence[Captured], persona: Sequence[Captured] = (), *, second_stage: bool = True,
          seed: int = 0) -> list[dict]:
    """One row per arm: LoCoMo main set out of fold (R@10 against RRF's, paired, with its bootstrap interval; per
    category; session Hit@1 and R@10), the weights the folds chose, and (if given) the persona set at the weight
    chosen on every LoCoMo conversation (the persona set has no conversations to leave out)."""
    names = [CATEGORY_NAMES[c] for c in MAIN_CATEGORIES]
    out = []
    for arm in ARMS:
        folds = cross_validate(locomo, arm, second_stage=second_stage)
        scored = [r for r in folds.rows if r["group"] in names and "r@10" in r]
        if arm == "rrf":
            baseline = {r["qid"]: r["r@10"] for r in scored}
        gain = [r["r@10"] - baseline[r["qid"]] for r in scored]
        low, high = bootstrap_ci(gain, seed=seed)
        out.append({"arm": arm, "bm25 weight per fold": " ".join(f"{w:.1f}" for w in folds.chosen.values()) or "-",
                    "R@10": float(np.mean([r["r@10"] for r in scored])),
                    "vs rrf": f"{np.mean(gain):+.3f} [{low:+.3f}, {high:+.3f}]",
                    **{c: float(np.mean([r["r@10"] for r in scored if r["group"] == c])) for c in names},
                    "session Hit@1": float(np.mean([r["session_hit@1"] for r in scored])),
                    "session R@10": float(np.mean([r["session_r@10"] for r in scored]))})
        if persona:
            on_persona = rows(persona, arm, folds.best, PERSONA_KS, second_stage=second_stage)
            out[-1] |= {"persona weight": f"{folds.best:.1f}" if folds.chosen else "-",
                        "persona R@5": float(np.mean([r["r@5"] for r in on_persona])),
                        "persona R@10": float(np.mean([r["r@10"] for r in on_persona]))}
    return out


def study_table(rows: Sequence[dict], *, title: str) -> Table:
    """The rows of `study` as a table (numbers right-aligned)."""
    return table(rows, title=title, numeric=[c for c in rows[0] if c not in ("arm", "bm25 weight per fold", "vs rrf")])
