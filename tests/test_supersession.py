"""Supersession, audit chains, concurrency, crash repair and the archive (issue 4)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from atlas.constants import SUPERSEDE_CONFIDENCE_PENALTY
from atlas.core import supersession
from atlas.core.errors import AlreadySuperseded, ConflictError, NotFound, ValidationError
from atlas.core.memory import forget_memory, write_episode, write_memory
from atlas.core.recall import recall
from atlas.core.supersession import archive, history, repair
from tests.conftest import NOW


def _get(store, doc_id):
    return store.es.get(index=f"{store.prefix}-semantic", id=doc_id)["_source"]


def test_natural_and_harsh(store):
    a = write_memory(store, "sarah", "Sarah's hub is on firmware 4.1", "semantic", fact_type="device")
    b = write_memory(store, "sarah", "Sarah's hub is on firmware 4.2", "semantic", supersedes_id=a)
    assert _get(store, b)["confidence"] == 1.0 and _get(store, b)["contradiction"] == "natural"
    c = write_memory(store, "sarah", "Sarah's hub is on firmware 4.0", "semantic", supersedes_id=b,
                     contradiction="harsh")
    assert _get(store, c)["confidence"] == pytest.approx(1.0 - SUPERSEDE_CONFIDENCE_PENALTY)
    assert _get(store, a)["superseded_by"] == b and _get(store, b)["superseded_by"] == c
    assert _get(store, c)["supersedes"] == [b]


def test_one_statement_retires_several(store):
    olds = [write_memory(store, "sarah", t, "semantic", fact_type="location") for t in
            ("Sarah lives in Bristol", "Sarah's flat is in Clifton, Bristol", "Sarah commutes to Bristol Temple Meads")]
    keep = write_memory(store, "sarah", "Victorian flats in Bristol have thick walls", "semantic")
    new = write_memory(store, "sarah", "Sarah moved to Edinburgh", "semantic", supersedes_id=olds)
    for old in olds:
        assert _get(store, old)["superseded_by"] == new
    assert "superseded_by" not in _get(store, keep)
    ids = recall(store, "sarah", "Bristol", k=10).ids()
    assert keep in ids and not set(olds) & set(ids)


def test_chain_history_both_ways(store):
    abc = write_memory(store, "sarah", "Sarah's router is a Netgear", "semantic")
    xyz = write_memory(store, "sarah", "Sarah's router is a TP-Link", "semantic", supersedes_id=abc)
    pqr = write_memory(store, "sarah", "Sarah's router is an Eero", "semantic", supersedes_id=xyz)
    for start in (abc, xyz, pqr):
        assert [d["id"] for d in history(store, "sarah", start)] == [abc, xyz, pqr]


def test_superseding_a_superseded_document_names_the_head(store):
    abc = write_memory(store, "sarah", "fact v1", "semantic")
    xyz = write_memory(store, "sarah", "fact v2", "semantic", supersedes_id=abc)
    pqr = write_memory(store, "sarah", "fact v3", "semantic", supersedes_id=xyz)
    with pytest.raises(AlreadySuperseded) as info:
        write_memory(store, "sarah", "fact v4", "semantic", supersedes_id=abc)
    assert info.value.head_id == pqr and pqr in str(info.value)


def test_owner_checked(store):
    toms = write_memory(store, "tom", "Tom lives in Leeds", "semantic")
    with pytest.raises(NotFound):
        write_memory(store, "sarah", "Tom lives in York", "semantic", supersedes_id=toms)
    assert "superseded_by" not in _get(store, toms)
    with pytest.raises(NotFound):
        history(store, "sarah", toms)


def test_concurrent_supersession_exactly_one_wins(store):
    old = write_memory(store, "sarah", "Sarah's thermostat target is 20C", "semantic")
    barrier = threading.Barrier(2, timeout=30)  # if one writer never gets here, both fail instead of hanging
    outcomes: list[object] = []
    real_mark = supersession._mark

    def slow_mark(*args, **kwargs):
        barrier.wait()  # both writers have read `old` and indexed their new fact
        return real_mark(*args, **kwargs)

    supersession._mark = slow_mark
    try:
        def writer(text):
            try:
                outcomes.append(write_memory(store, "sarah", text, "semantic", supersedes_id=old))
            except ConflictError as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=writer, args=(t,)) for t in ("target 21C", "target 19C")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a writer hung"
    finally:
        supersession._mark = real_mark
    winners = [o for o in outcomes if isinstance(o, str)]
    losers = [o for o in outcomes if isinstance(o, ConflictError)]
    assert len(winners) == 1 and len(losers) == 1
    assert _get(store, old)["superseded_by"] == winners[0]
    store.es.indices.refresh(index=f"{store.prefix}-semantic")
    current = store.es.search(index=f"{store.prefix}-semantic", query={"bool": {"must_not": {"exists": {
        "field": "superseded_by"}}}})["hits"]["hits"]
    assert [h["_id"] for h in current] == winners, "the loser's new fact must not be left behind"


def test_crash_between_write_and_mark_is_repaired(store, monkeypatch):
    old = write_memory(store, "sarah", "Sarah's dog is called Biscuit", "semantic")

    def crash(*args, **kwargs):
        raise RuntimeError("injected crash after the new document was written")

    monkeypatch.setattr(supersession, "_mark", crash)
    with pytest.raises(RuntimeError):
        write_memory(store, "sarah", "Sarah's dog is called Crumble", "semantic", supersedes_id=old)
    monkeypatch.undo()
    store.es.indices.refresh(index=f"{store.prefix}-semantic")
    both = recall(store, "sarah", "what is the dog called", k=5).ids()
    assert both == [old], "before repair the old fact stays current: the crashed supersession never marked it"
    report = repair(store)
    assert len(report.completed) == 1 and report.completed[0][0] == old
    after = recall(store, "sarah", "what is the dog called", k=5).ids()
    assert old not in after and len(after) == 1
    assert repair(store).completed == [], "repair is idempotent"


def test_repair_removes_a_race_loser(store):
    old = write_memory(store, "sarah", "Sarah's hub sits on the shelf", "semantic")
    winner = write_memory(store, "sarah", "Sarah's hub sits in the cupboard", "semantic", supersedes_id=old)
    orphan = store.es.index(index=f"{store.prefix}-semantic", refresh=True, document={
        **_get(store, winner), "text": "Sarah's hub sits in the attic", "supersedes": [old]})["_id"]
    report = repair(store)
    assert report.removed_orphans == [orphan]
    assert not store.es.exists(index=f"{store.prefix}-semantic", id=orphan)


def test_archive_moves_old_superseded_and_is_resumable(store, monkeypatch):
    old = write_memory(store, "sarah", "Sarah lives in Bristol", "semantic")
    new = write_memory(store, "sarah", "Sarah lives in Edinburgh", "semantic", supersedes_id=old)
    assert archive(store, older_than="90d", now=NOW + timedelta(days=30), progress=False) == 0
    vectors = ("embedding", "rerank_embedding")
    written = store.es.get(index=f"{store.prefix}-semantic", id=old, source_exclude_vectors=False)["_source"]
    # A crash after the copy, before the delete: the rerun finishes without duplicating.
    real_bulk = supersession.helpers.bulk
    calls = {"n": 0}

    def crash_on_delete(client, actions, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected crash between copy and delete")
        return real_bulk(client, actions, **kwargs)

    monkeypatch.setattr(supersession.helpers, "bulk", crash_on_delete)
    with pytest.raises(RuntimeError):
        archive(store, older_than="90d", now=NOW + timedelta(days=100), progress=False)
    monkeypatch.undo()
    assert store.es.exists(index=f"{store.prefix}-archive", id=old)
    assert archive(store, older_than="90d", now=NOW + timedelta(days=100), progress=False) == 1
    assert not store.es.exists(index=f"{store.prefix}-semantic", id=old)
    assert store.es.count(index=f"{store.prefix}-archive")["count"] == 1
    # Vectors are not in `_source`; the archive asked for them, so the copy has them (read back alike).
    copied = store.es.get(index=f"{store.prefix}-archive", id=old, source_exclude_vectors=False)["_source"]
    assert all(copied[field] == written[field] for field in vectors)
    assert [d["id"] for d in history(store, "sarah", new)] == [old, new]
    flagged = recall(store, "sarah", "Bristol", include_superseded=True).hits
    assert any(h.id == old and h.superseded_by == new for h in flagged)
    assert old not in recall(store, "sarah", "Bristol").ids()


def test_chain_order_follows_links_not_clocks():
    same = "2026-11-01T12:00:00.000Z"
    docs = {"z": {"created_at": same}, "a": {"created_at": same, "supersedes": ["z"]},
            "m": {"created_at": same, "supersedes": ["a"]}, "b": {"created_at": same}}
    order = [next(k for k, v in docs.items() if v is d) for d in supersession.chain_order(docs)]
    assert order.index("z") < order.index("a") < order.index("m")


def test_forget_splices_the_chain(store):
    """Forgetting a link keeps the chain walkable; forgetting its head makes the fact before it current."""
    a = write_memory(store, "sarah", "Sarah's car is a Golf", "semantic")
    b = write_memory(store, "sarah", "Sarah's car is a Polo", "semantic", supersedes_id=a)
    c = write_memory(store, "sarah", "Sarah's car is a Leaf", "semantic", supersedes_id=b)
    forget_memory(store, "sarah", b)
    assert [d["id"] for d in history(store, "sarah", a)] == [a, c]
    assert _get(store, a)["superseded_by"] == c and _get(store, c)["supersedes"] == [a]
    forget_memory(store, "sarah", c)
    assert [d["id"] for d in history(store, "sarah", a)] == [a]
    assert _get(store, a).get("superseded_by") is None
    assert a in recall(store, "sarah", "Sarah's car", k=5).ids()
    d = write_memory(store, "sarah", "Sarah's car is a Zoe", "semantic", supersedes_id=a)
    assert [x["id"] for x in history(store, "sarah", d)] == [a, d]


def test_a_link_left_dangling_is_skipped(store):
    """A fact forgotten before forgets spliced chains left a link to nothing: the chain still reads."""
    a = write_memory(store, "sarah", "Sarah's bike is red", "semantic")
    b = write_memory(store, "sarah", "Sarah's bike is blue", "semantic", supersedes_id=a)
    store.es.delete(index=f"{store.prefix}-semantic", id=b, routing="sarah", refresh=True)
    assert [d["id"] for d in history(store, "sarah", a)] == [a]
    with pytest.raises(AlreadySuperseded) as info:  # retired still; the head it names is the last one left
        write_memory(store, "sarah", "Sarah's bike is green", "semantic", supersedes_id=a)
    assert info.value.head_id == a


def test_recall_as_of_a_date_walks_the_chain(store):
    """Issue 38: what Atlas held at each date of a chain, the archived part included; decay is measured from then."""
    moves = {"bristol": NOW - timedelta(days=700), "edinburgh": NOW - timedelta(days=300),
             "glasgow": NOW - timedelta(days=20)}
    ids: dict[str, str] = {}
    previous = None
    for city, when in moves.items():
        ids[city] = write_memory(store.at(when), "sarah", f"Sarah lives in {city.title()}", "semantic",
                                 fact_type="location", supersedes_id=previous)
        previous = ids[city]
    ids["episode"] = write_episode(store.at(moves["edinburgh"] + timedelta(days=1)), "sarah",
                                   "The removal van got lost on the way to Edinburgh")
    assert archive(store, older_than="90d", progress=False) == 1, "Bristol's fact, retired 300 days ago, is archived"
    question = "where does Sarah live?"

    def held(as_of, **options):
        return {key for key, doc_id in ids.items() if doc_id in recall(store, "sarah", question, as_of=as_of,
                                                                        **options).ids()}

    assert held(moves["bristol"] - timedelta(days=1)) == set(), "nothing was written yet"
    assert held(moves["bristol"] + timedelta(days=1)) == {"bristol"}, "read from the archive"
    assert held(moves["edinburgh"]) == {"edinburgh"}, "a fact superseded at T is no longer held at T"
    assert held(moves["edinburgh"] + timedelta(days=2)) == {"edinburgh", "episode"}
    assert held(NOW) == {"glasgow", "episode"} == held(None)
    assert held(moves["edinburgh"] + timedelta(days=2), include_superseded=True) == {"bristol", "edinburgh", "episode"}
    later = moves["edinburgh"] + timedelta(days=2)
    episode = [next(h.path_scores["bm25"] for h in result.hits if h.id == ids["episode"])
               for result in (recall(store, "sarah", "van", as_of=later, mode="bm25"),
                              recall(store.at(later), "sarah", "van", mode="bm25"),
                              recall(store, "sarah", "van", mode="bm25"))]
    assert episode[0] == episode[1] != episode[2], "decayed from as_of, as a recall made then"
    with pytest.raises(ValidationError, match="after the store's clock"):
        recall(store, "sarah", question, as_of=NOW + timedelta(seconds=1))
    with pytest.raises(ValidationError, match="as_of must be a datetime"):
        recall(store, "sarah", question, as_of="2025-01-01")


def test_valid_time_answers_where_she_lived_then(store):
    """Issue 38: a fact's valid time comes from the writer, or from a date its text names, and its successor ends it;
    a question that names a period is answered from the chain, the facts that held then first."""
    leeds = write_memory(store.at(datetime(2023, 6, 1, tzinfo=UTC)), "sarah", "Sarah lives in Leeds", "semantic")
    bristol = write_memory(store.at(datetime(2025, 5, 10, tzinfo=UTC)), "sarah",
                           "Sarah moved to Bristol in March 2025", "semantic", supersedes_id=leeds)
    edinburgh = write_memory(store.at(datetime(2026, 9, 1, tzinfo=UTC)), "sarah", "Sarah lives in Edinburgh",
                             "semantic", supersedes_id=bristol, valid_from=datetime(2026, 8, 15))
    held = {name: (_get(store, i).get("valid_from"), _get(store, i).get("valid_to"))
            for name, i in (("leeds", leeds), ("bristol", bristol), ("edinburgh", edinburgh))}
    assert held == {"leeds": (None, "2025-03-01T00:00:00.000Z"),  # from when it was written; its successor's start
                    "bristol": ("2025-03-01T00:00:00.000Z", "2026-08-15T00:00:00.000Z"),  # "in March 2025"
                    "edinburgh": ("2026-08-15T00:00:00.000Z", None)}
    names = {leeds: "leeds", bristol: "bristol", edinburgh: "edinburgh"}

    def facts(question):
        return [names[i] for i in recall(store, "sarah", question, types=["semantic"]).ids()]

    assert facts("where did Sarah live in 2024?") == ["leeds", "edinburgh"], "held then first; the current one stays"
    assert facts("where did Sarah live in the summer of 2025?")[0] == "bristol"
    assert "leeds" not in facts("where did Sarah live in the summer of 2025?"), "it had ended by then"
    assert facts("where did Sarah live in 2022?") == ["edinburgh"], "nothing Atlas knows held in 2022"
    assert facts("where does Sarah live?") == ["edinburgh"]
    forget_memory(store, "sarah", edinburgh)
    assert _get(store, bristol).get("valid_to") is None, "the head forgotten, the fact before it holds again"
    with pytest.raises(ValidationError, match="after the store's clock"):
        write_memory(store, "sarah", "Sarah lives in Oslo", valid_from=NOW + timedelta(days=1))
    with pytest.raises(ValidationError, match="is not after valid_from"):
        write_memory(store, "sarah", "Sarah lives in Oslo", valid_from=NOW, valid_to=NOW)
    with pytest.raises(ValidationError, match="give valid_from too"):
        write_memory(store, "sarah", "Sarah lived in Oslo", valid_to=NOW - timedelta(days=1))
    with pytest.raises(ValidationError, match="only a fact has a valid time"):
        write_memory(store, "sarah", "Sarah said hello", "episodic", valid_from=NOW)


def test_a_rolled_back_supersession_leaves_the_valid_time_as_it_was(store, monkeypatch):
    """A supersession of two facts that loses its race on the second unmarks the first, whose valid time it had
    ended (`_undo`)."""
    first = write_memory(store, "sarah", "Sarah's bike is red", "semantic")
    second = write_memory(store, "sarah", "Sarah's bike has a basket", "semantic")
    real_mark = supersession._mark
    raced: list[str] = []

    def racing(store_, old, new_id, new):
        if old.id == second and not raced:
            raced.append("racing")
            raced.append(write_memory(store, "sarah", "Sarah's bike has no basket", supersedes_id=second))
        return real_mark(store_, old, new_id, new)

    monkeypatch.setattr(supersession, "_mark", racing)
    with pytest.raises(ConflictError, match="changed while superseding"):
        write_memory(store, "sarah", "Sarah's bike is blue and has no basket", supersedes_id=[first, second])
    source = _get(store, first)
    assert raced and source.get("superseded_by") is None and source.get("valid_to") is None
