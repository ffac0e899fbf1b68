"""Hubness: small talk that resembles the rest of a user's memory is held against it, on every write path."""

from __future__ import annotations

import numpy as np
import pytest

from atlas import constants as C
from atlas.core import hubness as hub
from atlas.core.documents import build_document, build_neighbours_body, embed_documents
from atlas.core.errors import ValidationError
from atlas.core.hubness import attach_hubness, build_hubness_query, hubness, refresh_hubness
from atlas.core.memory import bulk_load, write_episode, write_memory
from atlas.core.recall import Tuning, recall
from atlas.core.schemas import build_sole_owner_filter
from atlas.notebook.display import hits_table

SMALL_TALK = ("Wow, Kai, that's awesome! So happy for you and your family!",
              "That's great, Kai! Your family sounds amazing, so happy for you.",
              "Awesome news, Kai! Love hearing about your family, it makes me happy.",
              "So happy for you, Kai! Family time is the best, that's awesome.",
              "That's so cool, Kai! Your family is awesome, glad you're happy.")
CAMPING = "Kai: We went camping at the beach with the kids last weekend."
OTHERS = ("Kai: I signed up for a pottery class on Tuesdays.", "Kai: My car needs new brake pads before winter.")


def test_hubness_is_the_mean_cosine_of_the_nearest_others():
    vectors = np.asarray([[1, 0, 0], [0.9, 0.1, 0], [0.8, 0.2, 0], [0, 0, 1]], dtype=np.float32)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cos = unit @ unit.T
    got = hubness(vectors, neighbours=2)
    assert got[0] == pytest.approx((cos[0, 1] + cos[0, 2]) / 2, abs=1e-6)
    assert got[3] == pytest.approx((cos[3, 1] + cos[3, 2]) / 2, abs=1e-6)  # its two best, both poor
    assert got[:3].min() > got[3]
    # fewer others than neighbours: all of them; one row alone has no neighbour
    assert hubness(vectors[:2], neighbours=30) == pytest.approx([cos[0, 1], cos[0, 1]], abs=1e-6)
    assert hubness(vectors[:1]).tolist() == [0.0]


def test_hubness_in_blocks_equals_all_at_once(monkeypatch):
    vectors = np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32)
    whole = hubness(vectors, neighbours=5)
    monkeypatch.setattr(hub, "_BLOCK", 7)
    assert hubness(vectors, neighbours=5) == pytest.approx(whole, abs=1e-6)


def test_hubness_query_is_one_owner_or_the_catalog():
    # one user's as the recall's code filter reads them: a planted document naming a second owner is nobody's
    assert build_hubness_query("kai")["bool"]["filter"] == [build_sole_owner_filter("kai")]
    catalog = build_hubness_query(None)["bool"]
    assert catalog["filter"] == [] and {"exists": {"field": "user_id"}} in catalog["must_not"]
    with pytest.raises(ValidationError):
        build_hubness_query("../kai")


def test_small_talk_gives_way_to_the_specific_turn(store):
    """Five turns of small talk outrank the one that answers without the hubness penalty. Each write gives its memory
    a hubness among the memories its owner has then, so as soon as it is written the default second stage puts the
    answer above every small talk turn with a known hubness (the owner's first memory has none: no neighbours yet).
    Consolidation's refresh recomputes them all together, closer to one another: the answer still rises, not to
    the top. Finding (issue 35): with stop words searched in `text.exact` ("with") the answer came first in both
    states; without them only "Kai" is left to BM25 against the small talk's "Kai" and "family"."""
    for text in (*SMALL_TALK, CAMPING, *OTHERS):
        write_episode(store, "kai", text)
    write_memory(store, "ana", "Ana went camping at the beach too", "semantic")
    store.es.indices.refresh(index=store.indices)
    question = "What activities does Kai do with his family?"

    def texts(**options) -> list[str]:
        return [hit.text for hit in recall(store, "kai", question, k=8, **options).hits]

    off = texts(tuning=Tuning(hub_penalty=0))
    assert off.index(CAMPING) >= len(SMALL_TALK)  # without the penalty the small talk comes first
    for when in ("written", "refreshed"):
        result = recall(store, "kai", question, k=8)
        scores = {hit.text: hit.hubness for hit in result.hits}
        assert min(scores[text] for text in SMALL_TALK[1:]) > scores[CAMPING], when
        ranked = [hit.text for hit in result.hits]
        assert ranked.index(CAMPING) < off.index(CAMPING) and C.HUB_PENALTY > 0, when
        if when == "written":
            assert scores[SMALL_TALK[0]] is None
            assert all(ranked.index(CAMPING) < ranked.index(text) for text in SMALL_TALK[1:])
        assert "hub" in hits_table(result).columns
        assert refresh_hubness(store, "kai") == len(SMALL_TALK) + 1 + len(OTHERS)  # only kai's memories
    assert texts(tuning=Tuning(hub_penalty=0)) == off
    ana = store.es.search(index=store.indices, query={"term": {"user_id": "ana"}})["hits"]["hits"][0]["_source"]
    assert ana["hubness"] is None, "an owner's first memory has no neighbours: its hubness is unknown (null), not 0"


def test_every_write_path_writes_hubness(store):
    """A single write computes a memory's hubness from its owner's memories as they stand (the mean cosine of its
    nearest ones, as `hubness` computes it); `bulk_load` computes it among the load's documents."""
    first = write_episode(store, "kai", SMALL_TALK[0])
    second = write_memory(store, "kai", SMALL_TALK[1], "episodic")
    store.es.indices.refresh(index=store.indices)
    sources = {hit["_id"]: hit["_source"] for hit in store.es.search(
        index=store.indices, query={"term": {"user_id": "kai"}}, source={"exclude_vectors": False})["hits"]["hits"]}
    vectors = np.asarray([sources[first]["rerank_embedding"], sources[second]["rerank_embedding"]], dtype=np.float32)
    assert sources[first]["hubness"] is None  # stored as null, so that an export carries it as it is
    assert sources[second]["hubness"] == pytest.approx(float(hubness(vectors)[1]), abs=1e-4)
    from datetime import UTC, datetime

    loaded = bulk_load(store, [build_document("lea", text, "episodic", datetime(2026, 12, 1, tzinfo=UTC))
                               for text in SMALL_TALK[:3]], progress=False)
    got = store.es.mget(index=f"{store.prefix}-episodic", ids=loaded, routing="lea")["docs"]
    assert all(isinstance(doc["_source"].get("hubness"), float) for doc in got)


def test_a_writes_neighbours_come_back_as_vectors_only(store):
    """The neighbours' search of a write (`build_neighbours_body`) reads the second model's vectors as doc values and
    no stored field, not even `_id` (reading the stored-field blocks of 100 hits was half its server time), and the
    client parses the answer, 100 vectors of floats, with orjson (four times faster than the standard library)."""
    for text in OTHERS:
        write_episode(store, "kai", text)
    vector = store.passage_embedders["embedding"].embed_passages([CAMPING])[0]
    hits = store.es.search(index=f"{store.prefix}-episodic", routing="kai",
                           **build_neighbours_body("kai", vector))["hits"]["hits"]
    assert len(hits) == len(OTHERS)
    assert all(set(hit) == {"_index", "_score", "fields"} and list(hit["fields"]) == ["rerank_embedding"]
               for hit in hits), hits[0].keys()
    assert type(store.es.transport.serializers.get_serializer("application/json")).__name__ == "OrjsonSerializer"


def test_a_load_attaches_hubness_per_owner_before_indexing(store):
    """A load computes hubness among each owner's own documents (the catalog's among the catalog's); a superseded
    fact gets none, since recall never shows it; a document that carries one (an import's, even null) keeps it."""
    from datetime import UTC, datetime

    now = datetime(2026, 12, 1, tzinfo=UTC)
    docs = [build_document("kai", text, "episodic", now) for text in (*SMALL_TALK, CAMPING)]
    docs += [build_document("ana", "Ana went camping at the beach too", "semantic", now),
             build_document("ana", "Ana lives in Porto", "semantic", now, superseded_by="x"),
             build_document(None, "Camping stove, 2 burners", "catalog", now),
             {**build_document("lea", "Lea's first memory", "episodic", now), "hubness": None},
             {**build_document("lea", "Lea's second memory", "episodic", now), "hubness": 0.5}]
    embed_documents(store, docs)
    attach_hubness(store, docs)
    kai = np.asarray([doc["rerank_embedding"] for doc in docs[:6]], dtype=np.float32)
    assert [doc["hubness"] for doc in docs[:6]] == pytest.approx(hubness(kai).tolist(), abs=1e-5)
    # Alone among their owner's documents: unknown, as a single write's first memory is. It was 0.0, which the
    # second stage reads as "like nothing else", so a fact loaded alone outranked every other (notebook 03).
    assert docs[6]["hubness"] is None and docs[8]["hubness"] is None
    assert "hubness" not in docs[7]
    assert [docs[9]["hubness"], docs[10]["hubness"]] == [None, 0.5]


@pytest.mark.parametrize("penalty", [-1, 11, "1", True, None])
def test_hub_penalty_out_of_range_is_refused(store, penalty):
    with pytest.raises(ValidationError, match="hub_penalty"):
        recall(store, "kai", "anything", tuning=Tuning(hub_penalty=penalty))


def test_a_refresh_that_fails_part_way_says_so(store, monkeypatch):
    """An update the cluster refuses is an AtlasError naming it, not a silent partial refresh."""
    from atlas.core.errors import AtlasError

    for text in SMALL_TALK[:2]:
        write_episode(store, "kai", text)
    refused = [{"update": {"_id": "abc", "error": {"reason": "version conflict"}}}]
    monkeypatch.setattr(hub.helpers, "bulk", lambda *args, **kwargs: (1, refused))
    with pytest.raises(AtlasError, match="1 of 2 memories were not updated .*abc, version conflict"):
        refresh_hubness(store, "kai")
