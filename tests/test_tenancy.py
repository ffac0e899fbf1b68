"""Tenant isolation against the real cluster (issue 5): per-user DLS keys, the code filter, the leak sweep.

Every test gets its own prefix (the `store` fixture) and its own secrets folder, so the
real Atlas home is never touched; every API key made for the prefix is
invalidated at the end.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace

import pytest
from elasticsearch import AuthorizationException

from atlas import constants as C
from atlas.cli import app
from atlas.core.documents import build_document, prove_ownership
from atlas.core.errors import AuthError, NotFound, ValidationError
from atlas.core.memory import bulk_load, forget_memory, record_outcome, write_episode, write_memory
from atlas.core.recall import recall
from atlas.core.schemas import all_indices, index_name
from atlas.core.store import Store
from atlas.core.supersession import history
from atlas.research import leaks
from atlas.research.leaks import leak_sweep
from atlas.security import tenancy, tokens
from atlas.security.credentials import credentials_name
from atlas.security.privacy import erase_user
from atlas.security.tenancy import (
    UnrestrictedReadWarning,
    authenticate_user_key,
    build_role_descriptor,
    create_user_key,
    inspect_credential,
    list_user_keys,
    live_prefix_keys_query,
    revoke_user_key,
    rotate_user_key,
    user_client,
    warn_if_service_reads,
)
from atlas.stack import open_store
from tests.conftest import NOW, make_prefix

CRAFTED_IDS = ['a" OR *', "*", "alice OR bob", 'alice"}},{"match_all":{}}]}}', "Alice", "", "a" * 65, "-x",
               "alice\n", "al ice", None, 7]

CATALOG = [
    ("Lumio Hub v2", "Lumio Hub v2 smart home hub with Zigbee and Thread, for every room"),
    ("Thermo T3", "Thermo T3 smart thermostat with a night setback temperature schedule"),
    ("PetCam 2", "PetCam 2 camera to watch your dog, with a treat dispenser"),
]


def load_catalog(store: Store) -> list[str]:
    docs = [build_document(None, text, "catalog", NOW, title=title) for title, text in CATALOG]
    return bulk_load(store, docs, progress=False)


def owners(store: Store, user_id: str, query: str, **kwargs) -> set[str | None]:
    return {hit.user_id for hit in recall(store, user_id, query, **kwargs).hits}


def service_doc(store: Store, index: str, doc_id: str) -> dict:
    doc = store.es.get(index=index, id=doc_id)
    return {"source": doc["_source"], "seq_no": doc["_seq_no"]}


# --- the key and its role ------------------------------------------------------------------


def test_role_descriptor_is_read_only_dls_on_the_prefix():
    role = build_role_descriptor("acme", "alice")
    assert list(role) == ["atlas-acme-alice-read"]
    descriptor = role["atlas-acme-alice-read"]
    assert descriptor["cluster"] == []
    [grant] = descriptor["indices"]
    assert grant["names"] == all_indices("acme") and "acme-archive" in grant["names"]
    assert not any("*" in name for name in grant["names"])
    assert grant["privileges"] == ["indices:data/read/search*", "indices:data/read/msearch*"]
    assert grant["query"] == {"bool": {"should": [
        {"bool": {"filter": [{"term": {"user_id": "alice"}}],
                  "must_not": [{"range": {"user_id": {"lt": "alice"}}}, {"range": {"user_id": {"gt": "alice"}}}]}},
        {"bool": {"filter": [{"term": {"_index": "acme-catalog"}}], "must_not": [{"exists": {"field": "user_id"}}]}},
    ], "minimum_should_match": 1}}


def test_crafted_user_ids_refused(tstore):
    for bad in CRAFTED_IDS:
        for attempt in (lambda u: tenancy.build_dls_query(tstore.prefix, u),
                        lambda u: build_role_descriptor(tstore.prefix, u),
                        lambda u: create_user_key(tstore, u), tstore.read_client):
            with pytest.raises(ValidationError, match="invalid"):
                attempt(bad)
    assert list_user_keys(tstore) == []
    query = {"term": {"metadata.atlas_prefix": tstore.prefix}}
    assert tstore.es.security.query_api_keys(query=query)["api_keys"] == []


def test_create_stores_key_with_metadata_and_role(tstore):
    """The key is stored in the prefix's credentials index, which the key itself (any user's) may not read."""
    key = create_user_key(tstore, "alice", expiration="1d")
    credentials = credentials_name(tstore.prefix)
    assert tstore.es.get(index=credentials, id="key-alice")["_source"]["encoded"] == key.encoded
    assert key.encoded not in repr(key)
    assert [(k.user_id, k.id, k.state()) for k in list_user_keys(tstore)] == [("alice", key.id, "active")]
    with pytest.raises(AuthorizationException):
        user_client(tstore.es, "alice", key.encoded).search(index=credentials)
    info = tstore.es.security.get_api_key(id=key.id, owner=True)["api_keys"][0]
    assert info["metadata"] == {"atlas_user_id": "alice", "atlas_prefix": tstore.prefix}
    assert tenancy.canonical_roles(info["role_descriptors"]) == \
        tenancy.canonical_roles(build_role_descriptor(tstore.prefix, "alice"))
    assert 0 < info["expiration"] - info["creation"] <= 86_400_000
    assert authenticate_user_key(tstore, key.encoded) == "alice"
    report = inspect_credential(user_client(tstore.es, "alice", key.encoded), prefix=tstore.prefix)
    assert report.restricted and report.user_id == "alice" and report.api_key_id == key.id
    with pytest.raises(ValidationError, match="rotate"):
        create_user_key(tstore, "alice")
    with pytest.raises(ValidationError, match="expiration"):
        create_user_key(tstore, "bob", expiration="30 days")


def test_reads_go_through_user_keys_by_default_and_first_write_provisions(tstore):
    assert isinstance(tstore.reader, tenancy.KeyReader)
    write_memory(tstore, "alice", "My hub is in the attic", fact_type="home")
    key = tenancy.stored_key(tstore, "alice")
    assert authenticate_user_key(tstore, key.encoded) == "alice"
    assert tstore.read_client("alice") is not tstore.es
    tenancy.revoke_user_key(tstore, "alice")
    write_memory(tstore, "alice", "My hub is in the loft now", fact_type="home")
    assert tenancy.stored_key(tstore, "alice").state() == "revoked", \
        "a write must not undo a revocation"
    with pytest.raises(AuthError, match="rotate"):
        recall(tstore, "alice", "where is my hub")


def test_drop_invalidates_the_prefix_keys(es, tmp_path):
    store = open_store(make_prefix("drop-keys"), es=es, now=lambda: NOW)
    store.settings = replace(store.settings, home=tmp_path)
    write_episode(store, "alice", "hello", session_id="s1")
    store.drop()
    query = live_prefix_keys_query(store.prefix)
    assert es.security.query_api_keys(query=query)["api_keys"] == []
    assert not es.indices.exists(index=credentials_name(store.prefix))


def test_unknown_user_has_no_reader(tstore):
    with pytest.raises(NotFound, match="atlas users create carol"):
        recall(tstore, "carol", "anything at all")


# --- two users ---------------------------------------------------------------------------


@pytest.fixture
def pair(tstore) -> dict[str, str]:
    """alice and bob, each with a dog, a playbook and an episode; the catalog; keys for both."""
    load_catalog(tstore)
    ids = {
        "alice_dog": write_memory(tstore, "alice", "My dog is called Biscuit", fact_type="person"),
        "bob_dog": write_memory(tstore, "bob", "My dog is called Pepper", fact_type="person"),
        "bob_playbook": write_memory(tstore, "bob", "Fix the dog camera when it drops offline", "procedural",
                                     name="camera fix", steps=["unplug the PetCam", "wait ten seconds", "plug in"]),
        "bob_episode": write_episode(tstore, "bob", "The dog camera dropped offline again tonight", session_id="s1"),
    }
    return ids  # the writes created both users' keys


@pytest.mark.parametrize("code_filter", [True, False], ids=["dls+filter", "dls-only"])
def test_each_user_sees_own_and_catalog(tstore, pair, code_filter):
    tstore.code_filter = code_filter
    for user in ("alice", "bob"):
        seen = owners(tstore, user, "what is my dog called, and the dog camera")
        assert seen == {user, None}, seen
    result = recall(tstore, "alice", "my dog", include_superseded=True)
    assert pair["alice_dog"] in result.ids() and pair["bob_dog"] not in result.ids()
    # The raw key, no filter at all in the query: DLS alone decides.
    alice = tstore.read_client("alice")
    everything = alice.search(index=",".join(all_indices(tstore.prefix)), query={"match_all": {}}, size=100)
    assert {h["_source"].get("user_id") for h in everything["hits"]["hits"]} == {"alice", None}
    assert everything["hits"]["total"]["value"] == 1 + len(CATALOG)


def recall_as_seen(store: Store, user_id: str, query: str, mode: C.RecallMode) -> list[tuple]:
    """Everything a recall hands its tenant of each hit, in order: id, ranks, path scores, fused and second-stage
    scores (hubness included: the embedding stage held it against the cosine)."""
    return [(h.id, h.ranks, h.path_scores, h.score, h.second_stage_score, h.hubness)
            for h in recall(store, user_id, query, mode=mode).hits]


def test_another_tenants_writes_edits_and_erasure_leave_a_recall_bit_identical(tstore):
    """Issue 36, items 1 and 4: BM25's IDF counted every tenant of the shard, so alice's scores told whether bob's
    memories held her words (on the code before the fix: "bm25 scores moved", her best hit's 2.0951438 to 2.0799592
after bob's three facts and three episodes), and an erased
    user's words counted until their segments merged. Weights come from alice's own documents now: what bob writes,
    supersedes, forgets or has erased changes nothing alice is shown, in any mode, to the last bit."""
    load_catalog(tstore)
    for text in ("My quince tree needs pruning every winter", "The hub in the hallway runs the porch light",
                 "I keep the pruning saw in the shed"):
        write_memory(tstore, "alice", text, fact_type="preference")
    write_episode(tstore, "alice", "Should I prune the quince before the frost?", session_id="a1")
    queries = ("when do I prune the quince tree", "where is the pruning saw")
    modes: tuple[C.RecallMode, ...] = ("bm25", "dense", "hybrid", "hybrid+rerank")

    def seen() -> dict:
        return {(q, mode): recall_as_seen(tstore, "alice", q, mode) for q in queries for mode in modes}

    before = seen()
    assert all(before.values())
    bob = [write_memory(tstore, "bob", text, fact_type="preference") for text in (
        "Bob grows a quince by the shed", "Bob's quince jelly recipe needs a pruning saw",
        "Bob is pruning the quince tree in the winter")]
    for i in range(3):
        write_episode(tstore, "bob", f"Where did I put the pruning saw? The quince needs it ({i})", session_id="b1")
    assert seen() == before, "bm25 scores moved"
    write_memory(tstore, "bob", "Bob gave the quince tree away", supersedes_id=bob[2])
    forget_memory(tstore, "bob", bob[0])
    assert seen() == before
    erase_user(tstore, "bob")
    assert seen() == before


def test_service_credential_with_code_filter_does_not_leak_but_warns(tstore, pair):
    tstore.reader = None
    assert tstore.code_filter
    for user in ("alice", "bob"):
        seen = owners(tstore, user, "what is my dog called")
        assert user in seen and seen <= {user, None}, seen  # their own dog is found, no one else's
    with pytest.warns(UnrestrictedReadWarning, match="code filter as the only guard"):
        report = warn_if_service_reads(tstore)
    assert not report.restricted and report.reasons


def test_service_credential_without_code_filter_leaks(tstore, pair):
    """The negative control: without either guard, alice sees bob's dog. The checks above can fail."""
    tstore.reader, tstore.code_filter = None, False
    assert "bob" in owners(tstore, "alice", "what is my dog called")
    with pytest.warns(UnrestrictedReadWarning, match="code filter OFF"):
        warn_if_service_reads(tstore)


def test_other_users_documents_cannot_be_read_or_changed(tstore, pair):
    semantic, procedural = index_name(tstore.prefix, "semantic"), index_name(tstore.prefix, "procedural")
    before = {i: service_doc(tstore, semantic, pair[i]) for i in ("alice_dog", "bob_dog")}
    before["bob_playbook"] = service_doc(tstore, procedural, pair["bob_playbook"])
    attempts = {
        "read": lambda: prove_ownership(tstore, "alice", pair["bob_dog"]),
        "history": lambda: history(tstore, "alice", pair["bob_dog"]),
        "supersede": lambda: write_memory(tstore, "alice", "My dog is called Rex", supersedes_id=pair["bob_dog"]),
        "cite episode": lambda: write_memory(tstore, "alice", "The camera is flaky",
                                             supporting_episode_ids=[pair["bob_episode"]]),
        "update": lambda: record_outcome(tstore, "alice", pair["bob_playbook"], True),
        "forget": lambda: forget_memory(tstore, "alice", pair["bob_dog"]),
    }
    for attempt in attempts.values():
        with pytest.raises(NotFound):
            attempt()
    assert service_doc(tstore, semantic, pair["bob_dog"]) == before["bob_dog"]
    assert service_doc(tstore, procedural, pair["bob_playbook"]) == before["bob_playbook"]
    assert tstore.es.count(index=",".join(all_indices(tstore.prefix)),
                           query={"term": {"user_id": "alice"}})["count"] == 1
    # DLS alone: alice's key does not find bob's document, may not get any (it only searches), and writes nothing.
    alice = tstore.read_client("alice")
    assert alice.search(index=semantic, query={"ids": {"values": [pair["bob_dog"]]}})["hits"]["hits"] == []
    with pytest.raises(AuthorizationException):
        alice.get(index=semantic, id=pair["bob_dog"])
    for write in (lambda: alice.index(index=semantic, document={"text": "x", "user_id": "alice"}),
                  lambda: alice.update(index=semantic, id=pair["alice_dog"], doc={"text": "y"}),
                  lambda: alice.delete(index=semantic, id=pair["alice_dog"])):
        with pytest.raises(AuthorizationException):
            write()
    assert service_doc(tstore, semantic, pair["alice_dog"]) == before["alice_dog"]
    # The positive control: bob may do all of it to his own documents through the same paths.
    assert prove_ownership(tstore, "bob", pair["bob_dog"]).id == pair["bob_dog"]
    record_outcome(tstore, "bob", pair["bob_playbook"], True)
    assert tstore.es.get(index=procedural, id=pair["bob_playbook"])["_source"]["success_count"] == 1
    new = write_memory(tstore, "bob", "My dog is called Pepper the Second", supersedes_id=pair["bob_dog"])
    assert [d["id"] for d in history(tstore, "bob", new)] == [pair["bob_dog"], new]


# --- revocation, rotation, identity ----------------------------------------------------------


def test_revoked_rotated_and_expired_keys(tstore, pair):
    assert owners(tstore, "alice", "my dog") == {"alice", None}
    old = revoke_user_key(tstore, "alice")
    assert tstore.es.security.get_api_key(id=old.id, owner=True)["api_keys"][0]["invalidated"]
    with pytest.raises(AuthError, match=r"key for user alice was revoked or expired: run `atlas users rotate alice`"):
        recall(tstore, "alice", "my dog")
    with pytest.raises(AuthError, match="revoked"):
        authenticate_user_key(tstore, old.encoded)
    new = rotate_user_key(tstore, "alice")
    assert new.id != old.id and owners(tstore, "alice", "my dog") == {"alice", None}
    assert authenticate_user_key(tstore, new.encoded) == "alice"
    # Revoked behind Atlas's back (Kibana, another process): the cached client says the same.
    tstore.es.security.invalidate_api_key(ids=[new.id], owner=True)
    with pytest.raises(AuthError, match="run `atlas users rotate alice`"):
        recall(tstore, "alice", "my dog")
    # Rotating bob's key invalidates the old one at once.
    bob_old = tenancy.stored_key(tstore, "bob")
    rotate_user_key(tstore, "bob", expiration="1s")
    with pytest.raises(AuthError):
        authenticate_user_key(tstore, bob_old.encoded)
    time.sleep(1.5)
    with pytest.raises(AuthError, match="bob was revoked or expired"):
        recall(tstore, "bob", "my dog")
    with pytest.raises(AuthError):
        authenticate_user_key(tstore, tenancy.stored_key(tstore, "bob").encoded)


def test_keys_that_are_not_atlas_user_keys_are_refused(tstore, pair):
    """An admin key planted in the secrets file warns and is refused; forged metadata on a wide key is not believed."""
    wide = tstore.es.security.create_api_key(name=f"atlas-{tstore.prefix}-mallory",
                                             metadata={"atlas_user_id": "mallory", "atlas_prefix": tstore.prefix})
    with pytest.raises(AuthError, match="read-only DLS role"):
        authenticate_user_key(tstore, wide["encoded"])
    admin = tstore.es.security.create_api_key(name="atlas-test-admin", metadata={"atlas_prefix": tstore.prefix})
    report = inspect_credential(user_client(tstore.es, "x", admin["encoded"]), prefix=tstore.prefix)
    assert not report.restricted and "no role descriptors" in report.reasons[0]
    with pytest.raises(AuthError, match="not an Atlas user key"):
        authenticate_user_key(tstore, admin["encoded"])
    planted = replace(tenancy.stored_key(tstore, "alice"), user_id="mallory",
                      id=admin["id"], encoded=admin["encoded"])
    tenancy._save(tstore, planted)
    with pytest.warns(UnrestrictedReadWarning, match="mallory"), pytest.raises(AuthError, match="belongs to None"):
        recall(tstore, "mallory", "my dog")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnrestrictedReadWarning)
        assert owners(tstore, "alice", "my dog") == {"alice", None}
    with pytest.raises(AuthError, match="unknown, revoked or expired"):
        authenticate_user_key(tstore, "bm90OmFrZXk=")


def test_inspect_service_credential(tstore):
    """The service principal reads every memory index without DLS (it writes and checks them), so it
    must never be the reader of a tenant: the report says which role grants that."""
    report = inspect_credential(tstore.es, prefix=tstore.prefix)
    assert not report.restricted and report.api_key_id is None
    assert any(C.SERVICE_PRINCIPAL in reason for reason in report.reasons), report.reasons


# --- the leak sweep -------------------------------------------------------------------------

PETS = ["Biscuit", "Pepper", "Luna", "Miso", "Juniper", "Tango", "Waffles", "Nimbus", "Pickle", "Ziggy", "Clover",
        "Rex"]
CITIES = ["Bristol", "Leeds", "Porto", "Utrecht", "Ghent", "Lyon", "Bergen", "Tartu", "Cork", "Graz", "Bilbao", "Turku"]
ROOMS = ["hallway", "attic", "nursery", "study", "garage", "porch", "cellar", "loft", "kitchen", "den", "pantry", "bay"]


def synthetic_tenants(store: Store, count: int) -> dict[str, list[str]]:
    """`count` tenants with the same kinds of facts but different values; the same questions for all."""
    questions = ["What is my dog called?", "Which city do I live in?", "What is the thermostat set to at night?"]
    tenants: dict[str, list[str]] = {}
    for i in range(count):
        user = f"tenant-{i:02d}"
        write_memory(store, user, f"My dog is called {PETS[i]}", fact_type="person")
        write_memory(store, user, f"I live in {CITIES[i]}, close to the river", fact_type="location")
        write_memory(store, user, f"The thermostat in the {ROOMS[i]} is set to {15 + i} degrees at night",
                     fact_type="home")
        write_episode(store, user, f"The Lumio hub in the {ROOMS[i]} went offline after the storm", session_id=f"s{i}")
        tenants[user] = questions
    return tenants


def test_leak_sweep_over_twelve_tenants(tstore):
    load_catalog(tstore)
    tenants = synthetic_tenants(tstore, 12)
    reader = tstore.reader
    report = leak_sweep(tstore, tenants, k=10, configurations=[*leaks.DEFAULT_GUARDS, "unguarded"], progress=False)
    print(report.table())
    for name in leaks.DEFAULT_GUARDS:
        result = report.results[name]
        assert result.queries == 12 * (3 + 3)
        assert result.leaks == [], report.table()
        assert result.own >= result.queries and result.catalog > 0
    unguarded = report.results["unguarded"]
    assert len(unguarded.leaks) > unguarded.queries, "without any guard every query should surface other tenants"
    assert tstore.reader is reader and tstore.code_filter, "the sweep restores the store"


def test_leak_sweep_needs_two_tenants_and_known_configurations(tstore):
    with pytest.raises(ValidationError, match="two tenants"):
        leak_sweep(tstore, {"alice": ["q"]})
    with pytest.raises(ValidationError, match="configuration"):
        leak_sweep(tstore, {"alice": ["q"], "bob": ["q"]}, configurations=["nope"])


# --- command line ---------------------------------------------------------------------------


def test_cli_users_lifecycle(tstore, runner):
    created = runner.invoke(app, ["users", "create", "alice", "--expiration", "30d", "--prefix", tstore.prefix])
    assert created.exit_code == 0, created.output
    key = tenancy.stored_key(tstore, "alice")
    assert key.expiration == "30d" and key.encoded not in created.output  # the key never leaves the server
    [token] = tokens.list_tokens(tstore)
    assert token.id in created.output and token.user_id == "alice" and token.state() == "active"
    listed = runner.invoke(app, ["users", "list", "--prefix", tstore.prefix])
    assert "alice" in listed.output and "active" in listed.output and key.encoded not in listed.output
    assert key.id in listed.output and token.id in listed.output
    rotated = runner.invoke(app, ["users", "rotate", "alice", "--prefix", tstore.prefix])
    new = tenancy.stored_key(tstore, "alice")
    assert rotated.exit_code == 0 and new.id != key.id and new.encoded not in rotated.output
    revoked = runner.invoke(app, ["users", "revoke", "alice", "--prefix", tstore.prefix])
    assert revoked.exit_code == 0 and "1 live key(s)" in revoked.output and "1 token(s)" in revoked.output
    assert "revoked" in runner.invoke(app, ["users", "list", "--prefix", tstore.prefix]).output
    failed = runner.invoke(app, ["users", "create", "a OR b", "--prefix", tstore.prefix])
    assert failed.exit_code == 1 and "invalid" in failed.output
    assert tenancy.stored_key(tstore, "alice").revoked_at
