"""Hybrid recall: BM25 and kNN over the four indices in one `_msearch`, fused by RRF, then re-scored.

This cluster has no `rrf` retriever, so fusion happens here: each path returns its
top `window`, and a document's fused score is the sum over paths of 1 / (rank_constant + rank).
The BM25 path multiplies its scores by recency, use and priors (`atlas.core.scoring`); the kNN
path ranks by similarity alone, times only the boost of a period the question names (see
`build_knn_body`).
The second stage (`atlas.models.rerank`) re-scores the top `pool` of the fused list; the embedding stage holds
each candidate's hubness against it (`atlas.core.hubness`).
Every request body is built by a pure function, so a notebook can print it and paste
it into Kibana Dev Tools.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from atlas.core import constants as C
from atlas.core.clock import Period, mentioned_period
from atlas.core.documents import VECTOR_FIELDS, Owned
from atlas.core.errors import AtlasError, ValidationError
from atlas.core.fusion import combine, interleave, rrf_fuse
from atlas.core.hubness import held
from atlas.core.memory import record_use
from atlas.core.schemas import archive_name, build_owner_filter, searchable
from atlas.core.scoring import ScoringParams, build_scored_query, period_functions
from atlas.core.store import Store
from atlas.core.validation import (
    check_choice,
    check_flag,
    check_k,
    check_number,
    check_query,
    check_types,
    check_user,
    check_when,
)


@dataclass
class Hit:
    """One recalled memory and how it got its place."""

    id: str
    index: str
    memory_type: str
    text: str
    user_id: str | None
    #: 1-based rank in each retrieval path that found it ("bm25", "dense").
    ranks: dict[str, int]
    #: Each of those paths' own `_score`: BM25 times the multipliers; kNN (1 + cosine) / 2, times a period boost.
    path_scores: dict[str, float]
    rrf: float
    #: The second stage's own score (None when it did not run); `score` is what ranks.
    second_stage_score: float | None
    score: float
    superseded_by: str | None
    superseded_at: str | None
    source: dict = field(repr=False)
    #: The memory's `hubness` the embedding second stage held against it (`atlas.core.hubness`), if it had one.
    hubness: float | None = None
    seq_no: int = field(default=-1, repr=False)
    primary_term: int = field(default=-1, repr=False)

    @property
    def current(self) -> bool:
        return self.superseded_by is None


@dataclass
class RecallResult:
    user_id: str
    query: str
    mode: C.RecallMode
    hits: list[Hit]
    #: Name of the second stage that ordered the hits, or None (RRF order).
    second_stage: str | None
    #: Said when something fell back (e.g. "second stage failed: ...; RRF order").
    note: str | None
    #: Seconds spent in query embedding ("embed"), the `_msearch` ("es"), fusion ("fusion") and the second stage
    #: ("second"), and within them: each path's search on the server ("took_<path>", from the response's `took`),
    #: the check of in-flight supersessions ("settle") and the second stage's `mget` of stored vectors ("mget").
    timings: dict[str, float]
    #: The `_msearch` body, header and search per path.
    requests: list[dict]
    #: The period the query names, whose episodes were boosted (`atlas.core.clock.mentioned_period`), if any.
    period: Period | None = None

    def ids(self) -> list[str]:
        return [hit.id for hit in self.hits]


# --- request bodies ------------------------------------------------------------------


def build_filters(prefix: str, user_id: str, *, code_filter: bool = True, include_superseded: bool = False,
                  session_id: str | None = None) -> dict:
    """The user's own documents plus the shared catalog (the code-side twin of the DLS query); with `session_id`,
    only that session's."""
    clauses: dict = {"filter": [], "must_not": []}
    if code_filter:
        clauses["filter"].append(build_owner_filter(prefix, user_id))
    if session_id is not None:
        clauses["filter"].append({"term": {"session_id": session_id}})
    if not include_superseded:
        clauses["must_not"].append({"exists": {"field": "superseded_by"}})
    return {"bool": clauses}


def build_bm25_body(query: str, filters: dict, now: datetime, params: ScoringParams, window: int, *,
                    period: Period | None = None) -> dict:
    """BM25 over the text, its exact-token subfield and the replied-to context (the first MAX_QUERY_TERMS words)."""
    query = " ".join(query.split()[:C.MAX_QUERY_TERMS])
    fields = ["text", f"text.exact^{C.EXACT_BOOST}", f"context^{C.CONTEXT_BOOST}"]
    match = {"multi_match": {"query": query, "fields": fields, "type": "most_fields"}}
    inner = {"bool": {"must": [match], "filter": [filters]}}
    return {"size": window, "query": build_scored_query(inner, now, params=params, period=period),
            "seq_no_primary_term": True, "_source": {"excludes": list(VECTOR_FIELDS)}}


def build_knn_body(vector: Sequence[float], filters: dict, params: ScoringParams, window: int, *,
                   period: Period | None = None, num_candidates: int = C.KNN_NUM_CANDIDATES) -> dict:
    """kNN without the priors; only a period the question names multiplies its scores.

    A kNN `_score` is (1 + cosine) / 2, so most candidates sit within a few hundredths of each
    other, and a 0.85 catalog prior or a 1.2 use boost would outweigh the similarity itself
    (persona set, dense alone, R@10: MiniLM 0.77 with them and 0.95 without, e5 0.31 and 0.93;
    docs/evaluation.md). The priors reach the fused ranking through the BM25 path, whose scores
    spread far wider. A named period is different: it is evidence from the question, so it lifts
    the episodes said then in both paths.
    """
    query_vector = [round(float(x), 6) for x in vector]

    def nearest(field: str) -> dict:
        return {"knn": {"field": field, "query_vector": query_vector, "k": window,
                        "num_candidates": max(window, num_candidates), "filter": [filters]}}

    # A passage scores by its best vector: the whole passage's or, in a speaker's turn, one sentence's
    # (`atlas.core.passages.passage_sentences`). Indices written before there were sentences simply have none.
    knn: dict = {"dis_max": {"queries": [nearest("embedding"), {"nested": {
        "path": "sentences", "score_mode": "max", "ignore_unmapped": True, "query": nearest("sentences.embedding")}}]}}
    if functions := period_functions(period, params=params):
        knn = {"function_score": {"query": knn, "functions": functions, "boost_mode": "multiply"}}
    return {"size": window, "query": knn, "seq_no_primary_term": True, "_source": {"excludes": list(VECTOR_FIELDS)}}


def recall_indices(store: Store, types: Sequence[C.MemoryType], include_superseded: bool) -> str:
    names = searchable(store.prefix, types=types)
    return ",".join(names + ([archive_name(store.prefix)] if include_superseded else []))


def paths_of(mode: C.RecallMode) -> tuple[str, ...]:
    return {"bm25": ("bm25",), "dense": ("dense",)}.get(mode, ("bm25", "dense"))


def build_recall_requests(store: Store, user_id: str, query: str, *, mode: C.RecallMode,
                          types: Sequence[C.MemoryType], include_superseded: bool, now: datetime,
                          params: ScoringParams, window: int, query_vector: Sequence[float] | None,
                          period: Period | None = None, routed: bool = True,
                          session_id: str | None = None) -> list[dict]:
    """[{"path", "header", "body"}] of one `_msearch`: one search per retrieval path.

    `routed` searches only the user's shard of each index (`routing=user_id`, where all of the user's
    documents live, `documents.routing_of`); without, every shard is asked (the benchmark's comparison).
    `session_id` restricts every path to that session (`build_session_requests`)."""
    header = {"index": recall_indices(store, types, include_superseded),
              **({"routing": user_id} if routed else {}), "ignore_unavailable": True}
    filters = build_filters(store.prefix, user_id, code_filter=store.code_filter, include_superseded=include_superseded,
                            session_id=session_id)
    requests = []
    for path in paths_of(mode):
        if path == "bm25":
            body = build_bm25_body(query, filters, now, params, window, period=period)
        elif query_vector is None:
            raise ValidationError(f"mode {mode} searches by kNN: pass the query_vector")
        else:
            body = build_knn_body(query_vector, filters, params, window, period=period)
        requests.append({"path": path, "header": header, "body": body})
    return requests


def build_session_requests(store: Store, user_id: str, query: str, sessions: Sequence[str], *, turns: int,
                           **options: Any) -> list[dict]:
    """The session pass's `_msearch`: each path's search again within each of `sessions`, `turns` hits each.

    A request's path is "<path>@<session id>"; `options` are `build_recall_requests`'s."""
    return [request | {"path": f"{request['path']}@{session}"} for session in sessions
            for request in build_recall_requests(store, user_id, query, window=turns, session_id=session, **options)]


def to_kibana(requests: list[dict]) -> str:
    """The `_msearch` as it would be typed in Kibana Dev Tools."""
    lines = ["GET _msearch"]
    for request in requests:
        lines += [json.dumps(request["header"]), json.dumps(request["body"])]
    return "\n".join(lines)


def _msearch(store: Store, user_id: str, requests: list[dict], *, timings: dict[str, float] | None = None
             ) -> tuple[dict[str, dict], dict[str, list[str]], dict[str, dict[str, float]]]:
    """Send `requests` as one `_msearch`: ({key: raw hit}, {path: [key, ...]}, {key: {path: _score}}),
    a key being "<index>/<id>"; each path's server time goes into `timings` as "took_<path>" (seconds)."""
    searches = [part for r in requests for part in (r["header"], r["body"])]
    responses = store.read_client(user_id).msearch(searches=searches)["responses"]
    raw: dict[str, dict] = {}
    rankings: dict[str, list[str]] = {}
    path_scores: dict[str, dict[str, float]] = {}
    for request, response in zip(requests, responses, strict=True):
        if "error" in response:
            error = response["error"]
            reason = (error.get("root_cause") or [error])[0].get("reason")
            raise AtlasError(f"{request['path']} search failed: {reason}")
        if timings is not None:
            timings[f"took_{request['path']}"] = response["took"] / 1000
        rankings[request["path"]] = []
        for doc in response["hits"]["hits"]:
            key = f"{doc['_index']}/{doc['_id']}"
            raw.setdefault(key, doc)
            rankings[request["path"]].append(key)
            path_scores.setdefault(key, {})[request["path"]] = doc["_score"]
    return raw, rankings, path_scores


def _hit(raw: dict, ranks: dict[str, int], path_scores: dict[str, float], rrf: float) -> Hit:
    source = raw["_source"]
    return Hit(id=raw["_id"], index=raw["_index"], memory_type=source.get("memory_type", ""),
               text=source.get("text", ""), user_id=source.get("user_id"), ranks=ranks, path_scores=path_scores,
               rrf=rrf, second_stage_score=None, score=rrf, superseded_by=source.get("superseded_by"),
               superseded_at=source.get("superseded_at"), source=source, seq_no=raw.get("_seq_no", -1),
               primary_term=raw.get("_primary_term", -1))


def settle_supersessions(store: Store, user_id: str, hits: list[Hit]) -> list[Hit]:
    """Show one version of a fact whose supersession is in flight.

    Supersession indexes the new fact before it marks the old ones, so a refresh in between shows
    both as current, and a writer that loses a race shows its new fact until it removes it. The old
    facts say which successor won: a new fact counts once they point to it, and until then they stay
    current. Costs one search by id, only when a hit has retired something.
    """
    targets = sorted({old for hit in hits for old in hit.source.get("supersedes") or ()})
    if not targets:
        return hits
    found = store.read_client(user_id).search(index=store.indices, routing=user_id, query={"ids": {"values": targets}},
                                              size=len(targets), source_includes=["superseded_by"])
    pointer = {hit["_id"]: hit["_source"].get("superseded_by") for hit in found["hits"]["hits"]}
    return [hit for hit in hits if pointer.get(hit.id) is None
            and all(pointer.get(old, hit.id) == hit.id for old in hit.source.get("supersedes") or ())]


# --- the second stage -------------------------------------------------------------------------


def _second_stage(store: Store, user_id: str, query: str, pool: list[Hit], rrf_weight: float, hub_penalty: float,
                  timings: dict[str, float]) -> None:
    """Re-score `pool` in place (`combine`); `Hit.second_stage_score` keeps the stage's own score; the `mget` of
    stored vectors is timed as "mget". The embedding stage's cosines are lowered by `hub_penalty` x each
    candidate's `hubness` (`atlas.core.hubness`; a candidate without one counts as the pool's mean)."""
    stage = store.second_stage
    assert stage is not None
    vectors = None
    if stage.embedder is not None:
        started = time.perf_counter()
        docs = store.read_client(user_id).mget(docs=[{"_index": h.index, "_id": h.id, "routing": user_id}
                                                     for h in pool],
                                               source_includes=["rerank_embedding", "hubness"])["docs"]
        timings["mget"] = time.perf_counter() - started
        try:
            vectors = np.asarray([d["_source"]["rerank_embedding"] for d in docs], dtype=np.float32)
        except KeyError:
            raise AtlasError("a candidate has no stored rerank_embedding "
                             "(written before the second stage was set up)") from None
        for hit, doc in zip(pool, docs, strict=True):
            hit.hubness = doc["_source"].get("hubness")
    scores = stage.scores(query, [h.text for h in pool], vectors)
    # Hubness is a cosine, read (above) only for the embedding stage: another stage's scores are left as they are.
    combined = combine(np.asarray([h.rrf for h in pool]), held(scores, [h.hubness for h in pool], penalty=hub_penalty),
                       rrf_weight=rrf_weight)
    for hit, second, final in zip(pool, scores, combined, strict=True):
        hit.second_stage_score, hit.score = float(second), float(final)
    pool.sort(key=lambda h: -h.score)


# --- the session pass -------------------------------------------------------------------------


def _session_pass(store: Store, user_id: str, query: str, hits: list[Hit], *, sessions: int, turns: int, keep: int,
                  k: int, rank_constant: int, **options: Any) -> list[Hit]:
    """Search the sessions of the first `k` hits again, each on its own, and interleave their best turns after the
    first `keep` hits (`atlas.core.fusion.interleave`).

    In a session's own search both paths rank only its turns, so a turn fair in both (places 60 and 120 of the
    whole memory) can come first in its session. A turn the first pass did not return enters with its ranks and
    RRF score in its session (paths "bm25@<session id>", "dense@<session id>"). Every hit keeps its own `score`,
    so the order is by place, no longer by score.
    """
    found = list(dict.fromkeys(session for hit in hits[:k] if (session := hit.source.get("session_id"))))[:sessions]
    if not found:
        return hits
    raw, rankings, path_scores = _msearch(store, user_id, build_session_requests(
        store, user_id, query, found, turns=turns, types=("episodic",), include_superseded=False, **options))
    known = {f"{hit.index}/{hit.id}": hit for hit in hits}
    groups = []
    for session in found:
        fused = rrf_fuse({path: keys for path, keys in rankings.items() if path.endswith(f"@{session}")},
                         rank_constant=rank_constant)
        for key, score, ranks in fused:
            known.setdefault(key, _hit(raw[key], ranks, path_scores[key], score))
        groups.append([key for key, _, _ in fused])
    return [known[key] for key in interleave([f"{hit.index}/{hit.id}" for hit in hits], groups, keep=keep)]


# --- recall ------------------------------------------------------------------------------------


def recall(store: Store, user_id: str, query: str, *, k: int = 10, types: Sequence[C.MemoryType] | None = None,
           include_superseded: bool = False, mode: C.RecallMode = C.DEFAULT_RECALL_MODE,
           now: datetime | None = None, params: ScoringParams | None = None, window: int = C.RRF_WINDOW,
           rank_constant: int = C.RRF_RANK_CONSTANT, pool: int = C.RERANK_POOL,
           rrf_weight: float = C.RERANK_RRF_WEIGHT, hub_penalty: float = C.HUB_PENALTY, touch: bool | None = None,
           routed: bool = True,
           sessions: int = C.SESSION_PASS, session_turns: int = C.SESSION_PASS_TURNS,
           session_keep: int = C.SESSION_PASS_KEEP) -> RecallResult:
    """The user's memories (and catalog items) most relevant to `query`, best first.

    Reads go through the user's own client. `touch` refreshes `last_used_at` and bumps
    `use_count` of the current semantic facts returned (evaluations turn it off; `store.touch` when not
    given, so a server's recalls follow its store); `routed` reads only the
    user's shard of each index (`build_recall_requests`). `sessions` (0: off) runs the session pass over the
    sessions of the first `k` hits (`_session_pass`; a second `_msearch`). `hub_penalty` (0: off) weighs the
    candidates' hubness in the embedding second stage (`atlas.core.hubness`). A query longer
    than `MAX_QUERY_CHARS` is refused: search a stored text with `clip_query`.
    """
    check_user(user_id)
    check_query(query)
    check_k(k)
    check_choice(mode, C.RECALL_MODES, "mode")
    checked_types = check_types(types)
    for value, what in ((window, "window"), (pool, "pool"), (rank_constant, "rank_constant")):
        check_k(value, limit=10_000, what=what)
    for value, what in ((sessions, "sessions"), (session_turns, "session_turns"), (session_keep, "session_keep")):
        check_k(value, limit=C.MAX_K, what=what, low=0)
    check_flag(include_superseded, "include_superseded")
    touch = store.touch if touch is None else check_flag(touch, "touch")
    check_flag(routed, "routed")
    check_number(hub_penalty, low=0, high=10, what="hub_penalty")
    now = check_when(now, "now") if now is not None else store.now()
    params = params or store.params
    timings = {"embed": 0.0, "es": 0.0, "fusion": 0.0, "second": 0.0, "sessions": 0.0}
    started = time.perf_counter()
    query_vector = store.embedder.embed_queries([query])[0] if mode != "bm25" else None
    timings["embed"] = time.perf_counter() - started
    period = mentioned_period(query, now)
    requests = build_recall_requests(store, user_id, query, mode=mode, types=checked_types,
                                     include_superseded=include_superseded, now=now, params=params,
                                     window=max(window, k), query_vector=query_vector, period=period,
                                     routed=routed)
    started = time.perf_counter()
    raw, rankings, path_scores = _msearch(store, user_id, requests, timings=timings)
    timings["es"] = time.perf_counter() - started
    started = time.perf_counter()
    hits = [_hit(raw[key], ranks, path_scores[key], score)
            for key, score, ranks in rrf_fuse(rankings, rank_constant=rank_constant)]
    if not include_superseded:
        settling = time.perf_counter()
        hits = settle_supersessions(store, user_id, hits)
        timings["settle"] = time.perf_counter() - settling
    timings["fusion"] = time.perf_counter() - started
    stage_name, note = None, None
    if mode == "hybrid+rerank" and hits:
        if store.second_stage is None:
            note = "no second stage configured: RRF order"
        else:
            started = time.perf_counter()
            head = hits[:pool]
            try:
                _second_stage(store, user_id, query, head, rrf_weight, hub_penalty, timings)
                stage_name = store.second_stage.name
                hits = head + hits[pool:]
            except AtlasError as exc:
                note = f"second stage failed ({exc}): RRF order"
            timings["second"] = time.perf_counter() - started
    if sessions and session_turns and "episodic" in checked_types and hits:
        started = time.perf_counter()
        hits = _session_pass(store, user_id, query, hits, sessions=sessions, turns=session_turns, keep=session_keep,
                             k=k, rank_constant=rank_constant, mode=mode, now=now, params=params,
                             query_vector=query_vector, period=period, routed=routed)
        timings["sessions"] = time.perf_counter() - started
    hits = hits[:k]
    if touch:
        facts = [Owned(h.id, h.index, h.source, h.seq_no, h.primary_term) for h in hits
                 if h.memory_type == "semantic" and h.current and h.user_id == user_id]
        record_use(store, user_id, facts)
    return RecallResult(user_id, query, mode, hits, stage_name, note, timings, requests, period)


def clip_query(text: str, *, limit: int = C.MAX_QUERY_CHARS) -> str:
    """A stored text as a query (a user's message, a proposed fact): unchanged if it fits `limit`, else its head.

    A memory may be far longer than a query may be (`MAX_TEXT_CHARS` against `MAX_QUERY_CHARS`); the head
    is cut between words and at most `limit` characters long (BM25 and the embedders read no further).
    """
    if len(text) <= limit:
        return text
    head = text.lstrip()[:limit + 1]
    if len(head) <= limit or head[limit].isspace():
        return head[:limit]
    words = head[:limit].rsplit(maxsplit=1)  # the last word runs on past the limit: leave it out
    return words[0] if len(words) == 2 else head[:limit]


def pre_recall(store: Store, user_id: str, message: str, *, k: int = C.RECALL_K) -> RecallResult:
    """The recall every agent turn starts with: on the user's verbatim message (its head if long), default mode."""
    return recall(store, user_id, clip_query(message), k=k)
