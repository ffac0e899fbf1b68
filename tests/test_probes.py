"""Security probes against the real cluster: one test per probe class, kept as a regression gate.

Alice attacks bob's memory with raw Elasticsearch requests through her own DLS key (the server-side
credential: tenants hold Atlas tokens, never this key, so these probes test the second wall of
defence in depth), then through the Python API and the MCP tools. Each probe shows, where it is
cheap, that it *would* find bob with the service client (no DLS): the probe can fail, the guard is
what stops it.

Two tenants calling MCP tools at the same moment, many times over, is probed by
tests/test_tokens.py::test_concurrent_tenants_stay_apart (not repeated here). The known DLS limit on
term statistics (`_termvectors`, refused to the key; BM25's IDF in its scores) is recorded in tests/test_tokens.py.

One store, written once for the module: alice and bob each own memories (bob's carry the marker
"zanzibar"), the catalog holds one ownerless item; keys, tokens and secrets live in a temporary folder
and die with the prefix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx
import pytest
from elasticsearch import ApiError, Elasticsearch

from atlas import constants as C
from atlas.core.documents import build_document
from atlas.core.errors import NotFound, ValidationError
from atlas.core.memory import bulk_load, forget_memory, write_memory
from atlas.core.recall import recall
from atlas.core.schemas import all_indices, index_name
from atlas.core.store import Store
from atlas.security import tokens
from atlas.serve.mcp_server import BackgroundServer, call_remote, create_app
from tests.test_mcp import run

MARKER = "zanzibar"
ALICE = {"semantic": "Alice's hub is called Beacon and her lantern is blue",
         "episodic": "Alice asked which lantern to take camping"}
BOB = {"semantic": f"Bob's hub is called Lantern, for project {MARKER}",
       "episodic": f"Bob said the {MARKER} lantern code is 4471"}
CATALOG = ("Lumio Lantern", "Lumio Lantern smart lamp with a camping mode")


@dataclass
class World:
    store: Store
    alice: Elasticsearch  # alice's DLS client (KeyReader), what the server reads her memory with
    secrets: dict[str, str]  # Atlas tokens
    alice_ids: set[str]
    bob_ids: dict[str, str]  # memory type -> id
    catalog_id: str
    other_index: str  # an index of another prefix, with a document of bob

    @property
    def bob_semantic(self) -> str:
        return self.bob_ids["semantic"]


@pytest.fixture(scope="module")
def world(module_store: Store, tmp_path_factory) -> Iterator[World]:
    store = module_store
    store.settings = replace(store.settings, home=tmp_path_factory.mktemp("probes"))
    secrets = {user: tokens.create_user(store, user).secret for user in ("alice", "bob")}
    alice_ids = {write_memory(store, "alice", text, t, **({"fact_type": "device"} if t == "semantic" else {}))
                 for t, text in ALICE.items()}
    bob_ids = {t: write_memory(store, "bob", text, t, **({"fact_type": "device"} if t == "semantic" else {}))
               for t, text in BOB.items()}
    [catalog_id] = bulk_load(store, [build_document(None, CATALOG[1], "catalog", store.now(), title=CATALOG[0])],
                             progress=False)
    other = f"{store.prefix}x-semantic"  # a longer prefix: `prefix-*` style patterns must not reach it
    store.es.index(index=other, document={"user_id": "bob", "text": f"{MARKER} in another prefix"}, refresh=True)
    store.es.indices.refresh(index=store.indices)
    try:
        yield World(store, store.read_client("alice"), secrets, alice_ids, bob_ids, catalog_id, other)
    finally:
        store.es.indices.delete(index=other, ignore_unavailable=True)


def seen(hits: list[dict]) -> set[str | None]:
    """Owners of the hits; None only for the catalog's ownerless items."""
    return {hit["_source"].get("user_id") for hit in hits}


def assert_alice_only(w: World, hits: list[dict]) -> None:
    """Only alice's documents and the catalog's: no owner but alice, no index outside the prefix, no marker."""
    assert seen(hits) <= {"alice", None}, hits
    assert all(hit["_index"] in all_indices(w.store.prefix) for hit in hits), [h["_index"] for h in hits]
    assert all(hit["_index"] == index_name(w.store.prefix, "catalog") for hit in hits
               if hit["_source"].get("user_id") is None)
    assert MARKER not in str(hits)


def search_all(client: Elasticsearch, index: str, query: dict | None = None, **kwargs) -> list[dict]:
    return client.search(index=index, query=query or {"match_all": {}}, size=100, **kwargs)["hits"]["hits"]


# --- 1. wildcards, other prefixes, system indices ----------------------------------------------------


def test_wildcards_and_system_indices_show_nothing_of_bob(world):
    w, prefix = world, world.store.prefix
    service = search_all(w.store.es, f"{prefix}*", expand_wildcards="all")
    assert "bob" in seen(service) and any(h["_index"] == w.other_index for h in service), "the probe can see bob"
    for pattern in ("*", "_all", "*,.*", f"{prefix}-*", f"{prefix}*", "t-*", f"{prefix}x-*", ".security*", ".*",
                    ".security-7,*", "-nothing,*"):
        try:
            hits = search_all(w.alice, pattern, expand_wildcards="all", ignore_unavailable=True)
        except ApiError as exc:  # refused outright is as good as empty
            assert exc.meta.status in (403, 404), (pattern, exc)
            continue
        assert_alice_only(w, hits)
        assert not any(h["_index"].startswith(".") for h in hits), pattern
    for index in (".security", ".security-7", w.other_index, f"{prefix}-state"):
        with pytest.raises(ApiError) as refused:
            w.alice.search(index=index, query={"match_all": {}})
        assert refused.value.meta.status in (403, 404), index
    assert w.alice.count(index="*")["count"] == len(w.alice_ids) + 1


# --- 2. get, _mget, _explain ----------------------------------------------------------------------------


def test_get_mget_explain_of_bobs_id_are_refused(world):
    """A user's key may only search (`C.USER_KEY_PRIVILEGES`): get, _mget and _explain are refused outright, even of
    alice's own id (DLS made them answer "not found" for bob's, when the key had all of `read`)."""
    w = world
    semantic = index_name(w.store.prefix, "semantic")
    assert w.store.es.get(index=semantic, id=w.bob_semantic)["found"], "the probe can see bob"
    alices = next(iter(w.alice_ids))
    for probe in (lambda: w.alice.get(index=semantic, id=w.bob_semantic),
                  lambda: w.alice.get_source(index=semantic, id=w.bob_semantic),
                  lambda: w.alice.get(index=semantic, id=alices),
                  lambda: w.alice.mget(docs=[{"_index": index_name(w.store.prefix, t), "_id": i}
                                             for t, i in w.bob_ids.items()] + [{"_index": w.other_index, "_id": "x"}]),
                  lambda: w.alice.explain(index=semantic, id=w.bob_semantic, query={"match_all": {}})):
        with pytest.raises(ApiError) as refused:
            probe()
        assert refused.value.meta.status == 403 and MARKER not in str(refused.value)
    assert w.store.es.explain(index=semantic, id=w.bob_semantic, query={"match_all": {}})["matched"]


# --- 3. aggregations ----------------------------------------------------------------------------------


def test_aggregations_count_no_document_of_bob(world):
    """No bucket names or counts bob. With `min_doc_count: 0` a terms aggregation also lists terms that no
    matching document holds: the service client, filtered to alice, still gets a `bob` bucket with count 0
    (the probe can fail). Elasticsearch's security limitations warn that under DLS "a user ... could still
    learn about field names and terms that only exist in inaccessible documents, and count how many
    inaccessible documents contain a given term" (term statistics: see tests/test_tokens.py). Through a
    DLS key, Elasticsearch 9.2 lists only terms of visible documents, so bob's id does not leak this way;
    should a future version list it (count 0), that is the documented limit tenants never reach, since they
    hold tokens, not keys: record it here rather than drop the probe."""
    w = world
    aggs = {"owners": {"terms": {"field": "user_id", "size": 100}},
            "all_owners": {"terms": {"field": "user_id", "size": 100, "min_doc_count": 0}},
            "types": {"terms": {"field": "memory_type", "size": 100, "min_doc_count": 0}},
            "bob": {"filter": {"term": {"user_id": "bob"}}},
            "cardinality": {"cardinality": {"field": "user_id"}}}
    service = w.store.es.search(index=w.store.indices, size=0, aggs=aggs)["aggregations"]
    assert {b["key"]: b["doc_count"] for b in service["owners"]["buckets"]} == {"alice": 2, "bob": 2}
    filtered = w.store.es.search(index=w.store.indices, size=0, query={"term": {"user_id": "alice"}},
                                 aggs=aggs)["aggregations"]
    assert {b["key"]: b["doc_count"] for b in filtered["all_owners"]["buckets"]} == {"alice": 2, "bob": 0}
    mine = w.alice.search(index=w.store.indices, size=0, aggs=aggs)["aggregations"]
    assert {b["key"]: b["doc_count"] for b in mine["owners"]["buckets"]} == {"alice": 2}
    assert mine["bob"]["doc_count"] == 0 and mine["cardinality"]["value"] == 1
    assert {b["key"]: b["doc_count"] for b in mine["all_owners"]["buckets"]} == {"alice": 2}, \
        "min_doc_count 0 through the DLS key names another user"
    types = {b["key"]: b["doc_count"] for b in mine["types"]["buckets"]}
    assert types == {"semantic": 1, "episodic": 1, "catalog": 1}, types


# --- 4. scroll and point in time --------------------------------------------------------------------------


def scroll_all(client: Elasticsearch, index: str) -> list[dict]:
    page = client.search(index=index, query={"match_all": {}}, size=1, scroll="1m")
    hits, scroll_id = list(page["hits"]["hits"]), page["_scroll_id"]
    try:
        for _ in range(50):
            page = client.scroll(scroll_id=scroll_id, scroll="1m")
            scroll_id = page["_scroll_id"]
            if not page["hits"]["hits"]:
                break
            hits.extend(page["hits"]["hits"])
    finally:
        client.clear_scroll(scroll_id=scroll_id)
    return hits


def pit_all(client: Elasticsearch, index: str) -> list[dict]:
    pit = client.open_point_in_time(index=index, keep_alive="1m")["id"]
    hits: list[dict] = []
    after = None
    try:
        for _ in range(50):
            page = client.search(pit={"id": pit, "keep_alive": "1m"}, size=1, sort=["_shard_doc"],
                                 query={"match_all": {}}, **({"search_after": after} if after else {}))["hits"]["hits"]
            if not page:
                break
            hits.extend(page)
            after = page[-1]["sort"]
    finally:
        client.close_point_in_time(id=pit)
    return hits


def test_a_key_pages_neither_by_scroll_nor_by_point_in_time(world):
    """A search may open a scroll, whose first page holds only alice's documents; its next page, and a point in time,
    are refused to a key that may only search (bob's scroll id alike)."""
    w = world
    assert "bob" in seen(scroll_all(w.store.es, w.store.indices)), "the probe can see bob"
    assert "bob" in seen(pit_all(w.store.es, w.store.indices))
    first = w.alice.search(index=w.store.indices, query={"match_all": {}}, size=100, scroll="1m")
    assert_alice_only(w, first["hits"]["hits"])
    assert {h["_id"] for h in first["hits"]["hits"]} == w.alice_ids | {w.catalog_id}
    bobs = w.store.es.search(index=w.store.indices, query={"match_all": {}}, size=1, scroll="1m")
    for probe in (lambda: w.alice.scroll(scroll_id=first["_scroll_id"], scroll="1m"),
                  lambda: w.alice.scroll(scroll_id=bobs["_scroll_id"], scroll="1m"),
                  lambda: w.alice.open_point_in_time(index=w.store.indices, keep_alive="1m")):
        with pytest.raises(ApiError) as refused:
            probe()
        assert refused.value.meta.status == 403 and MARKER not in str(refused.value)
    w.store.es.clear_scroll(scroll_id=bobs["_scroll_id"])


# --- 5. top-level kNN -----------------------------------------------------------------------------------


def test_knn_without_a_filter_finds_only_alice_and_the_catalog(world):
    w = world
    vector = w.store.embedder.embed_queries([BOB["semantic"]])[0].tolist()
    knn = {"field": "embedding", "query_vector": vector, "k": 50, "num_candidates": 100}
    service = search_all(w.store.es, w.store.indices, query=None, knn=knn, ignore_unavailable=True)
    assert service and service[0]["_source"]["user_id"] == "bob", "the probe can see bob"
    hits = w.alice.search(index=w.store.indices, knn=knn, size=100, ignore_unavailable=True)["hits"]["hits"]
    assert_alice_only(w, hits)
    assert {h["_id"] for h in hits} == w.alice_ids | {w.catalog_id}


# --- 6. query DSL that tries to widen the filter -----------------------------------------------------------


WIDENING = {
    "should match_all": {"bool": {"should": [{"match_all": {}}, {"term": {"user_id": "bob"}}]}},
    "ids": {"ids": {"values": ["BOB_IDS"]}},
    "exists user_id": {"exists": {"field": "user_id"}},
    "term bob": {"term": {"user_id": "bob"}},
    "not alice": {"bool": {"must_not": [{"term": {"user_id": "alice"}}]}},
    "wildcard": {"wildcard": {"user_id": {"value": "*"}}},
    "prefix": {"prefix": {"user_id": "b"}},
    "range": {"range": {"user_id": {"gte": ""}}},
    "query_string all": {"query_string": {"query": "*:*"}},
    "query_string bob": {"query_string": {"query": f"user_id:bob OR {MARKER} OR _index:*"}},
    "simple_query_string": {"simple_query_string": {"query": f"{MARKER} | bob", "fields": ["*"]}},
    "constant_score": {"constant_score": {"filter": {"match_all": {}}, "boost": 1e6}},
    "dis_max": {"dis_max": {"queries": [{"match": {"text": MARKER}}, {"match_all": {}}]}},
    "function_score": {"function_score": {"query": {"match_all": {}}, "boost_mode": "replace",
                                          "functions": [{"weight": 5}]}},
    "boosting": {"boosting": {"positive": {"match_all": {}}, "negative": {"term": {"user_id": "alice"}},
                              "negative_boost": 0.1}},
    "match marker": {"match": {"text": MARKER}},
}


@pytest.mark.parametrize("name", sorted(WIDENING))
def test_widening_queries_still_find_only_alices(world, name):
    w = world
    query = WIDENING[name]
    if name == "ids":
        query = {"ids": {"values": list(w.bob_ids.values())}}
    service = search_all(w.store.es, w.store.indices, query)
    if name not in ("not alice",):  # catalog only would be expected without bob's documents
        assert "bob" in seen(service), "the probe can see bob"
    hits = search_all(w.alice, w.store.indices, query, post_filter={"match_all": {}}, allow_partial_search_results=True)
    assert_alice_only(w, hits)


# --- 7. terms lookup and more_like_this of bob's document --------------------------------------------------


def test_terms_lookup_and_more_like_this_of_bobs_id_reveal_nothing(world):
    """A terms lookup reads bob's document as the caller; `more_like_this` reads its terms. Alice owns a
    `device` fact and a text about a lantern, like bob's: a lookup or a `like` that read his document would
    bring hers back (the service client shows it does). Elasticsearch lists terms lookup among the queries
    DLS does not support: a refusal passes too."""
    w = world
    semantic = index_name(w.store.prefix, "semantic")
    lookup = {"terms": {"fact_type": {"index": semantic, "id": w.bob_semantic, "path": "fact_type"}}}
    owner_lookup = {"terms": {"user_id": {"index": semantic, "id": w.bob_semantic, "path": "user_id"}}}
    mlt = {"more_like_this": {"fields": ["text"], "like": [{"_index": semantic, "_id": w.bob_semantic}],
                              "min_term_freq": 1, "min_doc_freq": 1}}
    assert "alice" in seen(search_all(w.store.es, w.store.indices, lookup)), "the probe can read bob's document"
    assert "alice" in seen(search_all(w.store.es, w.store.indices, mlt))
    assert "bob" in seen(search_all(w.store.es, w.store.indices, owner_lookup))
    for query in (lookup, owner_lookup, mlt):
        try:
            hits = search_all(w.alice, w.store.indices, query)
        except ApiError as exc:
            assert exc.meta.status in (400, 403, 404) and MARKER not in str(exc), exc
            continue
        assert hits == [], (query, hits)


# --- 8. crafted user ids and document ids through the Python API ----------------------------------------


CRAFTED_USERS = ["*", "../", "../bob", "bob/../alice", "a" * 65, "a" * 100_000, "böb", "ボブ", "bob\x00",
                 '{"match_all":{}}', 'alice"}},{"match_all":{}}]}}', "alice OR bob", "Bob", " bob", "", None, 7]
CRAFTED_DOC_IDS = ["*", "../", "../../etc/passwd", "a" * 65, "a" * 100_000, "idé", "ボブ", '{"ids":["x"]}',
                   "a,b", "x y", "", None, 7]


def test_crafted_user_and_document_ids_are_refused(world):
    w = world
    for user in CRAFTED_USERS:
        with pytest.raises(ValidationError):
            recall(w.store, user, "lantern")
        with pytest.raises(ValidationError):
            write_memory(w.store, user, "I own everything")
        with pytest.raises(ValidationError):
            forget_memory(w.store, user, w.bob_semantic)
    for doc_id in CRAFTED_DOC_IDS:
        with pytest.raises(ValidationError):
            forget_memory(w.store, "alice", doc_id)
    for doc_id in ("bob", "alice", "_all", "-", *w.bob_ids.values(), w.catalog_id):  # well-formed, not alice's
        with pytest.raises(NotFound):
            forget_memory(w.store, "alice", doc_id)
    for query in ("*", f'{{"match_all":{{}}}} {MARKER}', "user_id:bob", f"../bob {MARKER}", "ボブ lantern"):
        hits = recall(w.store, "alice", query, k=50, include_superseded=True).hits
        assert {h.user_id for h in hits} <= {"alice", None} and MARKER not in str(hits), (query, hits)
    w.store.es.indices.refresh(index=w.store.indices)
    assert w.store.es.count(index=w.store.indices, query={"term": {"user_id": "bob"}})["count"] == 2
    assert w.store.es.count(index=w.store.indices)["count"] == 5, "a crafted id wrote or deleted something"


# --- 9. huge k and huge text -------------------------------------------------------------------------------


def test_huge_k_and_huge_text_are_clear_errors(world):
    w = world
    for k in (C.MAX_K + 1, 10**9, 10**30, -1, 0):
        with pytest.raises(ValidationError, match="k"):
            recall(w.store, "alice", "lantern", k=k)
    with pytest.raises(ValidationError, match="limit"):
        recall(w.store, "alice", "lantern " * 100_000)
    with pytest.raises(ValidationError, match="limit"):
        write_memory(w.store, "alice", "x" * (C.MAX_TEXT_CHARS + 1))
    assert len(recall(w.store, "alice", "lantern", k=C.MAX_K).hits) == 3

    with BackgroundServer(create_app(w.store)) as server:
        url, token = server.url("alice"), w.secrets["alice"]
        calls = [("recall_memory", {"query": "lantern", "k": 10**9}),
                 ("recall_memory", {"query": "lantern", "k": 10**30}),
                 ("recall_memory", {"query": "lantern " * 100_000, "k": 5}),
                 ("write_memory", {"text": "x" * (C.MAX_TEXT_CHARS + 1), "memory_type": "semantic"})]
        results = [run(call_remote, url, token, name, args) for name, args in calls]
        after = run(call_remote, url, token, "recall_memory", {"query": "what is my hub called", "k": 3})
        health = httpx.get(url + "/info")
    texts = [r.content[0].text for r in results]
    assert all(r.is_error for r in results), texts
    assert all(t.startswith("ValidationError") and "Traceback" not in t and len(t) < 2_000 for t in texts), texts
    assert not after.is_error and {m["text"] for m in after.structured_content["memories"]} >= {ALICE["semantic"]}
    assert health.status_code == 200, "the server did not survive"
    w.store.es.indices.refresh(index=w.store.indices)
    assert w.store.es.count(index=w.store.indices)["count"] == 5
