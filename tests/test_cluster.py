"""The local node and `connect()`: idempotent lifecycle, clear errors (issue 2)."""

from __future__ import annotations

import os
import pwd
import socket
from dataclasses import replace

import pytest

from atlas.config import load_settings
from atlas.core.documents import build_document
from atlas.core.errors import ConnectionFailed, ValidationError
from atlas.core.memory import bulk_load, write_episode, write_memory
from atlas.core.recall import recall
from atlas.ops import cluster
from atlas.ops.errors import ClusterError
from atlas.research.cluster_bench import primary_docs
from atlas.security.connection import connect, server_version, version_problem
from atlas.stack import open_store
from tests.conftest import NOW, make_prefix

LOCAL = load_settings().local
local_only = pytest.mark.skipif(not LOCAL, reason="ES_URL points at an external cluster")


@pytest.mark.cluster
@local_only
def test_up_is_idempotent_and_status_answers():
    before = cluster.status()
    creds = cluster.up()
    after = cluster.status()
    assert after["answering"] and [n["pid"] for n in after["nodes"]] == [n["pid"] for n in before["nodes"]]
    assert creds["url"] == after["url"]


@pytest.mark.cluster
@local_only
def test_node_never_runs_as_root():
    for node in cluster.status()["nodes"]:
        owner = pwd.getpwuid(os.stat(f"/proc/{node['pid']}").st_uid).pw_name
        assert owner != "root"
        if os.geteuid() == 0:
            assert owner == cluster.ES_USER


@pytest.mark.cluster
@local_only
def test_credentials_file_is_private():
    path = load_settings().local_credentials_path
    assert path.stat().st_mode & 0o777 == 0o600


def test_taken_port_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ATLAS_ES_DIR", str(tmp_path / "node"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ClusterError, match=f"port {port} is taken"):
            cluster.up(load_settings(home=tmp_path, es_url=None, es_port=port))  # a local node, whatever ES_URL


def test_external_cluster_starts_nothing(tmp_path):
    with pytest.raises(ClusterError, match="ES_URL is set"):
        cluster.up(load_settings(home=tmp_path, es_url="http://127.0.0.1:1"))


def test_cluster_down_is_a_one_line_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    with pytest.raises(ConnectionFailed, match="not answering") as info:
        connect(load_settings(home=tmp_path, es_url=f"http://127.0.0.1:{free}", es_username="elastic",
                              es_password="x"))
    assert "\n" not in str(info.value)


@pytest.mark.cluster
def test_wrong_password_is_a_one_line_error(tmp_path):
    url = load_settings().url
    with pytest.raises(ConnectionFailed, match="refused the credentials"):
        connect(load_settings(home=tmp_path, es_url=url, es_username="elastic", es_password="wrong-password"))


def test_version_check():
    assert version_problem(["9.2.0"], "u") is None
    message = version_problem(["8.15.1"], "http://old")
    assert "8.15.1" in message and "pip install" in message


def test_connect_reports_a_9x_server(es):
    assert server_version(es).startswith("9.")


def test_render_config_is_single_node_secure_trial(tmp_path):
    text = cluster.render_config(cluster.LocalNode(tmp_path), load_settings(home=tmp_path, es_nodes=1, es_port=9333))
    for line in ("network.host: 127.0.0.1", "http.port: 9333", "discovery.type: single-node",
                 "xpack.security.enabled: true", "xpack.license.self_generated.type: trial"):
        assert line in text


def test_three_nodes_have_own_ports_folders_and_one_cluster(tmp_path):
    settings = load_settings(home=tmp_path, es_nodes=3, es_port=9201, es_transport_port=9301)
    nodes = cluster.nodes_for(settings)
    texts = [cluster.render_config(node, settings) for node in nodes]
    assert len({node.data for node in nodes}) == 3 and len({node.dist for node in nodes}) == 1
    assert [f"http.port: {9201 + i}" in text and f"transport.port: {9301 + i}" in text
            for i, text in enumerate(texts)] == [True] * 3
    for text in texts:
        assert "discovery.type" not in text and "cluster.name: atlas-local-3" in text
        assert "discovery.seed_hosts: [127.0.0.1:9301, 127.0.0.1:9302, 127.0.0.1:9303]" in text
    assert (settings.shards, settings.replicas, settings.es_heap) == (3, 1, "512m")
    assert settings.secrets_dir != load_settings(home=tmp_path, es_nodes=1).secrets_dir


@pytest.mark.cluster
def test_a_routing_partition_spreads_each_user_over_that_many_shards(es):
    """Issue 37, hot shards: with `routing_partition` 2 of 3 shards, one user's documents sit on two shards of each
    user index (Elasticsearch ignores the partition unless the routing shards are the shards: elasticsearch#48863),
    every write carries the routing, recall and supersession work as on one shard, and the catalog keeps one shard
    and takes items without an owner."""
    settings = replace(load_settings(), shards=3, routing_partition=2)
    store = open_store(make_prefix("partition"), es=es, settings=settings, now=lambda: NOW)
    try:
        bulk_load(store, [build_document(None, "Lumio Hub v2: a smart home hub", "catalog", NOW)], refresh=True)
        for turn in range(24):
            write_episode(store, "sarah", f"Sarah asks about the hall lights, turn {turn}")
        old = write_memory(store, "sarah", "Sarah lives in Bristol", "semantic")
        new = write_memory(store, "sarah", "Sarah lives in Edinburgh now", "semantic", supersedes_id=old)
        es.indices.refresh(index=store.indices)
        held = primary_docs(es, f"{store.prefix}-episodic")
        assert sum(held) == 24 and sum(1 for n in held if n) == 2, held
        layout = es.indices.get_settings(index=f"{store.prefix}-episodic")[f"{store.prefix}-episodic"]
        assert layout["settings"]["index"]["routing_partition_size"] == "2"
        assert primary_docs(es, f"{store.prefix}-catalog") == [1]
        result = recall(store, "sarah", "where does Sarah live?", k=5)
        assert new in result.ids() and old not in result.ids()
        with pytest.raises(Exception, match="routing_missing_exception"):
            es.index(index=f"{store.prefix}-episodic", document={"text": "no owner"})
    finally:
        store.drop()


@pytest.mark.parametrize("partition", [0, 3, 4])
def test_a_routing_partition_is_one_or_fewer_than_the_shards(partition):
    with pytest.raises(ValidationError, match="ATLAS_ROUTING_PARTITION is"):
        open_store("never", settings=replace(load_settings(), shards=3, routing_partition=partition))

