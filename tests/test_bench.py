"""atlas.bench's measurements that are not timings (timings are reported, never asserted)."""

from __future__ import annotations

import pytest

from atlas.bench import bench_store, index_size
from atlas.config import read_secret
from atlas.memory import write_episode
from atlas.tenancy import live_prefix_keys_query, users_path

pytestmark = pytest.mark.cluster


def test_index_size_sees_documents_written_just_before(store) -> None:
    """`_stats` caches the store size for 10 s; a size taken right after loading must not read the old one."""
    empty = index_size(store.es, store.prefix)
    for i in range(20):
        write_episode(store, "sizer", f"The hallway sensor number {i} went offline after the update.")
    loaded = index_size(store.es, store.prefix)
    assert (empty["docs"], loaded["docs"]) == (0, 20)
    assert loaded["bytes"] > empty["bytes"] + 20 * 768 * 4  # at least the raw nomic vectors
    assert loaded["bytes_per_1k"] == pytest.approx(loaded["bytes"] / 20 * 1000)


def test_a_bench_store_drops_what_an_interrupted_run_left(store) -> None:
    """Indices and read keys of the prefix go, so the next run measures key creation again."""
    write_episode(store, "leftover", "The porch light stays on all night.")
    query = live_prefix_keys_query(store.prefix)
    assert store.es.security.query_api_keys(query=query)["api_keys"]
    fresh = bench_store(store.prefix, store.settings, store.es)
    assert not store.es.security.query_api_keys(query=query)["api_keys"]
    assert (read_secret(users_path(store.settings)) or {}).get(store.prefix) is None
    assert index_size(fresh.es, fresh.prefix)["docs"] == 0
