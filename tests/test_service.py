"""Least privilege (issue 23): Atlas runs as its own service principal, never as the superuser; the local
node's folder is private and its set-up follows no link that the node's user could plant."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from elasticsearch import AuthorizationException, BadRequestError
from typer.testing import CliRunner

from atlas import constants as C
from atlas.cli import app
from atlas.config import load_settings
from atlas.core.errors import ConnectionFailed, ValidationError
from atlas.core.memory import write_memory
from atlas.core.recall import recall
from atlas.ops import cluster
from atlas.ops.errors import ClusterError
from atlas.ops.service import build_service_role_body
from atlas.security import tenancy
from atlas.security.connection import connect
from atlas.security.secrets import read_secret
from atlas.stack import open_store

LOCAL = load_settings().local
local_only = pytest.mark.skipif(not LOCAL, reason="ES_URL points at an external cluster")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the node's user and its links matter only when root sets up")


# --- the service principal ----------------------------------------------------------------------------------


def test_atlas_and_its_mcp_server_connect_as_the_service_principal(store):
    """The store an MCP server, a notebook or the CLI opens authenticates as `atlas_service`, whose role is
    the documented one: no superuser, no security administration, no cluster settings."""
    for es in (connect(), store.es):
        assert es.security.authenticate()["username"] == load_settings().service_user
    privileges = store.es.security.get_user_privileges()
    assert sorted(privileges["cluster"]) == sorted(C.SERVICE_CLUSTER_PRIVILEGES)
    assert all(not grant["allow_restricted_indices"] for grant in privileges["indices"])


@pytest.mark.parametrize("attempt", ["read .security", "make a user", "change a cluster setting", "read others' keys"])
def test_the_service_principal_cannot_administer_the_cluster(store, operator_es, attempt):
    operator_key = operator_es.security.create_api_key(name=f"operator-{uuid.uuid4().hex[:6]}", expiration="5m")
    try:
        calls = {
            "read .security": lambda: store.es.search(index=".security", size=1),
            "make a user": lambda: store.es.security.put_user(username=f"mallory-{uuid.uuid4().hex[:6]}",
                                                              password="mallory-password", roles=[]),
            "change a cluster setting": lambda: store.es.cluster.put_settings(
                transient={"cluster.routing.allocation.node_concurrent_recoveries": 2}),
            "read others' keys": lambda: store.es.security.get_api_key(id=operator_key["id"]),
        }
        with pytest.raises(AuthorizationException):
            calls[attempt]()
    finally:
        operator_es.security.invalidate_api_key(ids=[operator_key["id"]])


def test_wildcard_deletes_are_refused(store, operator_es):
    """`action.destructive_requires_name`: not even the operator drops indices by pattern."""
    index = f"{store.prefix}-wild-{uuid.uuid4().hex[:6]}"
    operator_es.indices.create(index=index)
    try:
        with pytest.raises(BadRequestError, match="[Ww]ildcard"):
            operator_es.indices.delete(index=f"{store.prefix}-wild-*")
        assert operator_es.indices.exists(index=index)
    finally:
        operator_es.indices.delete(index=index)


def test_the_role_is_printable_and_refuses_no_patterns(runner):
    result = runner.invoke(app, ["service", "role", "--indices", "atlas-*", "--indices", "nb-*"])
    assert result.exit_code == 0, result.output
    head, body = result.output.split("\n", 1)
    assert head == f"PUT _security/role/{load_settings().service_user}"
    assert json.loads(body) == build_service_role_body(indices=["atlas-*", "nb-*"])
    assert json.loads(body)["indices"][0]["allow_restricted_indices"] is False
    with pytest.raises(ValidationError, match="at least one index pattern"):
        build_service_role_body(indices=[" "])


@local_only
def test_service_create_on_another_cluster_then_atlas_connects_as_it(tmp_path, monkeypatch, operator_es):
    """The Elastic Cloud path, on the local node reached by URL: the operator runs `atlas service create` with
    their credential in ES_*, then Atlas (without it) connects as the new principal, writes and recalls through a
    user's DLS key that this principal made, and cannot touch an index outside its patterns."""
    name = f"atlas_svc_{uuid.uuid4().hex[:6]}"
    operator = read_secret(load_settings().local_credentials_path)
    for var, value in (("ATLAS_HOME", str(tmp_path)), ("ES_URL", operator["url"]), ("ES_USERNAME", "elastic"),
                       ("ES_PASSWORD", operator["password"]), ("ATLAS_SERVICE_USER", name)):
        monkeypatch.setenv(var, value)
    try:
        result = CliRunner().invoke(app, ["service", "create", "--indices", "t-*"])
        assert result.exit_code == 0, result.output
        monkeypatch.delenv("ES_USERNAME")
        monkeypatch.delenv("ES_PASSWORD")
        es = connect()
        assert es.security.authenticate()["username"] == name
        store = open_store(f"t-svc-{uuid.uuid4().hex[:8]}", es=es)
        try:
            write_memory(store, "sarah", "My hub is called Kestrel", fact_type="device")
            assert tenancy.authenticate_user_key(store, tenancy.stored_key(store, "sarah").encoded) == "sarah"
            assert [h.text for h in recall(store, "sarah", "what is my hub called?", k=3).hits][0] == \
                "My hub is called Kestrel"
        finally:
            store.drop()
        with pytest.raises(AuthorizationException):
            es.indices.create(index=f"outside-{uuid.uuid4().hex[:6]}")
    finally:
        operator_es.security.invalidate_api_key(username=name)
        operator_es.security.delete_user(username=name, refresh=True)
        operator_es.security.delete_role(name=name, refresh=True)


def test_without_service_credentials_connect_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv("ATLAS_HOME", str(tmp_path))
    monkeypatch.delenv("ES_URL", raising=False)
    with pytest.raises(ConnectionFailed, match="make es-up"):
        connect(check=False)


# --- the local node's folder ---------------------------------------------------------------------------------


@local_only
@pytest.mark.cluster  # the folder `atlas es up` installs: `make test-fast` runs on a clone that has none
def test_the_node_folder_is_private():
    """Data, logs and keystore are readable by the node's user alone, not by other local users."""
    root = cluster.node_for(load_settings()).root
    assert root.stat().st_mode & 0o077 == 0, oct(root.stat().st_mode)


def _fake_node(tmp_path: Path) -> cluster.LocalNode:
    """A node folder with the distribution's config files only: enough for `configure` to reach its chown."""
    node = cluster.LocalNode(tmp_path / "node")
    (node.dist / "config").mkdir(parents=True)
    for name in ("jvm.options", "log4j2.properties", "roles.yml", "users", "users_roles", "role_mapping.yml"):
        (node.dist / "config" / name).write_text("")
    return node


@as_root
def test_set_up_as_root_follows_no_planted_link(tmp_path):
    """The node's user owns its folder after the first start; a link it leaves (`data/x -> a root file`) must not
    hand it that file when root sets the node up again."""
    node = _fake_node(tmp_path)
    precious = tmp_path / "precious"
    precious.write_text("root's")
    node.data.mkdir(parents=True)
    (node.data / "planted").symlink_to(precious)
    with pytest.raises(ClusterError, match="symbolic links"):
        cluster.configure(node, load_settings(), Path("/nonexistent-jdk"), "password")
    assert precious.stat().st_uid == 0 and precious.read_text() == "root's"


def test_links_are_refused_and_never_followed(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x").symlink_to("/etc/hostname")
    with pytest.raises(ClusterError, match="data/x"):
        cluster.refuse_links(tmp_path)


def test_down_never_signals_a_process_the_node_user_does_not_run(tmp_path, monkeypatch):
    """The node's user writes the pid file: pid 1 in it is stale, not a process to kill."""
    monkeypatch.setenv("ATLAS_ES_DIR", str(tmp_path))
    node = cluster.node_for(load_settings())
    node.pidfile.write_text("1")
    assert cluster.down() is False
    assert not node.pidfile.exists()
