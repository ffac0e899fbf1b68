"""The multipliers Elasticsearch applies equal the Python formula (issue 4)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from atlas.core.clock import es_date
from atlas.core.documents import build_document
from atlas.core.memory import bulk_load
from atlas.core.scoring import build_scored_query, multiplier, recency, smoothed_success_rate, use_boost
from tests.conftest import NOW

AGES = [0, 90, 180, 365, 1000, 2005, 4000]
USES = [0, 1, 10, 100]


def test_formula_anchor_points():
    assert recency(0) == 1.0 and recency(180) == 1.0
    assert recency(180 + 1825) == pytest.approx(0.5)
    assert use_boost(10) == pytest.approx(1.2083, abs=1e-4) and use_boost(100) == pytest.approx(1.4009, abs=1e-4)
    assert smoothed_success_rate(0, 0) == 0.5 and smoothed_success_rate(9, 0) == pytest.approx(10 / 11)


def _measured(store, params=None, period=None) -> dict[str, float]:
    """_score of each document under a constant inner score of 1: exactly the multiplier."""
    query = build_scored_query({"constant_score": {"filter": {"match_all": {}}, "boost": 1.0}}, NOW,
                               params=params or store.params, period=period)
    resp = store.es.search(index=store.indices, query=query, size=1000, source_includes=["source_key"])
    return {h["_source"]["source_key"]: h["_score"] for h in resp["hits"]["hits"]}


def test_multiplier_table_matches_elasticsearch(store):
    docs = []
    for age in AGES:
        when = NOW - timedelta(days=age)
        docs.append(build_document("u", f"episode {age}", "episodic", NOW, timestamp=when, source_key=f"ep-{age}"))
        for uses in USES:
            docs.append(build_document("u", f"fact {age} {uses}", "semantic", NOW, last_used_at=es_date(when),
                                       use_count=uses, source_key=f"fact-{age}-{uses}"))
    docs.append(build_document(None, "a catalog item", "catalog", NOW, source_key="cat"))
    docs.append(build_document("u", "a playbook", "procedural", NOW - timedelta(days=4000), source_key="pb",
                               steps=["one"]))
    bulk_load(store, docs, progress=False)
    measured = _measured(store)
    for age in AGES:
        assert measured[f"ep-{age}"] == pytest.approx(multiplier("episodic", age_days=age), abs=1e-3)
        for uses in USES:
            want = multiplier("semantic", age_days=age, use_count=uses)
            assert measured[f"fact-{age}-{uses}"] == pytest.approx(want, abs=1e-3), (age, uses)
    assert measured["cat"] == pytest.approx(0.85, abs=1e-3)
    assert measured["pb"] == pytest.approx(1.0, abs=1e-3), "procedural memory is exempt from decay"


def test_procedural_success_multiplier_behind_constant(store):
    docs = [build_document("u", "good playbook", "procedural", NOW, steps=["a"], success_count=9, failure_count=0,
                           success_rate=smoothed_success_rate(9, 0), source_key="good"),
            build_document("u", "bad playbook", "procedural", NOW, steps=["a"], success_count=0, failure_count=9,
                           success_rate=smoothed_success_rate(0, 9), source_key="bad")]
    bulk_load(store, docs, progress=False)
    assert _measured(store) == {"good": pytest.approx(1.0), "bad": pytest.approx(1.0)}
    params = store.params.with_(procedural_success_weight=0.5)
    on = _measured(store, params)
    assert on["good"] == pytest.approx(multiplier("procedural", success_rate=10 / 11, params=params), abs=1e-3)
    assert on["bad"] == pytest.approx(multiplier("procedural", success_rate=1 / 11, params=params), abs=1e-3)
    assert on["good"] > on["bad"]


def test_sweepable_params_change_the_decay(store):
    bulk_load(store, [build_document("u", "old episode", "episodic", NOW, timestamp=NOW - timedelta(days=1000),
                                     source_key="old")], progress=False)
    params = store.params.with_(decay_offset="30d", decay_scale="365d")
    assert _measured(store, params)["old"] == pytest.approx(recency(1000, params=params), abs=1e-3)
    assert recency(1000, params=params) < recency(1000)


def test_period_boost_matches_the_formula(store):
    """Episodes said in the named period are lifted, facts that began to hold only after it held back (the Python
    twin and the Elasticsearch functions agree)."""
    june, july = NOW - timedelta(days=150), NOW - timedelta(days=120)
    bulk_load(store, [build_document("u", "camping trip", "episodic", NOW, timestamp=when, source_key=key)
                      for key, when in (("june", june), ("july", july))]
              + [build_document("u", "a tent", "semantic", NOW, valid_from=when, source_key=f"fact-{key}")
                 for key, when in (("june", june), ("july", july))], progress=False)
    measured = _measured(store, period=(june - timedelta(days=1), june + timedelta(days=1)))
    assert measured["june"] == pytest.approx(multiplier("episodic", age_days=150, in_period=True), abs=1e-3)
    assert measured["july"] == pytest.approx(multiplier("episodic", age_days=120), abs=1e-3)
    assert measured["june"] == pytest.approx(2 * measured["july"], abs=1e-3)
    assert measured["fact-june"] == pytest.approx(multiplier("semantic"), abs=1e-3)
    assert measured["fact-july"] == pytest.approx(multiplier("semantic", began_after_period=True), abs=1e-3)
    assert measured["fact-july"] == pytest.approx(measured["fact-june"] / 2, abs=1e-3)
