"""atlas.research.bench's measurements that are not timings (timings are reported, never asserted)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from atlas.core import constants as C
from atlas.core.config import read_secret
from atlas.core.memory import write_episode
from atlas.core.tenancy import live_prefix_keys_query, users_path
from atlas.research.bench import Corpus, bench_store, index_size, measure_throughput, measure_token_check

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


def test_throughput(store) -> None:
    """One entry per client count, each a positive rate over every request and ordered percentiles. The wall
    time is never compared with a threshold, only with the latencies it contains: at most `clients` overlap."""
    users = ["u0000", "u0001"]
    for user in users:
        write_episode(store, user, f"{user}'s porch sensor went offline after the update.")
    corpus = Corpus(docs=[], heads=[], details=[], users=users)
    clients, requests = [1, 2], 4
    out = measure_throughput(store, corpus, ["porch sensor offline"], clients, requests, random.Random(0), store.now(),
                             progress=False)
    assert list(out) == [str(n) for n in clients]
    for n, stats in zip(clients, out.values(), strict=True):
        assert stats["n"] == requests and stats["recalls_per_s"] > 0
        assert 0 < stats["p50_ms"] <= stats["p95_ms"] <= stats["p99_ms"] and stats["mean_ms"] > 0
        wall_ms = requests / stats["recalls_per_s"] * 1000
        assert stats["p99_ms"] <= wall_ms and requests * stats["mean_ms"] <= n * wall_ms


def test_token_check_is_measured_with_and_without_the_cache(tstore) -> None:
    """Both settings time `checks` verifications of live tokens; without tenancy there is nothing to check."""
    users = ["tina", "theo"]
    for user in users:
        tstore.provision(user)
    out = measure_token_check(tstore, users, 40, random.Random(0))
    assert out is not None and out["tokens"] == 2 and out["revocation_bound_s"] == C.TOKEN_CACHE_SECONDS
    for name in ("cached", "no cache"):
        assert out[name]["n"] == 40 and 0 < out[name]["p50_ms"] <= out[name]["p95_ms"] <= out[name]["p99_ms"]
    assert measure_token_check(replace(tstore, provision=None), users, 40, random.Random(0)) is None
