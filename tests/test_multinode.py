"""Atlas on the local three-node cluster (issue 20): per-user routing, node loss, rolling restart.

Runs only against `make test-cluster` (ATLAS_ES_NODES=3: nodes on 127.0.0.1:9201-9203); under `make test`
every test here is skipped. The fault tests stop and start nodes of that cluster only (`cluster.down` and
`cluster.up` with node numbers, inside its own folder), never the single node. Each is bounded: a node
restart waits at most `cluster.START_TIMEOUT_S`, a writer stream stops after `ACKED` writes past a fault.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from elasticsearch import Elasticsearch

from atlas.core.config import Settings, load_settings
from atlas.core.connection import AtlasClient, client_options
from atlas.core.documents import build_document
from atlas.core.memory import bulk_load, forget_memory, write_episode, write_memory
from atlas.core.recall import recall
from atlas.core.store import Store
from atlas.core.supersession import supersede
from atlas.notebook.inspector import shards_searched, user_shards
from atlas.ops import cluster
from atlas.stack import open_store

from .conftest import NOW, make_prefix

SETTINGS = load_settings()
pytestmark = pytest.mark.skipif(not SETTINGS.local or SETTINGS.es_nodes < 3,
                                reason="needs the local three-node cluster: `make test-cluster`")

USERS = ("alice", "bob", "carol", "dave", "erin", "frank")
#: Writes acknowledged after a fault (a node killed or stopped) before the node comes back.
ACKED = 20
RACES = 4


def pinned(settings: Settings, url: str) -> Elasticsearch:
    """A service client that talks to one node only."""
    return AtlasClient(**{**client_options(settings), "hosts": [url]}, request_timeout=60, max_retries=0)


def health(es: Elasticsearch, **wait: str) -> str:
    return es.cluster.health(timeout="90s", **wait)["status"]


@pytest.fixture(scope="module")
def cstore(es) -> Iterator[Store]:
    """One prefix on the cluster, every user with a few memories; the cluster is green at start and end."""
    store = open_store(make_prefix("multinode"), es=es, now=lambda: NOW)
    assert health(es, wait_for_status="green", wait_for_nodes=str(SETTINGS.es_nodes)) == "green"
    bulk_load(store, [build_document(None, "Error E-0x41: the hub lost its Zigbee coordinator", "catalog", NOW)],
              refresh=True)
    for user in USERS:
        write_memory(store, user, f"{user}'s hub is on Zigbee channel {len(user) + 11}", "semantic")
        for turn in range(3):
            write_episode(store, user, f"{user} asks about the hub, turn {turn}")
    yield store
    cluster.up(SETTINGS)  # whatever a failed test left stopped
    health(es, wait_for_status="green")
    store.drop()


# --- layout and routing ---------------------------------------------------------------------------------


def test_memory_indices_have_configured_shards_and_replicas_the_catalog_one_shard(cstore):
    found = cstore.es.indices.get_settings(index=cstore.indices, name="index.number_of_*", flat_settings=True)
    layout = {name.removeprefix(f"{cstore.prefix}-"): (int(s["settings"]["index.number_of_shards"]),
                                                      int(s["settings"]["index.number_of_replicas"]))
              for name, s in found.items()}
    expected = (SETTINGS.shards, SETTINGS.replicas)
    assert layout == {"episodic": expected, "semantic": expected, "procedural": expected,
                      "archive": expected, "catalog": (1, SETTINGS.replicas)}
    assert SETTINGS.shards > 1 and SETTINGS.replicas >= 1


def test_every_user_document_is_routed_by_its_owner(cstore):
    hits = cstore.es.search(index=cstore.indices, size=1000, source_includes=["user_id"],
                            query={"exists": {"field": "user_id"}})["hits"]["hits"]
    assert len(hits) == 4 * len(USERS)
    assert all(hit["_routing"] == hit["_source"]["user_id"] for hit in hits)
    shards = {}
    for user in USERS:
        rows = user_shards(cstore, user)
        shard = {row["shard"] for row in rows if row["index"] == f"{cstore.prefix}-episodic"}
        assert len(shard) == 1  # primary and replica of one shard
        copies = {row["node"] for row in rows if row["index"] == f"{cstore.prefix}-episodic"}
        assert len(copies) == 1 + SETTINGS.replicas  # never two copies on one node
        shards[user] = shard.pop()
        # That shard alone holds all of the user's episodes.
        only_there = cstore.es.count(index=f"{cstore.prefix}-episodic", preference=f"_shards:{shards[user]}",
                                     query={"term": {"user_id": user}})["count"]
        assert only_there == 3
    assert len(set(shards.values())) > 1, "six users should not all hash to one shard"


def test_a_recall_reads_one_shard_per_index_and_finds_the_same(cstore):
    result = recall(cstore, "alice", "which zigbee channel is my hub on?", mode="hybrid", k=20, touch=False)
    assert result.hits and {h.user_id for h in result.hits} <= {"alice", None}
    everywhere = recall(cstore, "alice", "which zigbee channel is my hub on?", mode="hybrid", k=20, touch=False,
                        routed=False)
    assert everywhere.ids() == result.ids()
    routed, unrouted = (shards_searched(cstore, "alice", r.requests) for r in (result, everywhere))
    assert [s["routing"] for s in routed] == ["alice", "alice"] and [s["routing"] for s in unrouted] == ["", ""]
    for with_routing, without in zip(routed, unrouted, strict=True):
        assert with_routing["indices"] == 4  # three memory indices + the catalog
        # One shard per memory index plus the catalog's one, against every shard of every index.
        assert with_routing["shards asked"] == with_routing["answered"] == 4
        assert without["shards asked"] == without["answered"] == 3 * SETTINGS.shards + 1


def test_ownership_updates_mget_and_deletes_carry_the_routing(cstore):
    """prove_ownership, update_owned (use counts), the second stage's mget and forget, on three shards."""
    fact = write_memory(cstore, "bob", "Bob's thermostat runs firmware 4.2", "semantic")
    before = recall(cstore, "bob", "thermostat firmware", k=3)  # hybrid+rerank: the mget, and touch
    assert before.hits[0].id == fact and before.second_stage is not None
    newer = supersede(cstore, "bob", [fact], "Bob's thermostat runs firmware 4.3")
    after = recall(cstore, "bob", "thermostat firmware", k=3, touch=False)
    assert after.hits[0].id == newer and fact not in after.ids()
    old = cstore.es.get(index=f"{cstore.prefix}-semantic", id=fact, routing="bob")["_source"]
    assert old["superseded_by"] == newer and old["use_count"] == 1
    forget_memory(cstore, "bob", newer)
    assert not cstore.es.exists(index=f"{cstore.prefix}-semantic", id=newer, routing="bob")
