"""Fixtures against the real cluster: each test module owns an isolated index prefix, dropped afterwards."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from elasticsearch import Elasticsearch
from typer.testing import CliRunner

from atlas.config import load_settings, local_llm_url
from atlas.core.errors import ConnectionFailed
from atlas.core.store import Store
from atlas.security.connection import connect
from atlas.security.secrets import read_secret
from atlas.stack import open_store

#: The fixed "now" of tests, so that decay is deterministic.
NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
#: The fixtures that connect to the cluster or the local model server: a test using one (directly or through another
#: fixture) is marked `cluster`, so that `pytest -m "not cluster"` (`make test-fast`) runs without either.
CLUSTER_FIXTURES = frozenset({"es", "operator_es", "store", "module_store", "tstore", "runner", "local_llm"})


#: Under `pytest -n` (`make test` runs three workers), the tests that must share a worker, by the fixture that makes
#: them: every test of the local model server (its answers would otherwise depend on the other worker's requests:
#: the server answers one at a time and reuses the previous prompt's cache), and each evaluation that reads a
#: notebook's report with that notebook's run (`tests.test_notebooks.executed` runs a notebook once per process).
#: tests/test_notebooks.py puts the notebooks that ask the model, and the reporting ones, in the same groups.
#: Three groups, not one: the model's tests, the persona evaluation and LoCoMo need not wait for each other.
MODEL_GROUP = "model"
SHARED_WORKER = {"local_llm": MODEL_GROUP, "persona_report": "persona-eval", "locomo_report": "locomo-eval"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `cluster` every test that takes a cluster fixture (before `-m` selects), beside those marked by hand,
    and put in its `SHARED_WORKER` group every test that takes one of its fixtures (before pytest-xdist groups
    them)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if CLUSTER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.cluster)
        groups = {group for fixture, group in SHARED_WORKER.items() if fixture in fixtures}
        assert len(groups) <= 1, f"{item.nodeid} needs two workers' fixtures: {sorted(groups)}"
        for group in groups:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def es():
    try:
        return connect()
    except ConnectionFailed as exc:
        pytest.exit(f"the test cluster is not reachable: {exc}", returncode=3)


@pytest.fixture(scope="session")
def operator_es(es):
    """The operator's client (the local node's `elastic`, or ES_*): for the set-ups Atlas itself may not do."""
    return connect(operator=True)


def make_prefix(tag: str) -> str:
    """t-<tag>-<random>: valid as an index prefix whatever the test is called."""
    return f"t-{re.sub(r'[^a-z0-9]+', '-', tag.lower())[:16].strip('-')}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def store(es, request) -> Iterator[Store]:
    """A store on a fresh prefix with the fixed clock NOW; dropped after the test."""
    s = open_store(make_prefix(request.node.name.removeprefix("test_")), es=es, now=lambda: NOW)
    yield s
    s.drop()


@pytest.fixture(scope="module")
def module_store(es, request) -> Iterator[Store]:
    """One store shared by a module's tests (for fixtures that are costly to load)."""
    s = open_store(make_prefix(request.module.__name__.split(".")[-1].removeprefix("test_")), es=es,
                   now=lambda: NOW)
    yield s
    s.drop()


@pytest.fixture
def tstore(store: Store, tmp_path) -> Iterator[Store]:
    """The isolated store with its secrets (keys, tokens) in tmp_path; its drop invalidates the prefix's keys."""
    store.settings = replace(store.settings, home=tmp_path)
    yield store


@pytest.fixture
def runner(tstore: Store, monkeypatch) -> CliRunner:
    """A CLI runner whose Atlas home is tstore's (tmp_path): the local node is reached as an external cluster."""
    real = load_settings()
    if real.local:
        creds = read_secret(real.service_credentials_path)
        for name, value in (("ES_URL", creds["url"]), ("ES_USERNAME", creds["username"]),
                            ("ES_PASSWORD", creds["password"])):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("ATLAS_HOME", str(tstore.settings.home))
    return CliRunner()


@pytest.fixture(scope="session")
def local_llm():
    """The local model server's settings (`atlas llm up`, which `make test` runs first; started here if not)."""
    from atlas.ops import llm_server

    settings = load_settings()
    if settings.llm_base_url != local_llm_url():
        pytest.skip("OPENAI_BASE_URL names another endpoint: these tests are of the local server")
    llm_server.up(settings)
    return settings


def episodes(store: Store, user: str = "sarah") -> list[str]:
    """The texts of the user's stored episodes (refreshed first)."""
    store.es.indices.refresh(index=f"{store.prefix}-episodic")
    hits = store.es.search(index=f"{store.prefix}-episodic", query={"term": {"user_id": user}})["hits"]["hits"]
    return [h["_source"]["text"] for h in hits]


def requests_sent(monkeypatch) -> list[tuple[str, str]]:
    """(method, path) of every request any client sends from now until `monkeypatch.undo()`."""
    sent: list[tuple[str, str]] = []
    real = Elasticsearch.perform_request

    def counted(self, method, path, **kwargs):
        sent.append((method, path))
        return real(self, method, path, **kwargs)

    monkeypatch.setattr(Elasticsearch, "perform_request", counted)
    return sent
