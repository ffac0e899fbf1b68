"""Feedback and hubness as a study (docs/evaluation.md, "Third round"): dense pseudo-relevance feedback, tenant-common
query terms left out of BM25, the second stage's pool, and hubness held against a candidate, on LoCoMo dev.

    .venv/bin/python scripts/feedback_study.py [--prefix eval-locomo]

Captures the default mode's candidates once (`atlas.research.fusion_study.capture`) and reads every turn's stored
vectors back. Every arm is measured against the default mode without hubness (`replay`, the default before change
15). The feedback arms search by kNN again in Python, by exact cosine over the tenant's turns and their sentences as
`build_knn_body` scores a passage, with the query moved towards the first hits' vectors; the new ranking is fused by
RRF beside the captured ones (or replaces the kNN one), and the e5 vote re-scores the top 40 as `recall` does. The
BM25 arms ask Elasticsearch again with the query's words that are in more than a share of the tenant's turns left
out (a speaker's name is in about half). The hubness arms lower each candidate's e5 cosine by a weight times its
hubness (`atlas.core.hubness.hubness` over the tenant's turns, for several neighbourhood sizes), the weight chosen
by leave-one-conversation-out cross-validation. Prints each arm's R@10 per category and its paired gain over the
baseline with a bootstrap 95% interval.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from atlas import constants as C
from atlas.core.fusion import combine, held, rrf_fuse
from atlas.core.hubness import hubness
from atlas.core.recall import recall
from atlas.core.store import Store
from atlas.research.evaluate import LOCOMO_KS, score
from atlas.research.fusion_study import Captured, capture, replay
from atlas.research.locomo import CATEGORY_NAMES, MAIN_CATEGORIES, load_conversations
from atlas.research.metrics import bootstrap_ci
from atlas.stack import open_store

MAIN = {CATEGORY_NAMES[c] for c in MAIN_CATEGORIES}
#: Dense feedback arms: (how, first hits used, weight of their centroid, one hit per session).
DENSE_ARMS = (("third path", 3, 0.5, False), ("third path", 5, 1.0, False), ("third path", 5, 1.0, True),
              ("instead of kNN", 3, 0.5, False), ("a path per hit", 3, 1.0, False), ("a path per hit", 5, 1.0, True))
#: BM25 arms: a query word in more than this share of the tenant's turns is left out.
TENANT_SHARES = (0.2, 0.1)
#: Second-stage pools tried (the design's is C.RERANK_POOL, 40).
POOLS = (20, 80, 160)
#: Hubness: neighbourhood sizes, and the weights the folds choose from (0: off).
HUB_NEIGHBOURS = (3, 10, 30, 100)
HUB_WEIGHTS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


class Turns:
    """Every episode's stored vectors (nomic passage and sentences, e5), read back once, by source key."""

    def __init__(self, store: Store) -> None:
        self.user: dict[str, str] = {}
        self.session: dict[str, str] = {}
        self.passage: dict[str, np.ndarray] = {}
        self.e5: dict[str, np.ndarray] = {}
        sentences: dict[str, np.ndarray] = {}
        source = {"includes": ["source_key", "session_id", "user_id", "embedding", "sentences.embedding",
                               "rerank_embedding"], "exclude_vectors": False}
        page = store.es.search(index=f"{store.prefix}-episodic", scroll="5m", size=500, sort=["_doc"], source=source)
        while page["hits"]["hits"]:
            for hit in page["hits"]["hits"]:
                doc, key = hit["_source"], hit["_source"]["source_key"]
                self.user[key], self.session[key] = doc["user_id"], doc["session_id"]
                self.passage[key] = unit(np.asarray(doc["embedding"], np.float32))
                self.e5[key] = np.asarray(doc["rerank_embedding"], np.float32)
                sentences[key] = np.asarray([s["embedding"] for s in doc.get("sentences") or ()], np.float32)
            page = store.es.scroll(scroll_id=page["_scroll_id"], scroll="5m")
        store.es.clear_scroll(scroll_id=page["_scroll_id"])
        self.by_user: dict[str, tuple[list[str], np.ndarray, np.ndarray, np.ndarray]] = {}
        for user in set(self.user.values()):
            keys = [k for k, u in self.user.items() if u == user]
            owners = np.asarray([i for i, k in enumerate(keys) for _ in range(len(sentences[k]))], dtype=int)
            rows = [sentences[k].reshape(-1, 768) for k in keys]
            self.by_user[user] = (keys, np.stack([self.passage[k] for k in keys]), owners, unit(np.concatenate(rows)))

    def knn(self, user: str, vector: np.ndarray, n: int = C.RRF_WINDOW) -> list[str]:
        """The tenant's turns by their best cosine (passage or one sentence), best first."""
        keys, passages, owners, sentences = self.by_user[user]
        vector = unit(vector)
        best = passages @ vector
        np.maximum.at(best, owners, sentences @ vector)
        return [keys[i] for i in np.argsort(-best)[:n]]


def captured_rankings(cap: Captured, window: int = C.RRF_WINDOW) -> dict[str, list[str]]:
    return {path: [c.key for c in sorted((c for c in cap.candidates if c.ranks.get(path, window + 1) <= window),
                                         key=lambda c: c.ranks[path])] for path in ("bm25", "dense")}


def second_stage(turns: Turns, query_e5: np.ndarray, rankings: dict[str, list[str]], *,
                 hub: dict[str, float] | None = None, weight: float = 0.0) -> list[str]:
    """RRF of `rankings`, then the e5 vote over the top RERANK_POOL, each cosine lowered by `weight` x `hub`, as
    `recall` orders the default mode."""
    fused = rrf_fuse(rankings)
    head = fused[:C.RERANK_POOL]
    second = held(np.asarray([turns.e5[k] @ query_e5 for k, _, _ in head]),
                  [hub[k] if hub else None for k, _, _ in head], penalty=weight)
    final = combine(np.asarray([s for _, s, _ in head]), second)
    return [head[i][0] for i in np.argsort(-final, kind="stable")] + [k for k, _, _ in fused[C.RERANK_POOL:]]


def tenant_hubness(turns: Turns, neighbours: int) -> dict[str, float]:
    """Each turn's hubness among its tenant's turns (e5 vectors), as a load attaches it."""
    out: dict[str, float] = {}
    for keys, *_ in turns.by_user.values():
        values = hubness(np.asarray([turns.e5[k] for k in keys]), neighbours=neighbours)
        out |= dict(zip(keys, values.tolist(), strict=True))
    return out


def leave_one_out(captured: Sequence[Captured], by_weight: dict[float, dict[str, list[str]]]
                  ) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Each conversation ranked with the weight whose main-set R@10 was best on the other six: (ranked, chosen)."""
    r10 = {w: {c.question.qid: score(c.question, ranked[c.question.qid], LOCOMO_KS).get("r@10")
               for c in captured} for w, ranked in by_weight.items()}
    out: dict[str, list[str]] = {}
    chosen: dict[str, float] = {}
    for tenant in dict.fromkeys(c.question.user_id for c in captured):
        others = [c.question.qid for c in captured if c.question.user_id != tenant and c.question.group in MAIN
                  and c.question.relevant]
        chosen[tenant] = max(by_weight, key=lambda w: float(np.mean([r10[w][q] for q in others])))
        out |= {c.question.qid: by_weight[chosen[tenant]][c.question.qid] for c in captured
                if c.question.user_id == tenant}
    return out, chosen


def dense_feedback(turns: Turns, cap: Captured, first: Sequence[str], query: np.ndarray, query_e5: np.ndarray, *,
                   how: str, hits: int, weight: float, per_session: bool) -> list[str]:
    seeds: list[str] = []
    for key in first:
        if not (per_session and any(turns.session[key] == turns.session[s] for s in seeds)):
            seeds.append(key)
        if len(seeds) == hits:
            break
    rankings, user = captured_rankings(cap), cap.question.user_id
    if how == "a path per hit":
        rankings |= {f"feedback {i}": turns.knn(user, unit(query) + weight * turns.passage[s])
                     for i, s in enumerate(seeds)}
    else:
        moved = turns.knn(user, unit(query) + weight * unit(np.mean([turns.passage[s] for s in seeds], axis=0)))
        rankings["feedback" if how == "third path" else "dense"] = moved
    return second_stage(turns, query_e5, rankings)


def tenant_terms(store: Store, captured: Sequence[Captured], turns: Turns) -> Callable[[Captured, float], str]:
    """A function giving a question's words in at most `share` of its tenant's turns (counted in one search per
    question, a `filters` aggregation)."""
    sizes = {user: len(keys) for user, (keys, *_) in turns.by_user.items()}
    counts: dict[tuple[str, str], int] = {}

    def kept(cap: Captured, share: float) -> str:
        user, words = cap.question.user_id, re.findall(r"[\w']+", cap.question.query)
        if missing := [w for w in words if (user, w.lower()) not in counts]:
            body = {"filters": {"filters": {w.lower(): {"match": {"text": w}} for w in missing}}}
            found = store.es.search(index=f"{store.prefix}-episodic", size=0, query={"term": {"user_id": user}},
                                    aggs={"words": body})["aggregations"]["words"]["buckets"]
            counts.update({(user, w): b["doc_count"] for w, b in found.items()})
        return " ".join(w for w in words if counts[(user, w.lower())] <= share * sizes[user]) or cap.question.query

    return kept


def report(name: str, ranked: dict[str, list[str]], captured: Sequence[Captured], base: dict[str, float]) -> None:
    rows: list[dict[str, Any]] = [{"qid": c.question.qid, "group": c.question.group,
                                   **score(c.question, ranked[c.question.qid], LOCOMO_KS)} for c in captured]
    rows = [r for r in rows if "r@10" in r]
    cells = [f"{np.mean([r['r@10'] for r in rows if r['group'] in MAIN]):.3f}"]
    for groups in (MAIN, {"multi-hop"}):
        gain = [r["r@10"] - base[r["qid"]] for r in rows if r["group"] in groups]
        low, high = bootstrap_ci(gain, seed=0)
        cells.append(f"{np.mean(gain):+.3f} [{low:+.3f}, {high:+.3f}]")
    cells += [f"{np.mean([r['r@10'] for r in rows if r['group'] == g]):.3f}" for g in CATEGORY_NAMES.values()]
    print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", default="eval-locomo")
    args = parser.parse_args()
    from atlas.research.evaluate import prepare_locomo

    store = open_store(args.prefix)
    asked, _ = prepare_locomo(store, load_conversations(), progress=False)
    captured = capture(store, asked)
    turns = Turns(store)
    queries = [c.question.query for c in captured]
    nomic = dict(zip(queries, store.embedder.embed_queries(queries), strict=True))
    assert store.second_stage is not None and store.second_stage.embedder is not None
    e5 = dict(zip(queries, store.second_stage.embedder.embed_queries(queries), strict=True))
    default = {c.question.qid: replay(c, "rrf", 0.0, hub_penalty=0.0) for c in captured}
    base = {c.question.qid: score(c.question, default[c.question.qid], LOCOMO_KS).get("r@10", 0.0) for c in captured}
    print("| arm | main R@10 | gain, main | gain, multi-hop | " + " | ".join(CATEGORY_NAMES.values()) + " |")
    print("|---|---:|---|---|" + "---:|" * len(CATEGORY_NAMES))
    report("default mode without hubness (before change 15)", default, captured, base)
    for how, hits, weight, per_session in DENSE_ARMS:
        ranked = {c.question.qid: dense_feedback(turns, c, default[c.question.qid], nomic[c.question.query],
                                                 e5[c.question.query], how=how, hits=hits, weight=weight,
                                                 per_session=per_session) for c in captured}
        report(f"dense feedback, {how}, {hits} hits{' of distinct sessions' if per_session else ''}, "
               f"weight {weight}", ranked, captured, base)
    kept = tenant_terms(store, captured, turns)
    for share in TENANT_SHARES:
        ranked = {}
        for c in tqdm(captured, desc=f"bm25 share {share}", unit="q"):
            found = recall(store.at(c.question.now), c.question.user_id, kept(c, share), k=C.RRF_WINDOW, mode="bm25")
            rankings = captured_rankings(c) | {"bm25": [h.source.get("source_key") or h.id for h in found.hits]}
            ranked[c.question.qid] = second_stage(turns, e5[c.question.query], rankings)
        report(f"BM25 without words in over {share:.0%} of the tenant's turns", ranked, captured, base)
    for pool in POOLS:
        report(f"second-stage pool {pool}", {c.question.qid: replay(c, "rrf", 0.0, pool=pool, hub_penalty=0.0)
                                             for c in captured}, captured, base)
    for neighbours in HUB_NEIGHBOURS:
        hub = tenant_hubness(turns, neighbours)
        by_weight = {w: {c.question.qid: second_stage(turns, e5[c.question.query], captured_rankings(c), hub=hub,
                                                      weight=w) for c in captured} for w in HUB_WEIGHTS}
        ranked, chosen = leave_one_out(captured, by_weight)
        report(f"hubness of {neighbours} neighbours, weight per fold {' '.join(map(str, chosen.values()))}",
               ranked, captured, base)
        if neighbours == C.HUB_NEIGHBOURS:
            report(f"hubness of {neighbours} neighbours, weight {C.HUB_PENALTY}", by_weight[C.HUB_PENALTY], captured,
                   base)
    report("the default mode as captured (change 15: the stored hubness, weight "
           f"{C.HUB_PENALTY})", {c.question.qid: replay(c, "rrf", 0.0) for c in captured}, captured, base)


if __name__ == "__main__":
    main()
