"""The session pass, a recall variant measured on LoCoMo and not adopted (docs/evaluation.md): after a recall,
search the sessions of its first hits again, each on its own, and interleave their best turns into the top k.

In a session's own search both paths rank only its turns, so a turn fair in both (places 60 and 120 of the whole
memory) can come first in its session. One more `_msearch`, of each path's search within each session.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import zip_longest

from atlas.core.clock import mentioned_period
from atlas.core.fusion import rrf_fuse
from atlas.core.recall import (
    DEFAULT_TUNING,
    Hit,
    RecallResult,
    Tuning,
    _hit,
    build_recall_requests,
    recall_header,
    search,
    term_weights,
)
from atlas.core.store import Store

#: The session pass (off at 0): the sessions of the first k hits, at most this many, are searched again, each on
#: its own (BM25 and kNN, one more `_msearch`), and the best SESSION_PASS_TURNS turns of each are interleaved
#: after the first SESSION_PASS_KEEP hits (`session_pass`). Measured on LoCoMo dev and not adopted
#: (docs/evaluation.md, "The session pass"): the values are the best of that study.
SESSION_PASS = 0
SESSION_PASS_TURNS = 2
SESSION_PASS_KEEP = 7


def interleave(ranked: Sequence[str], groups: Sequence[Sequence[str]], *, keep: int) -> list[str]:
    """The first `keep` of `ranked`, then the groups' keys in turns (each group's first, then each one's second,
    ...), then the rest of `ranked`: every key once, at its first place."""
    out = dict.fromkeys(ranked[:keep])
    for tier in zip_longest(*groups):
        out.update(dict.fromkeys(key for key in tier if key is not None))
    out.update(dict.fromkeys(ranked))
    return list(out)


def build_session_requests(store: Store, result: RecallResult, sessions: Sequence[str], *, turns: int,
                           tuning: Tuning = DEFAULT_TUNING) -> list[dict]:
    """The pass's `_msearch`: each path's search again within each of `sessions`, `turns` hits each.

    A request's path is "<path>@<session id>"."""
    now = store.now()
    header = recall_header(store, result.user_id, ("episodic",), archive=False, routed=tuning.routed)
    vector = store.embedder.embed_queries([result.query])[0] if result.mode != "bm25" else None
    weights = (term_weights(store, result.user_id, result.query, header, tuning=tuning)
               if result.mode != "dense" else None)
    return [request | {"path": f"{request['path']}@{session}"} for session in sessions
            for request in build_recall_requests(
                store, result.user_id, mode=result.mode, header=header, now=now, params=store.params, window=turns,
                weights=weights, rescore=tuning.rescore, num_candidates=tuning.num_candidates, query_vector=vector,
                period=mentioned_period(result.query, now), session_id=session)]


def session_pass(store: Store, result: RecallResult, *, k: int, sessions: int = SESSION_PASS,
                 turns: int = SESSION_PASS_TURNS, keep: int = SESSION_PASS_KEEP,
                 tuning: Tuning = DEFAULT_TUNING) -> list[Hit]:
    """`result`'s hits with the best `turns` turns of each of the sessions of its first `k` hits (at most `sessions`)
    interleaved after the first `keep` hits (`interleave`).

    A turn the recall did not return enters with its ranks and fused score in its session (paths
    "bm25@<session id>", "dense@<session id>"). Every hit keeps its own `score`, so the order is by place.
    """
    hits = result.hits
    found = list(dict.fromkeys(session for hit in hits[:k] if (session := hit.source.get("session_id"))))[:sessions]
    if not found or not turns:
        return hits
    raw, rankings, path_scores = search(store, result.user_id,
                                        build_session_requests(store, result, found, turns=turns, tuning=tuning))
    known = {f"{hit.index}/{hit.id}": hit for hit in hits}
    groups = []
    for session in found:
        fused = rrf_fuse({path: keys for path, keys in rankings.items() if path.endswith(f"@{session}")},
                         rank_constant=tuning.rank_constant)
        for key, score, ranks in fused:
            known.setdefault(key, _hit(raw[key], ranks, path_scores[key], score))
        groups.append([key for key, _, _ in fused])
    return [known[key] for key in interleave([f"{hit.index}/{hit.id}" for hit in hits], groups, keep=keep)]
