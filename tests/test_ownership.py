"""Ownership attacks against the real cluster (security issue, parts 6 and 7): one test per attack class.

Documents are planted with the service credential, as an operator's load or a bug could write them;
every test then checks what a user's key, recall, repair, a consolidation rollback or forget does
with them. Each test has its own prefix and its own secrets folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest

from atlas.consolidation import consolidate as cons
from atlas.consolidation.consolidate import Watermark, read_plan
from atlas.core.documents import build_document, embed_documents, index_document
from atlas.core.errors import AuthError, NotFound, ValidationError
from atlas.core.memory import bulk_load, forget_memory, write_memory
from atlas.core.recall import recall
from atlas.core.schemas import all_indices, archive_name, index_name
from atlas.core.store import Store
from atlas.core.supersession import archive, repair
from atlas.security import tenancy
from atlas.security.tenancy import (
    UserKey,
    authenticate_user_key,
    build_role_descriptor,
    ensure_user_key,
    key_name,
    revoke_user_key,
    stored_key,
)
from tests.conftest import NOW


@pytest.fixture
def ostore(store: Store, tmp_path) -> Iterator[Store]:
    """The isolated store with its secrets in tmp_path (its drop invalidates the prefix's keys)."""
    store.settings = replace(store.settings, home=tmp_path)
    yield store


def plant(store: Store, memory_type: str, text: str, owner: object) -> str:
    """Index a document with its vectors and any `user_id` (or none), past every check: an operator's write."""
    doc = build_document("x", text, memory_type, NOW)
    del doc["user_id"]
    if owner is not None:
        doc["user_id"] = owner
    embed_documents(store, [doc])
    return store.es.index(index=index_name(store.prefix, memory_type), document=doc, refresh=True)["_id"]


def source(store: Store, memory_type: str, doc_id: str) -> dict:
    return store.es.get(index=index_name(store.prefix, memory_type), id=doc_id)["_source"]


def visible_ids(store: Store, user_id: str) -> set[str]:
    """Every id the user's key returns for a `match_all` over the prefix: DLS alone decides."""
    hits = store.read_client(user_id).search(index=",".join(all_indices(store.prefix)), query={"match_all": {}},
                                             size=100)["hits"]["hits"]
    return {hit["_id"] for hit in hits}


# --- 6. the ownerless clause, empty and several owners -------------------------------------------------


def test_only_the_catalog_is_ownerless_and_no_document_is_co_owned(ostore):
    catalog = bulk_load(ostore, [build_document(None, "Lumio spare door code reader for the porch", "catalog", NOW,
                                                title="Door reader")], progress=False)
    catalog.append(plant(ostore, "catalog", "Keyline spare door code pad, shared by every household", []))
    own = {user: write_memory(ostore, user, f"{user.title()}'s spare door code is 4471", fact_type="home")
           for user in ("alice", "bob")}
    planted = {
        "ownerless": plant(ostore, "semantic", "The spare door code of flat 2 is 9042", None),
        "empty owner list": plant(ostore, "semantic", "The spare door code of flat 3 is 7719", []),
        "two owners": plant(ostore, "semantic", "The spare door code of flat 4 is 5530", ["alice", "bob"]),
    }
    for user in ("alice", "bob"):
        assert visible_ids(ostore, user) == {own[user], *catalog}, f"{user}'s key reads {planted}"
        for code_filter in (True, False):
            ostore.code_filter = code_filter
            ids = recall(ostore, user, "what is the spare door code", k=20, include_superseded=True).ids()
            assert not set(planted.values()) & set(ids), (user, code_filter, planted)
            assert own[user] in ids and set(catalog) <= set(ids)
        ostore.code_filter = True
        for doc_id in planted.values():
            with pytest.raises(NotFound):
                forget_memory(ostore, user, doc_id)
    # The code filter alone (service credential, no DLS) is the twin: the same documents stay out.
    ostore.reader = None
    ids = recall(ostore, "bob", "what is the spare door code", k=20, include_superseded=True).ids()
    assert not set(planted.values()) & set(ids) and own["bob"] in ids and set(catalog) <= set(ids)


def test_writes_refuse_a_memory_without_exactly_one_owner(ostore):
    good = build_document("alice", "Alice's hub is in the attic", "semantic", NOW)
    bad_owners = {"no user_id": None, "empty list": [], "two owners": ["alice", "bob"], "one in a list": ["alice"],
                  "not a user id": "Alice Smith", "a number": 7}
    for what, owner in bad_owners.items():
        bad = build_document("x", f"The hub code is {what}", "episodic", NOW)
        del bad["user_id"]
        if owner is not None:
            bad["user_id"] = owner
        with pytest.raises(ValidationError, match="user_id"):
            bulk_load(ostore, [good, bad], progress=False)
        with pytest.raises(ValidationError, match="user_id"):
            index_document(ostore, bad)
    with pytest.raises(ValidationError, match="catalog"):
        bulk_load(ostore, [build_document("alice", "Lumio Hub v2 manual", "catalog", NOW)], progress=False)
    ostore.es.indices.refresh(index=ostore.indices)
    assert ostore.es.count(index=ostore.indices)["count"] == 0, "a refused load writes nothing"
    assert tenancy.list_user_keys(ostore) == [], "nor provisions a key"
    # The positive control: one string owner, and an ownerless catalog item.
    bulk_load(ostore, [good, build_document(None, "Lumio Hub v2 manual", "catalog", NOW)], progress=False)
    assert ostore.es.count(index=ostore.indices)["count"] == 2


# --- 7. repair, rollback, forget ---------------------------------------------------------------------


def test_repair_never_follows_a_link_into_another_users_document(ostore):
    bobs = write_memory(ostore, "bob", "Bob's dog is called Pepper", fact_type="person")
    bobs_marked_old = write_memory(ostore, "bob", "Bob's cat is called Miso", fact_type="person")
    alices_old = write_memory(ostore, "alice", "Alice's router is a Netgear", fact_type="device")
    alices_marked_old = write_memory(ostore, "alice", "Alice's kettle is white", fact_type="device")
    alices_head = write_memory(ostore, "alice", "Alice's kettle is red", supersedes_id=alices_marked_old)
    # Supersessions a crash left half-done, except that two of them name another user's fact.
    [foreign_link, own_link] = bulk_load(ostore, [
        build_document("alice", "Alice's dog is called Rex", "semantic", NOW, supersedes=[bobs]),
        build_document("alice", "Alice's router is an Eero", "semantic", NOW, supersedes=[alices_old]),
    ], progress=False)
    [bobs_link] = bulk_load(ostore, [build_document("bob", "Bob's kettle is blue", "semantic", NOW,
                                                    supersedes=[alices_marked_old])], progress=False)
    bob_before = {i: source(ostore, "semantic", i) for i in (bobs, bobs_marked_old, bobs_link)}
    report = repair(ostore, "alice")
    assert report.completed == [(alices_old, own_link)] and report.removed_orphans == []
    assert {i: source(ostore, "semantic", i) for i in bob_before} == bob_before
    report = repair(ostore)
    assert report.completed == [] and report.removed_orphans == [], "bob's link into alice's chain is not his"
    assert {i: source(ostore, "semantic", i) for i in bob_before} == bob_before
    assert source(ostore, "semantic", alices_marked_old)["superseded_by"] == alices_head
    assert bobs in recall(ostore, "bob", "what is my dog called").ids()
    # The foreign link does not block alice either: her fact can still be superseded.
    newer = write_memory(ostore, "alice", "Alice's dog is called Rex the Second", supersedes_id=foreign_link)
    assert source(ostore, "semantic", foreign_link)["superseded_by"] == newer


def test_consolidation_rollback_touches_only_the_users_own_documents(ostore):
    bobs_old = write_memory(ostore, "bob", "Bob lives in Leeds", fact_type="location")
    bobs_new = write_memory(ostore, "bob", "Bob lives in York", fact_type="location", supersedes_id=bobs_old)
    alices = write_memory(ostore, "alice", "Alice bought a kettle plug", fact_type="device")
    fact = {"text": "x", "fact_type": "device", "confidence": 0.9, "supporting_episode_ids": [], "supersedes_id": [],
            "contradiction": "natural"}
    # A pending plan whose journal names bob's documents, as a bug or an edited state document could leave it;
    # its last step fails (no such playbook), so the run rolls back the two steps marked done.
    actions = [{"kind": "fact", "proposal": fact},
               {"kind": "fact", "proposal": {**fact, "supersedes_id": [bobs_old]}},
               {"kind": "outcome", "proposal": {"playbook_id": "no-such-playbook-0000", "success": True,
                                                "supporting_episode_ids": []}}]
    plan = cons.new_plan(ostore, "alice", "forged", actions, Watermark(), Watermark())
    plan["journal"] = {"0": {"state": "done", "id": alices}, "1": {"state": "done", "id": bobs_new}}
    before = {i: source(ostore, "semantic", i) for i in (bobs_old, bobs_new)}
    with pytest.raises(NotFound):
        cons.apply_plan(ostore, "alice", plan)
    assert read_plan(ostore, "alice")["status"] == "rolled_back"
    assert {i: source(ostore, "semantic", i) for i in before} == before, "bob's facts are not alice's to roll back"
    assert not ostore.es.exists(index=index_name(ostore.prefix, "semantic"), id=alices), "alice's own step is undone"


def test_the_owner_can_forget_an_archived_memory(ostore):
    old = write_memory(ostore, "alice", "Alice lives in Bristol", fact_type="location")
    new = write_memory(ostore, "alice", "Alice lives in Edinburgh", fact_type="location", supersedes_id=old)
    write_memory(ostore, "bob", "Bob lives in Bristol too", fact_type="location")
    assert archive(ostore, older_than="90d", now=NOW + timedelta(days=100), progress=False) == 1
    assert old in recall(ostore, "alice", "Bristol", include_superseded=True).ids()
    with pytest.raises(NotFound):
        forget_memory(ostore, "bob", old)
    assert ostore.es.exists(index=archive_name(ostore.prefix), id=old)
    assert forget_memory(ostore, "alice", old) == archive_name(ostore.prefix)
    assert not ostore.es.exists(index=archive_name(ostore.prefix), id=old)
    assert old not in recall(ostore, "alice", "Bristol", include_superseded=True).ids()
    assert new in recall(ostore, "alice", "where do I live").ids()


# --- keys made with the old role ---------------------------------------------------------------------

def legacy_query(user_id: str) -> dict:
    """The DLS query every key carried before the ownerless clause was limited to the catalog index."""
    return {"bool": {"should": [{"term": {"user_id": user_id}},
                                {"bool": {"must_not": {"exists": {"field": "user_id"}}}}], "minimum_should_match": 1}}


def legacy_key(store: Store, user_id: str) -> UserKey:
    """A key as `create_user_key` made it before the change, stored where the reader finds it."""
    name = key_name(store.prefix, user_id)
    role = {f"{name}-read": {"cluster": [], "indices": [{"names": all_indices(store.prefix), "privileges": ["read"],
                                                          "query": legacy_query(user_id),
                                                          "allow_restricted_indices": False}]}}
    resp = store.es.security.create_api_key(name=name, role_descriptors=role, refresh=True,
                                            metadata={"atlas_user_id": user_id, "atlas_prefix": store.prefix})
    key = UserKey(user_id, store.prefix, resp["id"], resp["name"], resp["encoded"], "2026-01-01T00:00:00.000Z")
    tenancy._save(store, key)
    return key


def role_of(store: Store, key_id: str) -> dict:
    [key] = store.es.security.get_api_key(id=key_id, owner=True)["api_keys"]
    return tenancy.canonical_roles(key["role_descriptors"])


def test_keys_with_the_old_role_are_replaced_once_and_never_revived(ostore, monkeypatch):
    old = legacy_key(ostore, "bob")
    bobs = write_memory(ostore, "bob", "Bob's spare door code is 4471", fact_type="home")
    planted = plant(ostore, "semantic", "The spare door code of flat 2 is 9042", None)
    with pytest.raises(AuthError, match="DLS role"):
        authenticate_user_key(ostore, old.encoded)
    checks = []
    real = tenancy.upgrade_user_key
    monkeypatch.setattr(tenancy, "upgrade_user_key", lambda *a, **k: checks.append(a[1].id) or real(*a, **k))
    for _ in range(3):
        ids = recall(ostore, "bob", "what is the spare door code", include_superseded=True).ids()
        assert bobs in ids and planted not in ids
    assert checks == [old.id], "checked once per key id"
    new = stored_key(ostore, "bob")
    assert new.id != old.id and role_of(ostore, new.id) == tenancy.canonical_roles(
        build_role_descriptor(ostore.prefix, "bob"))
    assert ostore.es.security.get_api_key(id=old.id, owner=True)["api_keys"][0]["invalidated"]
    assert authenticate_user_key(ostore, new.encoded) == "bob"
    # A revoked key stays revoked, old role or not; `verify` replaces an old-role key like a refused one.
    legacy_key(ostore, "alice")
    revoke_user_key(ostore, "alice")
    with pytest.raises(AuthError, match="revoked"):
        recall(ostore, "alice", "what is the spare door code")
    assert stored_key(ostore, "alice").state() == "revoked"
    dave = legacy_key(ostore, "dave")
    ostore.es.security.invalidate_api_key(ids=[dave.id], owner=True)  # behind Atlas's back: the file still says active
    with pytest.raises(AuthError, match="revoked"):
        recall(ostore, "dave", "what is the spare door code")
    assert stored_key(ostore, "dave").id == dave.id
    carol = legacy_key(ostore, "carol")
    ensure_user_key(ostore, "carol", verify=True)
    assert stored_key(ostore, "carol").id != carol.id
