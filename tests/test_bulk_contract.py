"""`bulk_load` says what it wrote: `ValidationError` only when nothing was, else `PartialWrite` with the ids."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from atlas.config import load_settings
from atlas.core.documents import build_document
from atlas.core.errors import EmbeddingError, PartialWrite, ValidationError
from atlas.core.memory import bulk_load
from atlas.core.store import Store
from atlas.stack import open_store
from tests.conftest import make_prefix

BATCH = 2
#: Any fixed time: what is tested is which documents are written, not when.
WHEN = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def episodes(count: int, *, bad: set[int] = frozenset()) -> list[dict]:
    """`count` episodes of sarah; those at the positions in `bad` have a timestamp the mapping refuses."""
    docs = [build_document("sarah", f"episode number {i} about the porch light", "episodic", WHEN)
            for i in range(count)]
    for i in bad:
        docs[i]["timestamp"] = "not a date"
    return docs


def stored(store: Store) -> dict[str, str]:
    """Every document of the prefix: id -> text."""
    store.es.indices.refresh(index=store.indices)
    hits = store.es.search(index=store.indices, query={"match_all": {}}, size=100, source_includes=["text"])
    return {hit["_id"]: hit["_source"]["text"] for hit in hits["hits"]["hits"]}


def test_a_refusal_after_earlier_batches_reports_every_written_document(store):
    """Three batches, a bad document second in the second one: the first batch and the good document of the
    second are written and reported; the third batch is not sent."""
    docs = episodes(3 * BATCH, bad={BATCH + 1})
    with pytest.raises(PartialWrite) as info:
        bulk_load(store, docs, batch=BATCH, progress=False)
    error = info.value
    assert not isinstance(error, ValidationError), "ValidationError promises that nothing was written"
    assert len(error.indexed_ids) == BATCH + 1
    assert stored(store) == {doc_id: docs[i]["text"] for i, doc_id in enumerate(error.indexed_ids)}
    message = str(error)
    assert "3 documents were indexed" in message and "delete them" in message and "document 3" in message
    assert "\n" not in message


def test_with_ids_the_reload_overwrites_what_was_written(store):
    docs = episodes(3 * BATCH, bad={BATCH + 1})
    ids = [f"bulk-contract-{i}" for i in range(len(docs))]
    with pytest.raises(PartialWrite) as info:
        bulk_load(store, docs, batch=BATCH, progress=False, ids=ids)
    assert info.value.indexed_ids == ids[:BATCH + 1]
    assert "same ids" in str(info.value)
    assert set(stored(store)) == set(ids[:BATCH + 1])
    assert bulk_load(store, episodes(3 * BATCH), batch=BATCH, progress=False, ids=ids) == ids
    assert set(stored(store)) == set(ids), "a reload with the same ids duplicates nothing"


def test_good_documents_of_the_first_batch_are_written_too(store):
    """Within a batch `_bulk` indexes the good documents even when one is refused."""
    docs = episodes(BATCH, bad={0})
    with pytest.raises(PartialWrite) as info:
        bulk_load(store, docs, batch=BATCH, progress=False)
    assert len(info.value.indexed_ids) == 1
    assert stored(store) == {info.value.indexed_ids[0]: docs[1]["text"]}


def test_a_first_batch_refused_whole_is_a_validation_error_and_writes_nothing(store):
    with pytest.raises(ValidationError, match="nothing was written"):
        bulk_load(store, episodes(3 * BATCH, bad={0, 1}), batch=BATCH, progress=False)
    assert stored(store) == {}


def test_ids_must_match_the_documents(store):
    with pytest.raises(ValidationError, match="one id per document"):
        bulk_load(store, episodes(2), progress=False, ids=["only-one"])
    assert stored(store) == {}


def test_an_embedding_failure_writes_nothing(store, monkeypatch):
    """Every document is embedded before any is sent (hubness needs the whole load's vectors): a batch that
    cannot be embedded, even the last, raises the model's error and leaves the prefix empty."""
    docs = episodes(4 * BATCH)
    inner = store.embedder.embed_passages

    def embed(texts):
        if any(text == docs[-1]["text"] for text in texts):
            raise EmbeddingError("the model ran out of memory")
        return inner(texts)

    monkeypatch.setattr(store.embedder, "embed_passages", embed)
    with pytest.raises(EmbeddingError, match="ran out of memory"):
        bulk_load(store, docs, batch=BATCH, progress=False)
    assert stored(store) == {}


def test_a_cold_load_without_progress_draws_nothing(es, tmp_path, capfd):
    """`progress=False` silences the whole load: the store's embedding caches, empty here, draw no bars of
    their own (a cold cache once drew them on stderr in a notebook that asked for none)."""
    settings = replace(load_settings(), home=tmp_path)  # an empty embedding cache; the models are loaded already
    cold = open_store(make_prefix("cold-load"), settings=settings, es=es, tenancy=False, now=lambda: WHEN)
    try:
        docs = [build_document("sarah", f"cold cache text {i} {uuid.uuid4().hex}", "episodic", WHEN)
                for i in range(100)]
        capfd.readouterr()
        assert len(bulk_load(cold, docs, progress=False)) == 100
        assert capfd.readouterr().err == ""
    finally:
        cold.drop()
