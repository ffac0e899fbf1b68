"""Hybrid recall: BM25 and kNN over the four indices in one `_msearch`, fused by RRF, then re-scored.

This cluster has no `rrf` retriever, so fusion happens here: each path returns its
top `window`, and a document's fused score is the sum over paths of 1 / (rank_constant + rank).
The BM25 path weighs each word of the query by its IDF among the documents the user can read (`term_weights`: one
search, made while the query is embedded; Elasticsearch's own term statistics count every tenant of a shard) and
multiplies its scores by recency, use and priors (`atlas.core.scoring`); the kNN path ranks by similarity alone,
times only the boost of a period the question names (see `build_knn_body`).
The second stage (`atlas.models.rerank`) re-scores the top `pool` of the fused list (`fusion.rank_pool`); the
embedding stage holds each candidate's hubness against it (`atlas.core.hubness`). The one `_msearch` returns what
the second stage reads (the stored `rerank_embedding` and `hubness`), so recall makes no other round trip than the
term statistics', except `settle_supersessions`' search by id when a hit has retired something.
Every request body is built by a pure function, so a notebook can print it and paste
it into Kibana Dev Tools. A recall only reads: recording the use of the facts it returned is the caller's step
(`record_recall`), which the agent loop and the MCP tools take.
"""

from __future__ import annotations

import json
import math
import string
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from atlas import constants as C
from atlas.core.clock import Period, as_utc, es_date, mentioned_period
from atlas.core.documents import VECTOR_FIELDS, Owned
from atlas.core.errors import AtlasError, ValidationError
from atlas.core.fusion import rank_pool, rrf_fuse
from atlas.core.memory import record_use
from atlas.core.schemas import archive_name, build_owner_filter, searchable
from atlas.core.scoring import ScoringParams, build_scored_query, build_valid_clause, period_functions
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
    #: The fused score: the sum over the paths that found it of 1 / (RRF_RANK_CONSTANT + rank), so at most
    #: 2 / 31 with two paths. It means the same in every mode and for every pool size. The hits are in its order
    #: unless the second stage ran, which may reorder the top of the list (`second_stage_score`).
    score: float
    #: The second stage's own score (None when it did not run): the embedding stage's cosine to the query minus
    #: HUB_PENALTY x hubness, a cross-encoder's logit, or an endpoint's relevance.
    second_stage_score: float | None
    superseded_by: str | None
    superseded_at: str | None
    source: dict = field(repr=False)
    seq_no: int = field(default=-1, repr=False)
    primary_term: int = field(default=-1, repr=False)

    @property
    def current(self) -> bool:
        return self.superseded_by is None

    @property
    def hubness(self) -> float | None:
        """The memory's `hubness` (`atlas.core.hubness`), which the embedding second stage holds against it."""
        return self.source.get("hubness")


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
    #: Seconds spent in query embedding ("embed"), in it and the term statistics' search side by side ("stats"), the
    #: `_msearch` ("es"), fusion ("fusion") and the second stage ("second"), and within them: each search on the
    #: server ("took_stats", "took_<path>", from the response's `took`) and the check of in-flight supersessions
    #: ("settle").
    timings: dict[str, float]
    #: The `_msearch` body, header and search per path.
    requests: list[dict]
    #: The period the query names, whose episodes were boosted (`atlas.core.clock.mentioned_period`), if any.
    period: Period | None = None

    def ids(self) -> list[str]:
        return [hit.id for hit in self.hits]


# --- request bodies ------------------------------------------------------------------


def build_filters(prefix: str, user_id: str, *, code_filter: bool = True, include_superseded: bool = False,
                  session_id: str | None = None, as_of: datetime | None = None, period: Period | None = None) -> dict:
    """The user's own documents plus the shared catalog (the code-side twin of the DLS query); with `session_id`,
    only that session's; with `as_of`, only what was written by then and, unless `include_superseded`, not yet
    superseded then. A superseded fact that held during `period` (the one the query names) is let through: "where
    did I live in 2024?" is answered from the chain."""
    clauses: dict = {"filter": [], "must_not": []}
    if code_filter:
        clauses["filter"].append(build_owner_filter(prefix, user_id))
    if session_id is not None:
        clauses["filter"].append({"term": {"session_id": session_id}})
    if as_of is not None:
        clauses["filter"].append({"range": {"created_at": {"lte": es_date(as_of)}}})
    if not include_superseded:  # superseded at all, or by `as_of` (a fact retired later was current then)
        retired = ({"range": {"superseded_at": {"lte": es_date(as_of)}}} if as_of is not None
                   else {"exists": {"field": "superseded_by"}})
        clauses["must_not"].append(retired if period is None else
                                   {"bool": {"filter": [retired], "must_not": [build_valid_clause(period)]}})
    return {"bool": clauses}


@dataclass(frozen=True)
class Tuning:
    """Recall's research knobs, each at its measured default (docs/evaluation.md): to study recall, not to use it."""

    #: Candidates taken from each retrieval path before fusion.
    window: int = C.RRF_WINDOW
    rank_constant: int = C.RRF_RANK_CONSTANT
    #: How many of the fused list the second stage re-scores, and how much the fused rank weighs against it.
    pool: int = C.RERANK_POOL
    rrf_weight: float = C.RERANK_RRF_WEIGHT
    #: How much a candidate's hubness lowers the embedding stage's cosine (0: off).
    hub_penalty: float = C.HUB_PENALTY
    #: Read only the user's shard of each index (`recall_header`); off asks every shard.
    routed: bool = True
    #: Weigh each word of the BM25 path by its IDF among the user's documents (`term_weights`); off: every word 1.
    idf: bool = True
    #: Search the query's stop words in `text.exact` too (the subfield keeps them; `text` drops them).
    exact_stop_words: bool = C.EXACT_STOP_WORDS
    #: The BM25 path's first phase: 0 scores every matching memory with the multipliers; N takes the top N by the
    #: words' weights alone (Elasticsearch can skip blocks) and gives those N the multiplied score (`rescore`).
    rescore: int = C.BM25_RESCORE_WINDOW
    #: HNSW candidates examined per shard by the kNN path (at least `window`).
    num_candidates: int = C.KNN_NUM_CANDIDATES

    def checked(self) -> Tuning:
        for value, what in ((self.window, "window"), (self.pool, "pool"), (self.rank_constant, "rank_constant"),
                            (self.num_candidates, "num_candidates")):
            check_k(value, limit=10_000, what=what)
        check_k(self.rescore, limit=10_000, what="rescore", low=0)
        for number, what in ((self.rrf_weight, "rrf_weight"), (self.hub_penalty, "hub_penalty")):
            check_number(number, low=0, high=10, what=what)
        for flag, what in ((self.routed, "routed"), (self.idf, "idf"), (self.exact_stop_words, "exact_stop_words")):
            check_flag(flag, what)
        return self


DEFAULT_TUNING = Tuning()


#: The BM25 path's fields and their weights, `text` (stemmed) having 1.
BM25_FIELDS = {"text": 1.0, "text.exact": C.EXACT_BOOST, "context": C.CONTEXT_BOOST}

#: {field: {word: weight}}: what each word of a query adds to a memory's BM25 score when the field holds it.
Weights = dict[str, dict[str, float]]


def query_words(query: str) -> Counter[str]:
    """The BM25 path's words: the first MAX_QUERY_TERMS of `query`, lowercased (both analyzers lowercase), each
    with how often the query says it."""
    return Counter(word.lower() for word in query.split()[:C.MAX_QUERY_TERMS])


def build_stats_body(prefix: str, user_id: str, words: Sequence[str], *, code_filter: bool = True) -> dict:
    """The term statistics of `words` among the documents the user can read (its own and the catalog's, DLS or the
    code filter): per field, how many documents have it and how many match each word. No hits."""
    scope = {"bool": {"filter": [build_owner_filter(prefix, user_id)]}} if code_filter else {"match_all": {}}
    aggs = {"fields": {"filters": {"filters": {name: {"exists": {"field": name}} for name in BM25_FIELDS}}}}
    for name in BM25_FIELDS:
        aggs[name] = {"filters": {"filters": {word: {"match": {name: word}} for word in words}}}
    return {"size": 0, "query": scope, "aggs": aggs}


def idf(doc_freq: int, docs: int) -> float:
    """BM25's inverse document frequency, as Lucene computes it: ln(1 + (docs - doc_freq + 0.5) / (doc_freq + 0.5))."""
    return math.log(1 + (docs - doc_freq + 0.5) / (doc_freq + 0.5))


def weights_from(stats: dict, words: Counter[str]) -> Weights:
    """{field: {word: field weight x occurrences x IDF}} from a `build_stats_body` response, for the words some
    document holds (the others match nothing)."""
    aggs = stats["aggregations"]
    weights: Weights = {}
    for name, boost in BM25_FIELDS.items():
        docs = aggs["fields"]["buckets"][name]["doc_count"]
        weights[name] = {word: round(boost * words[word] * idf(bucket["doc_count"], docs), 6)
                         for word, bucket in aggs[name]["buckets"].items() if bucket["doc_count"]}
    return weights


def term_weights(store: Store, user_id: str, query: str, header: dict, *, tuning: Tuning = DEFAULT_TUNING,
                 timings: dict[str, float] | None = None) -> Weights:
    """The BM25 path's weights for `query`: each word's IDF among the documents the user can read in the memory
    indices of `header` (one search of `build_stats_body`, through the user's client), so that no other tenant's
    documents count. The archive, when the recall reads it (`as_of`, superseded facts), is left out, so a word weighs
    the same in a recall of the past as in one made then. Its server time goes into `timings` as "took_stats"
    (seconds). Without `tuning.idf`, every word weighs 1 (no search); without `tuning.exact_stop_words`, a stop word
    is not searched in `text.exact`."""
    words = query_words(query)
    if not tuning.idf:
        weights = {name: {word: boost * n for word, n in words.items()} for name, boost in BM25_FIELDS.items()}
    else:
        body = build_stats_body(store.prefix, user_id, list(words), code_filter=store.code_filter)
        live = ",".join(name for name in header["index"].split(",") if name != archive_name(store.prefix))
        stats = store.read_client(user_id).search(index=live, routing=header.get("routing"),
                                                  ignore_unavailable=True, **body)
        if timings is not None:
            timings["took_stats"] = stats["took"] / 1000
        weights = weights_from(stats.body, words)
    if not tuning.exact_stop_words:
        weights["text.exact"] = {word: weight for word, weight in weights["text.exact"].items()
                                 if word.strip(string.punctuation) not in C.ENGLISH_STOPWORDS}
    return weights


def build_bm25_body(weights: Weights, filters: dict, now: datetime, params: ScoringParams, window: int, *,
                    period: Period | None = None, rescore: int = C.BM25_RESCORE_WINDOW) -> dict:
    """BM25 over the text, its exact-token subfield and the replied-to context: a memory scores the weight of each
    word it holds (`term_weights`; the indices' `boolean` similarity adds the boosts as given), times the
    multipliers.

    With `rescore`, only the top `rescore` by the words' weights (ties to the newest: `distance_feature`) get the
    multipliers: a plain top-k, which Elasticsearch may answer without scoring every match."""
    should = [{"match": {name: {"query": word, "boost": weight}}}
              for name, words in weights.items() for word, weight in words.items()]
    match = {"bool": {"should": should, "minimum_should_match": 1}} if should else {"match_none": {}}
    scored = build_scored_query({"bool": {"must": [match], "filter": [filters]}}, now, params=params, period=period)
    body = {"size": window, "query": scored, "seq_no_primary_term": True, "_source": {"excludes": list(VECTOR_FIELDS)}}
    if not rescore:
        return body
    newest = {"distance_feature": {"field": "timestamp", "origin": es_date(now), "pivot": params.decay_offset,
                                   "boost": C.RESCORE_TIE_BOOST}}
    return body | {"query": {"bool": {"must": [match], "should": [newest], "filter": [filters]}},
                   "track_total_hits": False,
                   "rescore": {"window_size": max(rescore, window), "query": {
                       "rescore_query": scored, "query_weight": 0, "rescore_query_weight": 1, "score_mode": "total"}}}


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


def recall_indices(store: Store, types: Sequence[C.MemoryType], with_archive: bool) -> str:
    names = searchable(store.prefix, types=types)
    return ",".join(names + ([archive_name(store.prefix)] if with_archive else []))


def paths_of(mode: C.RecallMode) -> tuple[str, ...]:
    return {"bm25": ("bm25",), "dense": ("dense",)}.get(mode, ("bm25", "dense"))


def recall_header(store: Store, user_id: str, types: Sequence[C.MemoryType], *, archive: bool,
                  routed: bool = True) -> dict:
    """The `_msearch` header of a recall's searches: the indices of `types` (and the archive), only the user's shard
    of each when `routed` (`routing=user_id`, where all of the user's documents live, `documents.routing_of`)."""
    return {"index": recall_indices(store, types, archive), **({"routing": user_id} if routed else {}),
            "ignore_unavailable": True}


def build_recall_requests(store: Store, user_id: str, *, mode: C.RecallMode, header: dict, now: datetime,
                          params: ScoringParams, window: int, weights: Weights | None,
                          rescore: int = C.BM25_RESCORE_WINDOW, num_candidates: int = C.KNN_NUM_CANDIDATES,
                          query_vector: Sequence[float] | None, include_superseded: bool = False,
                          period: Period | None = None, session_id: str | None = None,
                          second_stage_fields: bool = False, as_of: datetime | None = None) -> list[dict]:
    """[{"path", "header", "body"}] of one `_msearch`: one search per retrieval path.

    The BM25 path takes the query's `weights` (`term_weights`) and `rescore`, the kNN path its `query_vector` and
    `num_candidates`. `session_id` restricts every path to that session. `second_stage_fields` returns each hit's
    stored `rerank_embedding` (a doc value) for the second stage. `as_of` keeps what was held then (`build_filters`)."""
    filters = build_filters(store.prefix, user_id, code_filter=store.code_filter, include_superseded=include_superseded,
                            session_id=session_id, as_of=as_of, period=period)
    vectors = {"docvalue_fields": ["rerank_embedding"]} if second_stage_fields else {}  # cheaper than in `_source`
    requests = []
    for path in paths_of(mode):
        if path == "bm25":
            if weights is None:
                raise ValidationError(f"mode {mode} searches by BM25: pass the query's weights (term_weights)")
            body = build_bm25_body(weights, filters, now, params, window, period=period, rescore=rescore)
        elif query_vector is None:
            raise ValidationError(f"mode {mode} searches by kNN: pass the query_vector")
        else:
            body = build_knn_body(query_vector, filters, params, window, period=period, num_candidates=num_candidates)
        requests.append({"path": path, "header": header, "body": body | vectors})
    return requests


def to_kibana(requests: list[dict]) -> str:
    """The `_msearch` as it would be typed in Kibana Dev Tools."""
    lines = ["GET _msearch"]
    for request in requests:
        lines += [json.dumps(request["header"]), json.dumps(request["body"])]
    return "\n".join(lines)


def tie_order(doc: dict, key: str) -> tuple[str, str, str]:
    """How a path orders memories of equal score, largest first: the newest, then by text, then by key. Not by
    Lucene's doc ids, which another tenant's writes and their merges renumber, nor by the random ids alone, which
    differ between two loads of the same data."""
    source = doc.get("_source") or {}
    return str(source.get("timestamp") or ""), str(source.get("text") or ""), key


def search(store: Store, user_id: str, requests: list[dict], *, timings: dict[str, float] | None = None
           ) -> tuple[dict[str, dict], dict[str, list[str]], dict[str, dict[str, float]]]:
    """Send `requests` as one `_msearch`: ({key: raw hit}, {path: [key, ...]}, {key: {path: _score}}),
    a key being "<index>/<id>", each path's keys by score, then `tie_order`; each path's server time goes into
    `timings` as "took_<path>" (seconds)."""
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
        for doc in response["hits"]["hits"]:
            key = f"{doc['_index']}/{doc['_id']}"
            if vector := doc.get("fields", {}).get("rerank_embedding"):
                doc["_source"]["rerank_embedding"] = vector[0]
            raw.setdefault(key, doc)
            path_scores.setdefault(key, {})[request["path"]] = doc["_score"]
        keys = [f"{doc['_index']}/{doc['_id']}" for doc in response["hits"]["hits"]]
        rankings[request["path"]] = sorted(sorted(keys, key=lambda k: tie_order(raw[k], k), reverse=True),
                                           key=lambda k: -path_scores[k][request["path"]])
    return raw, rankings, path_scores


def _hit(raw: dict, ranks: dict[str, int], path_scores: dict[str, float], score: float) -> Hit:
    source = raw["_source"]
    return Hit(id=raw["_id"], index=raw["_index"], memory_type=source.get("memory_type", ""),
               text=source.get("text", ""), user_id=source.get("user_id"), ranks=ranks, path_scores=path_scores,
               score=score, second_stage_score=None, superseded_by=source.get("superseded_by"),
               superseded_at=source.get("superseded_at"), source=source, seq_no=raw.get("_seq_no", -1),
               primary_term=raw.get("_primary_term", -1))


def settle_supersessions(store: Store, user_id: str, hits: list[Hit]) -> list[Hit]:
    """Show one version of a fact whose supersession is in flight.

    Supersession indexes the new fact before it marks the old ones, so a refresh in between shows
    both as current, and a writer that loses a race shows its new fact until it removes it. The old
    facts say which successor won: a new fact counts once they point to it, and until then they stay
    current. Costs one search by id, only when a hit has retired something. A hit marked superseded already was
    let through on purpose (it held during the period the query names) and stays.
    """
    targets = sorted({old for hit in hits for old in hit.source.get("supersedes") or ()})
    if not targets:
        return hits
    found = store.read_client(user_id).search(index=store.indices, routing=user_id, query={"ids": {"values": targets}},
                                              size=len(targets), source_includes=["superseded_by"])
    pointer = {hit["_id"]: hit["_source"].get("superseded_by") for hit in found["hits"]["hits"]}
    return [hit for hit in hits if (hit.superseded_by is not None or pointer.get(hit.id) is None)
            and all(pointer.get(old, hit.id) == hit.id for old in hit.source.get("supersedes") or ())]


# --- the second stage -------------------------------------------------------------------------


def _second_stage(store: Store, query: str, pool: list[Hit], tuning: Tuning) -> list[Hit]:
    """`pool` in the second stage's order (`fusion.rank_pool`), each hit's `second_stage_score` set. The embedding
    stage reads the vectors the `_msearch` returned; its cosines are lowered by `hub_penalty` x each candidate's
    `hubness` (a candidate without one counts as the pool's mean)."""
    stage = store.second_stage
    assert stage is not None
    vectors = None
    if stage.embedder is not None:
        try:
            vectors = np.asarray([h.source["rerank_embedding"] for h in pool], dtype=np.float32)
        except KeyError:
            raise AtlasError("a candidate has no stored rerank_embedding "
                             "(written before the second stage was set up)") from None
    scores = stage.scores(query, [h.text for h in pool], vectors)
    # Hubness is a cosine, held only against the embedding stage's cosines: another stage's scores stay as they are.
    hubs = [h.source.get("hubness") if vectors is not None else None for h in pool]
    order, held_scores = rank_pool([h.score for h in pool], scores, hubs, [f"{h.index}/{h.id}" for h in pool],
                                   rrf_weight=tuning.rrf_weight, hub_penalty=tuning.hub_penalty)
    for hit, value in zip(pool, held_scores, strict=True):
        hit.second_stage_score = float(value)
    return [pool[i] for i in order]


# --- recall ------------------------------------------------------------------------------------


def recall(store: Store, user_id: str, query: str, *, k: int = 10, types: Sequence[C.MemoryType] | None = None,
           include_superseded: bool = False, mode: C.RecallMode = C.DEFAULT_RECALL_MODE,
           as_of: datetime | None = None, tuning: Tuning = DEFAULT_TUNING) -> RecallResult:
    """The user's memories (and catalog items) most relevant to `query`, best first.

    Reads go through the user's own client, at the store's clock (`store.now`; `Store.at` fixes it), with the
    store's scoring parameters. It only reads: `record_recall` counts the facts it returned as used. A query
    longer than `MAX_QUERY_CHARS` is refused: search a stored text with `clip_query`.

    `as_of` (not after the store's clock) recalls what Atlas held then: memories written by then, facts not yet
    superseded then (archived ones too), decay and named periods measured from then. Memories forgotten since
    are gone, and use counts are today's.
    """
    check_user(user_id)
    check_query(query)
    check_k(k)
    check_choice(mode, C.RECALL_MODES, "mode")
    checked_types = check_types(types)
    check_flag(include_superseded, "include_superseded")
    tuning.checked()
    now = store.now()
    if as_of is not None:
        as_of = as_utc(check_when(as_of, "as_of"))
        if as_of > now:
            raise ValidationError(f"as_of {es_date(as_of)} is after the store's clock ({es_date(now)}): "
                                  "recall as of now needs no as_of")
        now = as_of
    timings = {"embed": 0.0, "es": 0.0, "fusion": 0.0, "second": 0.0}
    period = mentioned_period(query, now)
    stage = store.second_stage if mode == "hybrid+rerank" else None
    header = recall_header(store, user_id, checked_types,
                           archive=include_superseded or as_of is not None or period is not None, routed=tuning.routed)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=1) as pool:  # the term statistics are read while the query is embedded
        stats = (pool.submit(term_weights, store, user_id, query, header, tuning=tuning, timings=timings)
                 if mode != "dense" else None)
        query_vector = store.embedder.embed_queries([query])[0] if mode != "bm25" else None
        timings["embed"] = time.perf_counter() - started
        weights = stats.result() if stats is not None else None
    timings["stats"] = time.perf_counter() - started
    requests = build_recall_requests(store, user_id, mode=mode, header=header, now=now, params=store.params,
                                     window=max(tuning.window, k), weights=weights, rescore=tuning.rescore,
                                     num_candidates=tuning.num_candidates, query_vector=query_vector,
                                     include_superseded=include_superseded, period=period, as_of=as_of,
                                     second_stage_fields=stage is not None and stage.embedder is not None)
    started = time.perf_counter()
    raw, rankings, path_scores = search(store, user_id, requests, timings=timings)
    timings["es"] = time.perf_counter() - started
    started = time.perf_counter()
    hits = [_hit(raw[key], ranks, path_scores[key], score)
            for key, score, ranks in rrf_fuse(rankings, rank_constant=tuning.rank_constant)]
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
            try:
                hits = _second_stage(store, query, hits[:tuning.pool], tuning) + hits[tuning.pool:]
                stage_name = store.second_stage.name
            except AtlasError as exc:
                note = f"second stage failed ({exc}): RRF order"
            timings["second"] = time.perf_counter() - started
    for hit in hits:
        hit.source.pop("rerank_embedding", None)
    return RecallResult(user_id, query, mode, hits[:k], stage_name, note, timings, requests, period)


def record_recall(store: Store, result: RecallResult) -> None:
    """Count the recall as a use of the user's own current facts it returned (`memory.record_use`): the step the
    agent loop and the MCP tools take after a recall, so that facts in use decay slower."""
    facts = [Owned(h.id, h.index, h.source, h.seq_no, h.primary_term) for h in result.hits
             if h.memory_type == "semantic" and h.current and h.user_id == result.user_id]
    record_use(store, result.user_id, facts)


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


def pre_recall(store: Store, user_id: str, message: str, *, k: int = C.RECALL_K,
               written: str | None = None) -> RecallResult:
    """The recall every agent turn starts with: on the user's verbatim message (its head if long), default mode.

    `written` is the id of the episode the turn just stored: it is the message itself, so it is left out (the
    recall asks for one more hit to keep `k`)."""
    result = recall(store, user_id, clip_query(message), k=k + (written is not None))
    result.hits = [hit for hit in result.hits if hit.id != written][:k]
    return result
