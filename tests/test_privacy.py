"""Privacy operations against the real cluster: erase, export and import one user's memory.

Alice has an episode, a playbook and a chain of three facts: the first archived, the second
superseded, the third current. Bob has memory of his own, which nothing here may touch.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from atlas.cli import app
from atlas.consolidation.consolidate import ensure_state_name
from atlas.core.errors import AuthError, ValidationError
from atlas.core.memory import write_episode, write_memory
from atlas.core.recall import recall
from atlas.core.schemas import all_indices, archive_name, index_name, state_name
from atlas.core.store import Store
from atlas.core.supersession import archive, history
from atlas.security import tokens
from atlas.security.privacy import erase_user, export_user, import_user
from atlas.stack import open_store
from tests.conftest import NOW, make_prefix

QUERIES = ["Where does Alice live?", "How do I reset the hub?", "When did I move?"]


@pytest.fixture
def memory(tstore) -> dict:
    """Both users with a key and a token, then their memory; Alice's first fact is archived."""
    issued = {user: tokens.create_user(tstore, user) for user in ("alice", "bob")}
    ids = {"episode": write_episode(tstore, "alice", "I moved from Paris to Lyon in March", session_id="s1"),
           "playbook": write_memory(tstore, "alice", "Reset the hub", "procedural", trigger="hub unresponsive",
                                    steps=["unplug the hub", "wait ten seconds", "plug it back in"]),
           "f1": write_memory(tstore, "alice", "Alice lives in Paris", fact_type="location")}
    ids["f2"] = write_memory(tstore, "alice", "Alice lives in Lyon", supersedes_id=ids["f1"])
    assert archive(tstore, older_than="90d", now=NOW + timedelta(days=100), progress=False) == 1
    ids["f3"] = write_memory(tstore, "alice", "Alice lives in Lyon, in the Croix-Rousse", supersedes_id=ids["f2"])
    tstore.es.index(index=ensure_state_name(tstore), id="watermark-alice", refresh=True,
                    document={"kind": "watermark", "user_id": "alice"})
    bob = [write_memory(tstore, "bob", "Bob lives in Paris", fact_type="location"),
           write_episode(tstore, "bob", "My hub keeps dropping off the network")]
    return {"issued": issued, "alice": ids, "bob": bob}


def owned(store: Store, user_id: str) -> dict[str, str]:
    """id -> index of every document naming the user in the prefix (service credential)."""
    indices = ",".join([*all_indices(store.prefix), state_name(store.prefix)])
    store.es.indices.refresh(index=indices, ignore_unavailable=True)
    hits = store.es.search(index=indices, query={"term": {"user_id": user_id}}, size=100,
                           ignore_unavailable=True)["hits"]["hits"]
    return {hit["_id"]: hit["_index"] for hit in hits}


def top_hits(store: Store) -> list[list[str]]:
    return [recall(store, "alice", q, k=4, include_superseded=True).ids() for q in QUERIES]


def fresh_store(tstore: Store) -> Store:
    """Another prefix with the same models, clock and secrets folder."""
    return open_store(make_prefix("privacy-import"), es=tstore.es, embedder=tstore.embedder,
                      second_stage=tstore.second_stage, now=lambda: NOW, settings=tstore.settings)


def test_erase_removes_everything_of_alice_and_nothing_of_bob_and_is_idempotent(tstore, memory):
    alice = memory["alice"]
    assert owned(tstore, "alice")[alice["f1"]] == archive_name(tstore.prefix)
    bob_before = owned(tstore, "bob")
    report = erase_user(tstore, "alice")
    p = tstore.prefix
    assert report.deleted[index_name(p, "semantic")] == 2  # f2 (superseded) and f3
    assert report.deleted[archive_name(p)] == 1 and report.deleted[state_name(p)] == 1
    assert report.deleted[index_name(p, "episodic")] == 1 and report.deleted[index_name(p, "procedural")] == 1
    assert report.documents == 6 and report.key_ids and report.token_ids == [memory["issued"]["alice"].token.id]
    assert owned(tstore, "alice") == {}
    assert owned(tstore, "bob") == bob_before
    verifier = tokens.TokenVerifier(tstore.es, tstore.prefix)
    with pytest.raises(AuthError, match="revoked"):
        verifier.verify(memory["issued"]["alice"].secret)
    assert verifier.verify(memory["issued"]["bob"].secret) == "bob"
    again = erase_user(tstore, "alice")
    assert again.documents == 0 and again.key_ids == [] and again.token_ids == []
    assert erase_user(tstore, "nobody").documents == 0  # a user the prefix never saw: nothing to do, no error


def test_export_has_no_vectors_and_keeps_links(tstore, memory):
    alice = memory["alice"]
    lines = {line["_id"]: line for line in export_user(tstore, "alice", batch=2)}  # several pages
    assert set(lines) == set(alice.values())
    assert {line["_index"] for line in lines.values()} == {"episodic", "procedural", "semantic", "archive"}
    assert lines[alice["f1"]]["_index"] == "archive"
    for line in lines.values():
        assert line["_source"]["user_id"] == "alice"
        assert not {"embedding", "rerank_embedding", "sentences", "embed_model"} & set(line["_source"])
        json.dumps(line)
    assert lines[alice["f2"]]["_source"]["supersedes"] == [alice["f1"]]
    assert lines[alice["f2"]]["_source"]["superseded_by"] == alice["f3"]
    assert lines[alice["f1"]]["_source"]["superseded_by"] == alice["f2"]


def test_import_into_a_fresh_prefix_restores_recall_and_history(tstore, memory):
    alice = memory["alice"]
    before = top_hits(tstore)
    assert all(before) and alice["f3"] in before[0]
    chain = [d["id"] for d in history(tstore, "alice", alice["f3"])]
    assert chain == [alice["f1"], alice["f2"], alice["f3"]]
    lines = list(export_user(tstore, "alice"))
    target = fresh_store(tstore)
    try:
        report = import_user(target, lines, user_id="alice")
        assert report.imported == {"episodic": 1, "procedural": 1, "semantic": 2, "archive": 1}
        assert owned(target, "alice")[alice["f1"]] == archive_name(target.prefix)
        assert top_hits(target) == before
        assert [d["id"] for d in history(target, "alice", alice["f3"])] == chain
        import_user(target, lines)  # again: overwritten, not duplicated
        assert len(owned(target, "alice")) == len(lines)
    finally:
        target.drop()


def test_import_refuses_foreign_lines(tstore, memory):
    lines = list(export_user(tstore, "alice")) + list(export_user(tstore, "bob"))
    target = fresh_store(tstore)
    try:
        with pytest.raises(ValidationError, match="belongs to bob, not alice"):
            import_user(target, lines, user_id="alice")
        with pytest.raises(ValidationError, match="belongs to bob, not alice"):
            import_user(target, lines)  # the first line's owner
        with pytest.raises(ValidationError, match="belongs to alice, not bob"):
            import_user(target, lines, user_id="bob")
        forged = {**lines[0], "_source": {**lines[0]["_source"], "user_id": ["alice", "bob"]}}
        with pytest.raises(ValidationError, match="exactly one user"):
            import_user(target, [forged])
        with pytest.raises(ValidationError, match="_index"):
            import_user(target, [{**lines[0], "_index": "catalog"}])
        assert owned(target, "alice") == {} and owned(target, "bob") == {}
    finally:
        target.drop()


def test_cli_export_import_erase(tstore, memory, runner, tmp_path):
    out = tmp_path / "alice.jsonl"
    exported = runner.invoke(app, ["users", "export", "alice", "--prefix", tstore.prefix, "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    assert len(out.read_text().splitlines()) == len(memory["alice"])
    to_stdout = runner.invoke(app, ["users", "export", "alice", "--prefix", tstore.prefix])
    assert json.loads(to_stdout.stdout.splitlines()[0])["_source"]["user_id"] == "alice"
    target = fresh_store(tstore)
    try:
        imported = runner.invoke(app, ["users", "import", str(out), "--prefix", target.prefix, "--user", "alice"])
        assert imported.exit_code == 0, imported.output
        assert set(owned(target, "alice")) == set(memory["alice"].values())
        refused = runner.invoke(app, ["users", "import", str(out), "--prefix", target.prefix, "--user", "bob"])
        assert refused.exit_code == 1 and "belongs to alice, not bob" in refused.output
    finally:
        target.drop()
    kept = runner.invoke(app, ["users", "erase", "alice", "--prefix", tstore.prefix], input="n\n")
    assert kept.exit_code == 1 and len(owned(tstore, "alice")) == 6
    erased = runner.invoke(app, ["users", "erase", "alice", "--prefix", tstore.prefix, "--yes"])
    assert erased.exit_code == 0 and "6 document(s)" in erased.output and "1 token(s) revoked" in erased.output
    assert owned(tstore, "alice") == {} and owned(tstore, "bob")
