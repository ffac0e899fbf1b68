"""What the connected cluster can do, checked by real requests in a scratch index.

The integ-test distribution lacks the script engine, the `rrf` retriever, inference,
ILM and the by-query APIs; Atlas works around each gap. This probe is what
`docs/elasticsearch.md` and `tests/test_capabilities.py` are built on, so the doc
cannot claim a capability the cluster does not have.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from elasticsearch import ApiError, Elasticsearch

from atlas.core.errors import AtlasError

JSON = {"accept": "application/json", "content-type": "application/json"}


class ProbeFailed(AtlasError):
    """A probe's request was answered, but not as a working capability answers it."""


def _check(condition: bool, failure: str) -> None:
    """A real check, not an `assert`: `python -O` would strip one and report every capability as supported."""
    if not condition:
        raise ProbeFailed(failure)


@dataclass(frozen=True)
class Capability:
    name: str
    request: str
    supported: bool
    detail: str
    #: How Atlas lives without it (only for capabilities the integ-test zip lacks).
    workaround: str = ""


def _index_fixture(es: Elasticsearch, index: str) -> None:
    es.indices.create(index=index, settings={"number_of_replicas": 0}, mappings={"properties": {
        "text": {"type": "text"}, "v": {"type": "dense_vector", "dims": 3, "similarity": "cosine"},
        "user_id": {"type": "keyword"}, "ts": {"type": "date"}, "n": {"type": "integer"}}})
    es.index(index=index, id="a", document={"text": "Lumio Hub v2 reset", "v": [1, 0, 0], "user_id": "alice",
                                            "ts": "2026-01-01", "n": 9})
    es.index(index=index, id="b", document={"text": "Lumio bulb", "v": [0, 1, 0], "user_id": "bob", "ts": "2020-01-01"})
    es.index(index=index, id="c", document={"text": "catalog item", "v": [0, 0, 1], "ts": "2020-01-01"}, refresh=True)


def _knn(es: Elasticsearch, index: str) -> str:
    hits = es.search(index=index, knn={"field": "v", "query_vector": [1, 0.1, 0], "k": 1, "num_candidates": 10})
    nearest = [hit["_id"] for hit in hits["hits"]["hits"]]
    _check(nearest == ["a"], f"kNN returned {nearest} as the nearest document, expected ['a']")
    return "kNN over an HNSW dense_vector (cosine) returns the nearest document"


def _analyzers(es: Elasticsearch, index: str) -> str:
    ok = [a for a in ("standard", "simple", "whitespace", "keyword", "stop")
          if es.indices.analyze(index=index, analyzer=a, text="Lumio Hub v2")["tokens"]]
    custom = es.indices.analyze(index=index, tokenizer="whitespace", filter=["lowercase"], text="Lumio E-0x41")
    tokens = [t["token"] for t in custom["tokens"]]
    _check(tokens == ["lumio", "e-0x41"], f"whitespace+lowercase gave {tokens}, expected ['lumio', 'e-0x41']")
    return f"built-in analyzers {', '.join(ok)}; custom whitespace+lowercase works"


def _language_analyzers(es: Elasticsearch, index: str) -> str:
    es.indices.analyze(index=index, analyzer="french", text="chiens qui courent")
    return "french analyzer available"


def _function_score(es: Elasticsearch, index: str) -> str:
    body = {"function_score": {"query": {"match_all": {}}, "functions": [
        {"filter": {"term": {"user_id": "alice"}},
         "gauss": {"ts": {"origin": "2026-01-01", "offset": "180d", "scale": "1825d", "decay": 0.5}}},
        {"field_value_factor": {"field": "n", "modifier": "log1p", "missing": 0}, "weight": 2}],
        "score_mode": "multiply", "boost_mode": "replace"}}
    hits = es.search(index=index, query=body)["hits"]["hits"]
    _check(bool(hits) and hits[0]["_id"] == "a" and hits[0]["_score"] > 0,
           f"function_score ranked {[(h['_id'], h['_score']) for h in hits]}, expected 'a' first with a positive score")
    return "filtered gauss + field_value_factor + weight, score_mode multiply"


def _msearch(es: Elasticsearch, index: str) -> str:
    resp = es.msearch(searches=[{"index": index}, {"query": {"match": {"text": "lumio"}}},
                                {"index": index}, {"knn": {"field": "v", "query_vector": [0, 1, 0], "k": 1,
                                                           "num_candidates": 5}}])
    _check(len(resp["responses"]) == 2 and all("hits" in r for r in resp["responses"]),
           f"_msearch answered {resp['responses']}, expected two searches with hits")
    return "BM25 and kNN in one round trip"


def _bulk(es: Elasticsearch, index: str) -> str:
    resp = es.bulk(operations=[{"index": {"_index": index}}, {"text": "bulk", "user_id": "bob"}], refresh=True)
    _check(not resp["errors"], f"bulk reported errors: {resp['items']}")
    return "bulk index"


def _occ_update(es: Elasticsearch, index: str) -> str:
    doc = es.get(index=index, id="a")
    es.update(index=index, id="a", doc={"n": 10}, if_seq_no=doc["_seq_no"], if_primary_term=doc["_primary_term"])
    try:
        es.update(index=index, id="a", doc={"n": 11}, if_seq_no=doc["_seq_no"], if_primary_term=doc["_primary_term"])
    except ApiError as exc:
        _check(exc.meta.status == 409, f"a stale update got {exc.meta.status}, expected 409")
        return "partial update with if_seq_no/if_primary_term; a stale one gets 409"
    raise ProbeFailed("stale update was accepted")


def _pit(es: Elasticsearch, index: str) -> str:
    pit = es.open_point_in_time(index=index, keep_alive="1m")["id"]
    try:
        hits = es.search(pit={"id": pit, "keep_alive": "1m"}, sort=[{"_shard_doc": "asc"}], size=1)["hits"]["hits"]
        es.search(pit={"id": pit, "keep_alive": "1m"}, sort=[{"_shard_doc": "asc"}], size=1,
                  search_after=hits[0]["sort"])
    finally:
        es.close_point_in_time(id=pit)
    return "point in time + search_after paging"


def _security(es: Elasticsearch, index: str) -> str:
    who = es.security.authenticate()
    lic = es.license.get()["license"]
    _check(lic["status"] == "active" and lic["type"] in {"trial", "platinum", "enterprise"},
           f"license {lic['type']} ({lic['status']}) has no security features; an active trial, platinum or "
           f"enterprise license is needed")
    return f"authenticated as {who['username']}; license {lic['type']} ({lic['status']})"


def _dls_api_key(es: Elasticsearch, index: str) -> str:
    key = es.security.create_api_key(name=f"atlas-probe-{uuid.uuid4().hex[:8]}", expiration="5m", role_descriptors={
        "probe": {"indices": [{"names": [index], "privileges": ["read"], "query": {"bool": {"should": [
            {"term": {"user_id": "alice"}}, {"bool": {"must_not": {"exists": {"field": "user_id"}}}}]}}}]}})
    user = es.options(api_key=key["encoded"])
    try:
        ids = sorted(h["_id"] for h in user.search(index=index, query={"match_all": {}})["hits"]["hits"])
    finally:
        es.security.invalidate_api_key(ids=[key["id"]], owner=True)
    _check(ids == ["a", "c"], f"the DLS key saw {ids}, expected ['a', 'c']")
    return "an API key whose role has a DLS query sees only its own and the shared documents"


def _raw(method: str, path: str, body: dict | None = None) -> Callable[[Elasticsearch, str], str]:
    def run(es: Elasticsearch, index: str) -> str:
        resp = es.perform_request(method, path.format(index=index), headers=JSON, body=body)
        return f"{method} {path} answered {resp.meta.status}"
    return run


def _painless(es: Elasticsearch, index: str) -> str:
    es.update(index=index, id="a", script={"source": "ctx._source.n += 1"})
    return "scripted update ran"


def _rrf(es: Elasticsearch, index: str) -> str:
    es.search(index=index, retriever={"rrf": {"retrievers": [{"standard": {"query": {"match_all": {}}}},
                                                             {"standard": {"query": {"match_all": {}}}}]}})
    return "rrf retriever answered"


def _retriever(kind: str, body: dict) -> Callable[[Elasticsearch, str], str]:
    def run(es: Elasticsearch, index: str) -> str:
        es.search(index=index, retriever={kind: body})
        return f"{kind} retriever answered"
    return run


def _semantic_text(es: Elasticsearch, index: str) -> str:
    es.indices.create(index=f"{index}-st", mappings={"properties": {"t": {"type": "semantic_text"}}})
    es.indices.delete(index=f"{index}-st")
    return "semantic_text mapping accepted"


def _ingest(es: Elasticsearch, index: str) -> str:
    es.ingest.simulate(pipeline={"processors": [{"set": {"field": "x", "value": 1}}]}, docs=[{"_source": {}}])
    return "set processor simulated"


#: (name, request shown in the doc, probe, workaround when missing)
PROBES: list[tuple[str, str, Callable[[Elasticsearch, str], str], str]] = [
    ("security + trial license", "GET _security/_authenticate; GET _license", _security, ""),
    ("dense_vector + kNN", "POST idx/_search {knn: {field, query_vector, k, num_candidates}}", _knn, ""),
    ("BM25, built-in analyzers", "POST idx/_analyze {tokenizer: whitespace, filter: [lowercase]}", _analyzers, ""),
    ("function_score (gauss, field_value_factor, filters)", "POST idx/_search {query: {function_score: ...}}",
     _function_score, ""),
    ("_msearch", "POST _msearch (BM25 + kNN)", _msearch, ""),
    ("_bulk", "POST _bulk", _bulk, ""),
    ("partial update with if_seq_no", "POST idx/_update/id?if_seq_no=..&if_primary_term=..", _occ_update, ""),
    ("point in time + search_after", "POST idx/_pit; POST _search {pit, search_after}", _pit, ""),
    ("API key with DLS role descriptor", "POST _security/api_key {role_descriptors: {..query..}}", _dls_api_key, ""),
    ("language analyzers other than english", "POST idx/_analyze {analyzer: french}", _language_analyzers,
     "`english` (stemming, stop words) comes from the atlas-analysis plugin; Atlas's text uses it, plus a "
     "whitespace/lowercase subfield for exact tokens"),
    ("Painless scripts", "POST idx/_update/id {script: ...}", _painless,
     "decay, use boost and priors as native function_score functions; counters by partial update with if_seq_no"),
    ("rrf retriever", "POST idx/_search {retriever: {rrf: ...}}", _rrf,
     "BM25 and kNN in one _msearch, reciprocal rank fusion in Python (atlas.core.recall)"),
    ("linear retriever", "POST idx/_search {retriever: {linear: ...}}",
     _retriever("linear", {"retrievers": [{"retriever": {"standard": {"query": {"match_all": {}}}}, "weight": 1}]}),
     "client-side fusion (atlas.core.recall)"),
    ("text_similarity_reranker retriever", "POST idx/_search {retriever: {text_similarity_reranker: ...}}",
     _retriever("text_similarity_reranker", {"retriever": {"standard": {"query": {"match_all": {}}}},
                                             "field": "text", "inference_text": "x", "inference_id": "x"}),
     "second stage in Python: a second embedding model, a local cross-encoder or an HTTP rerank endpoint"),
    ("inference API / semantic_text", "PUT idx {mappings: {t: {type: semantic_text}}}", _semantic_text,
     "embeddings computed in Python with local ONNX models (atlas.models.embed)"),
    ("ILM", "GET _ilm/policy", _raw("GET", "/_ilm/policy"),
     "`atlas archive` moves superseded facts with PIT + bulk"),
    ("_reindex", "POST _reindex", _raw("POST", "/_reindex", {"source": {"index": "{index}"}, "dest": {"index": "x"}}),
     "PIT + search_after + _bulk (atlas archive)"),
    ("_update_by_query", "POST idx/_update_by_query", _raw("POST", "/{index}/_update_by_query"),
     "search, then partial updates with if_seq_no in one _bulk"),
    ("_delete_by_query", "POST idx/_delete_by_query", _raw("POST", "/{index}/_delete_by_query",
                                                         {"query": {"match_none": {}}}),
     "search ids, then _bulk deletes; tests drop whole index prefixes"),
    ("ingest processors", "POST _ingest/pipeline/_simulate {processors: [set]}", _ingest,
     "documents are complete when Atlas writes them (timestamps, owner, vectors set in Python)"),
]


def probe(es: Elasticsearch) -> list[Capability]:
    """Run every probe in a scratch index that is dropped afterwards."""
    index = f"atlas-probe-{uuid.uuid4().hex[:8]}"
    _index_fixture(es, index)
    results = []
    try:
        for name, request, check, workaround in PROBES:
            try:
                results.append(Capability(name, request, True, check(es, index), workaround))
            except (ApiError, ProbeFailed) as exc:
                reason = getattr(exc, "message", None) or str(exc)
                results.append(Capability(name, request, False, reason.splitlines()[0][:160], workaround))
    finally:
        es.indices.delete(index=f"{index},{index}-st", ignore_unavailable=True)  # by name: wildcards are refused
    return results


def render_markdown(results: list[Capability]) -> str:
    """The capability table of docs/elasticsearch.md."""
    rows = ["| capability | supported | checked by | Atlas without it |", "|---|---|---|---|"]
    rows += [f"| {c.name} | {'yes' if c.supported else 'no'} | `{c.request}` | "
             f"{c.workaround if not c.supported else ''} |" for c in results]
    return "\n".join(rows)
