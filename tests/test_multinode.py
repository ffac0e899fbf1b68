"""Atlas on the local three-node cluster (issue 20): per-user routing, node loss, rolling restart.

Runs only against `make test-cluster` (ATLAS_ES_NODES=3: nodes on 127.0.0.1:9201-9203); under `make test`
every test here is skipped. The fault tests stop and start nodes of that cluster only (`cluster.down` and
`cluster.up` with node numbers, inside its own folder), never the single node. Each is bounded: a node
restart waits at most `cluster.START_TIMEOUT_S`, a writer stream stops after `ACKED` writes past a fault.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest
from elasticsearch import Elasticsearch

from atlas.config import Settings, load_settings
from atlas.core.documents import build_document
from atlas.core.errors import ConflictError
from atlas.core.memory import bulk_load, forget_memory, write_episode, write_memory
from atlas.core.recall import Tuning, recall, record_recall
from atlas.core.store import Store
from atlas.core.supersession import supersede
from atlas.notebook.inspector import shards_searched, user_shards
from atlas.notebook.runner import run_notebook, unique_prefix
from atlas.ops import cluster
from atlas.security.connection import AtlasClient, client_options
from atlas.security.tenancy import stored_key, user_client
from atlas.security.tokens import TokenVerifier, issue_token
from atlas.stack import open_store
from tests.conftest import NOW, make_prefix
from tests.test_notebooks import committed_differences, each_cell_twice, rerun_differences

SETTINGS = load_settings()
pytestmark = pytest.mark.skipif(not SETTINGS.local or SETTINGS.es_nodes < 3,
                                reason="needs the local three-node cluster: `make test-cluster`")

USERS = ("alice", "bob", "carol", "dave", "erin", "frank")
#: Writes acknowledged after a fault (a node killed or stopped) before the node comes back.
ACKED = 8
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
    result = recall(cstore, "alice", "which zigbee channel is my hub on?", mode="hybrid", k=20)
    assert result.hits and {h.user_id for h in result.hits} <= {"alice", None}
    everywhere = recall(cstore, "alice", "which zigbee channel is my hub on?", mode="hybrid", k=20,
                        tuning=Tuning(routed=False))
    assert everywhere.ids() == result.ids()
    routed, unrouted = (shards_searched(cstore, "alice", r.requests) for r in (result, everywhere))
    assert [s["routing"] for s in routed] == ["alice", "alice"] and [s["routing"] for s in unrouted] == ["", ""]
    for with_routing, without in zip(routed, unrouted, strict=True):
        assert with_routing["indices"] == 4  # three memory indices + the catalog
        # One shard per memory index plus the catalog's one, against every shard of every index.
        assert with_routing["shards asked"] == with_routing["answered"] == 4
        assert without["shards asked"] == without["answered"] == 3 * SETTINGS.shards + 1


def test_ownership_updates_mget_and_deletes_carry_the_routing(cstore):
    """prove_ownership, update_owned (use counts), the second stage and forget, on three shards."""
    fact = write_memory(cstore, "bob", "Bob's thermostat runs firmware 4.2", "semantic")
    before = recall(cstore, "bob", "thermostat firmware", k=3)  # hybrid+rerank, then recording the use
    record_recall(cstore, before)
    assert before.hits[0].id == fact and before.second_stage is not None
    newer = supersede(cstore, "bob", [fact], "Bob's thermostat runs firmware 4.3")
    after = recall(cstore, "bob", "thermostat firmware", k=3)
    assert after.hits[0].id == newer and fact not in after.ids()
    old = cstore.es.get(index=f"{cstore.prefix}-semantic", id=fact, routing="bob")["_source"]
    assert old["superseded_by"] == newer and old["use_count"] == 1
    forget_memory(cstore, "bob", newer)
    assert not cstore.es.exists(index=f"{cstore.prefix}-semantic", id=newer, routing="bob")


# --- faults -------------------------------------------------------------------------------------------


class Writers:
    """Threads writing episodes for every user until stopped; each keeps the ids Elasticsearch acknowledged."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.acked: dict[str, list[str]] = {u: [] for u in USERS}
        self.errors: list[Exception] = []
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(u,), daemon=True) for u in USERS[:3]]

    def run(self, user: str) -> None:
        while not self.halt.is_set():
            try:
                self.acked[user].append(write_episode(self.store, user, f"{user} streams {uuid.uuid4().hex}"))
            except Exception as exc:  # an unacknowledged write: counted, not required to survive
                self.errors.append(exc)

    def total(self) -> int:
        return sum(len(ids) for ids in self.acked.values())

    def wait_for(self, more: int) -> None:
        """Until `more` further writes are acknowledged (bounded by the 90 s of `cluster.health`)."""
        target = self.total() + more
        for _ in range(900):
            if self.total() >= target:
                return
            self.halt.wait(0.1)
        raise AssertionError(f"writes stalled at {self.total()}/{target}: {self.errors[-3:]}")

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        for thread in self.threads:
            thread.join(timeout=60)


def missing(store: Store, acked: dict[str, list[str]]) -> list[str]:
    """Acknowledged ids the cluster cannot find, read by id on their owner's shard."""
    store.es.indices.refresh(index=store.indices)
    lost = []
    for user, ids in acked.items():
        if ids:
            docs = store.es.mget(index=f"{store.prefix}-episodic", ids=ids, routing=user, source=False)["docs"]
            lost += [d["_id"] for d in docs if not d["found"]]
    return lost


def test_kill_9_during_writes_loses_no_acknowledged_write_and_recall_answers_while_yellow(cstore):
    victim = 2
    with Writers(cstore) as writers:
        writers.wait_for(ACKED)
        cluster.down(SETTINGS, hard=True, nodes=[victim])
        writers.wait_for(ACKED)  # the replicas were promoted: writes go on
        assert health(cstore.es, wait_for_nodes=str(SETTINGS.es_nodes - 1)) == "yellow"
        for user in USERS:
            assert recall(cstore, user, "which zigbee channel is my hub on?", k=5).hits
        cluster.up(SETTINGS, nodes=[victim])
        writers.wait_for(ACKED)
    assert health(cstore.es, wait_for_status="green", wait_for_no_initializing_shards="true") == "green"
    assert missing(cstore, writers.acked) == []


def test_keys_and_tokens_work_on_every_node(cstore):
    issued = issue_token(cstore, "carol")  # her read key was made by her first write
    user = TokenVerifier(cstore.es, cstore.prefix).verify(issued.secret)
    key = stored_key(cstore, user)
    for url in SETTINGS.node_urls:
        client = user_client(pinned(SETTINGS, url), user, key.encoded)
        owners = {h["_source"].get("user_id") for h in client.search(
            index=cstore.indices, size=100, source_includes=["user_id"])["hits"]["hits"]}
        assert owners == {"carol", None}, url  # DLS: carol's memories and the ownerless catalog
        on_node = replace(cstore, es=pinned(SETTINGS, url))
        assert {h.user_id for h in recall(on_node, user, "hub channel", k=10).hits} <= {"carol", None}


def test_a_supersession_race_across_nodes_has_exactly_one_winner(cstore):
    """Two writers on two different nodes supersede the same fact at once, several times over."""
    stores = [replace(cstore, es=pinned(SETTINGS, url)) for url in SETTINGS.node_urls[:2]]
    current = write_memory(cstore, "dave", "Dave's router is in the hall", "semantic")
    for race in range(RACES):
        outcomes: list[str | Exception] = []
        start = threading.Barrier(len(stores))

        def attempt(store: Store, old: str, text: str, start: threading.Barrier = start,
                    outcomes: list = outcomes) -> None:
            start.wait()
            try:
                outcomes.append(supersede(store, "dave", [old], text))
            except ConflictError as exc:  # AlreadySuperseded too: the other writer finished first
                outcomes.append(exc)

        threads = [threading.Thread(target=attempt, args=(s, current, f"Dave's router is in the {where} ({race})"))
                   for s, where in zip(stores, ("attic", "cellar"), strict=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        winners = [o for o in outcomes if isinstance(o, str)]
        assert len(outcomes) == 2 and len(winners) == 1, outcomes
        old = cstore.es.get(index=f"{cstore.prefix}-semantic", id=current, routing="dave")["_source"]
        assert old["superseded_by"] == winners[0]
        current = winners[0]
    cstore.es.indices.refresh(index=cstore.indices)
    live = cstore.es.count(index=f"{cstore.prefix}-semantic", routing="dave", query={"bool": {
        "filter": [{"term": {"user_id": "dave"}}, {"match": {"text": "router"}}],
        "must_not": [{"exists": {"field": "superseded_by"}}]}})["count"]
    assert live == 1  # no orphan of a lost race, no fork


def test_a_rolling_restart_of_every_node_loses_nothing(cstore):
    with Writers(cstore) as writers:
        for node in range(1, SETTINGS.es_nodes + 1):
            cluster.down(SETTINGS, nodes=[node])
            writers.wait_for(ACKED)
            assert recall(cstore, "erin", "which zigbee channel is my hub on?", k=5).hits
            cluster.up(SETTINGS, nodes=[node])
            assert health(cstore.es, wait_for_status="green") == "green"
        writers.wait_for(ACKED)
    assert missing(cstore, writers.acked) == []
    for user in USERS:
        episodes = cstore.es.count(index=f"{cstore.prefix}-episodic", routing=user,
                                   query={"term": {"user_id": user}})["count"]
        assert episodes >= 3 + len(writers.acked[user])


def test_the_cluster_notebook_runs_end_to_end_each_lesson_cell_twice(tmp_path, es):
    """On a fresh prefix, each lesson cell twice, checked as tests/test_notebooks.py checks the others: the first run
    shows what the committed notebook shows (nbval's comparison, so the notebook runs once per CI run), the second
    what the first showed."""
    path = Path(__file__).resolve().parents[1] / "notebooks" / "cluster" / "15_three_nodes.ipynb"
    twice = tmp_path / path.name
    nbformat.write(each_cell_twice(nbformat.read(path, as_version=4)), twice)
    prefix = unique_prefix(path)
    result = run_notebook(twice, tmp_path / "notebooks", outputs_dir=tmp_path, prefix=prefix)
    assert result.ok, f"{path.name} failed: {result.error} (executed copy: {result.output})"
    output = nbformat.read(result.output, as_version=4)
    differences = committed_differences(nbformat.read(path, as_version=4), output)
    assert not differences, f"{path.name}: outputs differ from the committed ones:\n" + "\n\n".join(differences)
    differences = rerun_differences(output)
    assert not differences, "a cell printed something else when run again:\n" + "\n\n".join(differences)
    assert not es.indices.get(index=f"{prefix}-*", allow_no_indices=True, expand_wildcards="all")
