"""Writing memory: episodes, facts, playbooks, catalog items; forgetting; counters.

Writes use the service credential and take the owner from the caller (the MCP layer
takes it from the authenticated key, never from the request). Every change to an
existing document first proves ownership with a read through the user's own client,
then updates with optimistic concurrency (`if_seq_no`/`if_primary_term`): this
cluster has no script engine, so counters are read-modify-write with retries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from elasticsearch import ConflictError as ESConflict
from elasticsearch import NotFoundError, helpers
from tqdm.auto import tqdm

from . import constants as C
from .clock import as_utc, es_date
from .errors import ConflictError, NotFound, ValidationError
from .schemas import MODEL_FIELDS, archive_name, index_name
from .scoring import smoothed_success_rate
from .store import Store
from .validation import (check_choice, check_context, check_flag, check_id, check_ids, check_label, check_steps,
                         check_text, check_type, check_user, check_when)

#: Fields that hold vectors, left out of what recall reads back.
VECTOR_FIELDS = ("embedding", "rerank_embedding", "sentences")
#: Where a sentence ends: ., ! or ? before white space.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Owned:
    """A document the user was shown to own, with what an OCC update needs."""

    id: str
    index: str
    source: dict
    seq_no: int
    primary_term: int


# --- building documents --------------------------------------------------------------


def build_document(user_id: str | None, text: str, memory_type: C.MemoryType, now: datetime, **fields: object) -> dict:
    """The stored form of a memory, without vectors. `None` fields are left out."""
    stamp = es_date(now)
    doc: dict = {"text": text, "memory_type": memory_type, "created_at": stamp, "confidence": 1.0}
    if user_id is not None:
        doc["user_id"] = user_id
    if memory_type == "episodic":
        doc["timestamp"] = stamp
    if memory_type == "semantic":
        doc.update(last_used_at=stamp, use_count=0)
    if memory_type == "procedural":
        doc.update(success_count=0, failure_count=0, success_rate=smoothed_success_rate(0, 0))
    doc.update({k: (es_date(v) if isinstance(v, datetime) else v) for k, v in fields.items() if v is not None})
    return doc


Message = TypeVar("Message")


def context_before(messages: Sequence[Message], i: int) -> list[Message]:
    """The context of a session's i-th message: the `CONTEXT_MESSAGES` messages before it, oldest first."""
    return list(messages[max(0, i - C.CONTEXT_MESSAGES):i])


def passage_text(doc: dict) -> str:
    """What is embedded: the text, after the message it replies to when there is one (a bare "yes,
    that one" means nothing alone). Earlier messages of the context are searched by BM25 only."""
    context = doc.get("context")
    if not context:
        return doc["text"]
    return f"{context if isinstance(context, str) else context[-1]}\n{doc['text']}"


def passage_sentences(doc: dict) -> list[str]:
    """A speaker's several sentences, each headed by the speaker ("Maria: ...") and embedded alone.

    Only for documents that name a speaker (a multi-party transcript such as LoCoMo): in a long turn
    the speaker's name and one thing said sit together in a vector of their own, and the kNN path
    takes a passage's best vector. Plain sentences, without the name, gained nothing
    (docs/evaluation.md, change 13).
    """
    if not doc.get("speaker"):
        return []
    header = f"{doc['speaker']}: "
    sentences = [s for s in SENTENCE_END.split(doc["text"].removeprefix(header))
                 if len(s.split()) >= C.SENTENCE_MIN_WORDS]
    return [header + s for s in sentences] if len(sentences) > 1 else []


def embed_documents(store: Store, docs: Sequence[dict]) -> None:
    """Fill every vector field of `docs` in place, in batches (the cache skips known texts)."""
    texts = [passage_text(doc) for doc in docs]
    for field, embedder in store.passage_embedders.items():
        vectors = embedder.embed_passages(texts)
        for doc, vector in zip(docs, vectors):
            doc[field] = vector.tolist()
            doc[MODEL_FIELDS[field]] = embedder.name
    sentences = [passage_sentences(doc) for doc in docs]
    flat = [s for group in sentences for s in group]
    if not flat:  # most writes: no model call, no cache lookup
        return
    vectors = iter(store.embedder.embed_passages(flat))
    for doc, group in zip(docs, sentences):
        if group:
            doc["sentences"] = [{"embedding": next(vectors).tolist()} for _ in group]


def _provision(store: Store, user_ids: Iterable[str | None]) -> None:
    """Give each writing user their read key before their first document exists."""
    if store.provision is not None:
        for user_id in dict.fromkeys(u for u in user_ids if u is not None):
            store.provision(user_id)


def _index(store: Store, doc: dict, *, refresh: str | None = None) -> str:
    _provision(store, [doc.get("user_id")])
    embed_documents(store, [doc])
    resp = store.es.index(index=index_name(store.prefix, doc["memory_type"]), document=doc,
                          refresh=refresh or store.refresh)
    return resp["_id"]


# --- writes ------------------------------------------------------------------------


def write_episode(store: Store, user_id: str, text: str, session_id: str | None = None,
                  ts: datetime | None = None, context: str | Sequence[str] | None = None,
                  speaker: str | None = None) -> str:
    """Store the user's turn verbatim before the model answers; visible to a recall in the same turn.

    `context` is the message the turn replies to (the assistant's last answer), or the messages it
    follows, oldest first, ending with that one: stored beside the text and searched at a lower
    weight; the message it replies to is also embedded with it. `speaker` names who said the turn
    in a conversation of several people (`passage_sentences`).
    """
    check_user(user_id)
    check_text(text)
    if context is not None:
        context = check_context(context)
    doc = build_document(user_id, text, "episodic", store.now(), session_id=check_label(session_id, "session_id"),
                         context=context, speaker=check_label(speaker, "speaker"))
    if ts is not None:
        doc["timestamp"] = es_date(check_when(ts, "ts"))
    return _index(store, doc)


def write_memory(store: Store, user_id: str, text: str, memory_type: C.MemoryType = "semantic", *,
                 supersedes_id: str | Sequence[str] | None = None, contradiction: C.Contradiction = "natural",
                 fact_type: C.FactType | None = None, confidence: float = 1.0,
                 supporting_episode_ids: Sequence[str] = (), session_id: str | None = None,
                 name: str | None = None, trigger: str | None = None, steps: Sequence[str] | None = None,
                 context: str | Sequence[str] | None = None) -> str:
    """Write a fact, playbook or episode; with `supersedes_id`, retire the fact(s) it makes false.

    `context` (episodes only) is what the episode replies to, as in `write_episode`.
    """
    check_user(user_id)
    check_text(text)
    check_type(memory_type, C.USER_MEMORY_TYPES)
    if context is not None:
        context = check_context(context)
        if memory_type != "episodic":
            raise ValidationError(f"only an episode has a context (the message it replies to), "
                                  f"not a {memory_type} memory")
    check_choice(contradiction, C.CONTRADICTIONS, "contradiction")
    if fact_type is not None:
        check_choice(fact_type, C.FACT_TYPES, "fact_type")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.0 <= confidence <= 1.0:
        raise ValidationError(f"confidence must be between 0 and 1, not {confidence!r}")
    check_label(session_id, "session_id")
    check_label(name, "name")
    if trigger is not None:
        check_text(trigger, "trigger")
    steps = check_steps(steps) if steps is not None else None
    supporting_episode_ids = check_ids(supporting_episode_ids, "supporting_episode_ids")
    if memory_type == "procedural" and not steps:
        raise ValidationError("a procedural memory needs its ordered `steps`")
    fields = dict(fact_type=fact_type, confidence=float(confidence), session_id=session_id, name=name,
                  trigger=trigger, steps=list(steps) if steps else None, context=context,
                  supporting_episode_ids=list(supporting_episode_ids) or None)
    for episode in supporting_episode_ids:
        owned(store, user_id, episode, types=("episodic",))
    if supersedes_id is not None:
        from .supersession import supersede  # supersession builds on this module

        old_ids = check_ids(supersedes_id, "supersedes_id")
        return supersede(store, user_id, old_ids, text, memory_type, contradiction=contradiction, **fields)
    return _index(store, build_document(user_id, text, memory_type, store.now(), **fields))


def forget_memory(store: Store, user_id: str, doc_id: str) -> str:
    """Hard delete, only on an explicit request, only of the user's own document. Returns its index."""
    doc = owned(store, user_id, doc_id)
    store.es.delete(index=doc.index, id=doc.id, refresh=store.refresh)
    return doc.index


def owned(store: Store, user_id: str, doc_id: str, *, types: Iterable[C.MemoryType] = C.USER_MEMORY_TYPES,
          archive: bool = False) -> Owned:
    """Prove `user_id` owns `doc_id` by reading it through the user's own client.

    Another user's id and an unknown id raise the same `NotFound`: the caller learns
    nothing about documents it may not see.
    """
    check_user(user_id)
    check_id(doc_id)
    indices = [index_name(store.prefix, t) for t in types] + ([archive_name(store.prefix)] if archive else [])
    body = build_owned_query(user_id, doc_id)
    resp = store.read_client(user_id).search(index=",".join(indices), **body)
    hits = resp["hits"]["hits"]
    if not hits:
        raise NotFound(f"no memory {doc_id} belongs to user {user_id}")
    hit = hits[0]
    return Owned(hit["_id"], hit["_index"], hit["_source"], hit["_seq_no"], hit["_primary_term"])


def build_owned_query(user_id: str, doc_id: str) -> dict:
    return {"query": {"bool": {"filter": [{"ids": {"values": [doc_id]}}, {"term": {"user_id": user_id}}]}},
            "seq_no_primary_term": True, "size": 1, "_source": {"excludes": list(VECTOR_FIELDS)},
            "ignore_unavailable": True}


def update_owned(store: Store, user_id: str, doc: Owned, change: callable, *, refresh: str | None = None) -> dict:
    """Apply `change(source) -> partial doc` with optimistic concurrency, re-reading on conflict."""
    current = doc
    for _ in range(C.OCC_RETRIES):
        partial = change(current.source)
        try:
            store.es.update(index=current.index, id=current.id, doc=partial, if_seq_no=current.seq_no,
                            if_primary_term=current.primary_term, refresh=refresh or "false")
            return partial
        except ESConflict:
            try:
                fresh = store.es.get(index=current.index, id=current.id, source_excludes=list(VECTOR_FIELDS))
            except NotFoundError:
                raise NotFound(f"memory {doc.id} was deleted meanwhile") from None
            if fresh["_source"].get("user_id") != user_id:
                raise NotFound(f"no memory {doc.id} belongs to user {user_id}") from None
            current = Owned(fresh["_id"], fresh["_index"], fresh["_source"], fresh["_seq_no"], fresh["_primary_term"])
        except NotFoundError:
            raise NotFound(f"memory {doc.id} was deleted meanwhile") from None
    raise ConflictError(f"memory {doc.id} kept changing under {C.OCC_RETRIES} attempts; retry later")


def record_use(store: Store, user_id: str, hits: Sequence[Owned]) -> None:
    """After a recall: bump use_count and refresh last_used_at of the semantic facts returned.

    One `_bulk` of OCC partial updates; the few that conflict (a concurrent recall) are
    retried one by one, so ten concurrent recalls of a fact end with use_count + 10.
    """
    if not hits:
        return
    stamp = es_date(store.now())

    def bump(source: dict) -> dict:
        return {"use_count": int(source.get("use_count", 0)) + 1, "last_used_at": stamp}

    ops = [{"_op_type": "update", "_index": h.index, "_id": h.id, "if_seq_no": h.seq_no,
            "if_primary_term": h.primary_term, "doc": bump(h.source)} for h in hits]
    _, errors = helpers.bulk(store.es, ops, raise_on_error=False, refresh=False)
    conflicted = {e["update"]["_id"] for e in errors if e.get("update", {}).get("status") == 409}
    for hit in hits:
        if hit.id in conflicted:
            update_owned(store, user_id, hit, bump)


def record_outcome(store: Store, user_id: str, playbook_id: str, success: bool, *,
                   refined_steps: Sequence[str] | None = None) -> dict:
    """A playbook worked ("thanks, that worked") or did not; keeps the smoothed success rate beside the counts."""
    check_flag(success, "success")
    refined_steps = check_steps(refined_steps, "refined_steps") if refined_steps is not None else None
    doc = owned(store, user_id, playbook_id, types=("procedural",))
    stamp = es_date(store.now())

    def outcome(source: dict) -> dict:
        wins = int(source.get("success_count", 0)) + int(success)
        losses = int(source.get("failure_count", 0)) + int(not success)
        partial = {"success_count": wins, "failure_count": losses, "success_rate": smoothed_success_rate(wins, losses)}
        if success:
            partial["last_success_at"] = stamp
        if refined_steps:
            partial["refined_steps"] = list(refined_steps)
        return partial

    return update_owned(store, user_id, doc, outcome, refresh=store.refresh)


# --- bulk loading --------------------------------------------------------------------


def bulk_load(store: Store, docs: Sequence[dict], *, progress: bool = True, batch: int = 256,
              refresh: bool = True, ids: Sequence[str] | None = None) -> list[str]:
    """Index prepared documents (from `build_document`) with their vectors; returns ids in order.

    Used by data-set loaders and the catalog; the embedding cache makes reruns cheap. `ids`, when
    given, are used instead of Elasticsearch's own.
    """
    _provision(store, (d.get("user_id") for d in docs))
    assigned: list[str] = []
    bar = tqdm(total=len(docs), desc="indexing", unit="doc", disable=not progress)
    for start in range(0, len(docs), batch):
        chunk = [dict(d) for d in docs[start:start + batch]]
        embed_documents(store, chunk)
        ops = [{"index": {"_index": index_name(store.prefix, d["memory_type"]),
                          **({"_id": ids[start + i]} if ids else {})}} for i, d in enumerate(chunk)]
        body = [line for pair in zip(ops, chunk) for line in pair]
        resp = store.es.bulk(operations=body, refresh=False)
        failed = [item["index"] for item in resp["items"] if item["index"].get("error")]
        if failed:
            raise ValidationError(f"{len(failed)} documents were refused, first: {failed[0]['error']}")
        assigned += [item["index"]["_id"] for item in resp["items"]]
        bar.update(len(chunk))
    bar.close()
    if refresh:
        store.es.indices.refresh(index=store.indices)
    return assigned


def parse_when(value: str | datetime) -> datetime:
    """Accept a datetime or an ISO string (loaders read JSON)."""
    return as_utc(value) if isinstance(value, datetime) else as_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
