"""Writing memory: episodes, facts, playbooks, catalog items; forgetting; counters; bulk loads.

Writes use the service credential and take the owner from the caller (the MCP layer
takes it from the authenticated key, never from the request). Every change to an
existing document first proves ownership with a read through the user's own client,
then updates with optimistic concurrency (`atlas.core.documents`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TypedDict

from elasticsearch import ApiError, TransportError, helpers
from tqdm.auto import tqdm

from atlas import constants as C
from atlas.core.clock import as_utc, es_date
from atlas.core.documents import (
    Owned,
    build_document,
    embed_documents,
    index_document,
    prove_ownership,
    provision_users,
    routing_of,
    target_index,
    update_owned,
)
from atlas.core.errors import AtlasError, PartialWrite, ValidationError
from atlas.core.hubness import attach_hubness
from atlas.core.schemas import index_name
from atlas.core.scoring import smoothed_success_rate
from atlas.core.store import Store
from atlas.core.supersession import splice, supersede
from atlas.core.validation import (
    check_choice,
    check_context,
    check_flag,
    check_ids,
    check_label,
    check_number,
    check_owner,
    check_steps,
    check_text,
    check_type,
    check_user,
    check_valid_time,
    check_when,
)

# --- writes ------------------------------------------------------------------------


class MemoryFields(TypedDict, total=False):
    """The optional fields `write_memory` stores beside the text (`None`: left out, see `build_document`)."""

    fact_type: C.FactType | None
    confidence: float
    session_id: str | None
    name: str | None
    trigger: str | None
    steps: list[str] | None
    context: str | list[str] | None
    supporting_episode_ids: list[str] | None
    valid_from: datetime | None
    valid_to: datetime | None


def write_episode(store: Store, user_id: str, text: str, *, session_id: str | None = None,
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
    return index_document(store, doc)


def write_memory(store: Store, user_id: str, text: str, memory_type: C.MemoryType = "semantic", *,
                 supersedes_id: str | Sequence[str] | None = None, contradiction: C.Contradiction = "natural",
                 fact_type: C.FactType | None = None, confidence: float = 1.0,
                 supporting_episode_ids: Sequence[str] = (), session_id: str | None = None,
                 name: str | None = None, trigger: str | None = None, steps: Sequence[str] | None = None,
                 context: str | Sequence[str] | None = None, valid_from: datetime | None = None,
                 valid_to: datetime | None = None) -> str:
    """Write a fact, playbook or episode; with `supersedes_id`, retire the fact(s) it makes false.

    `context` (episodes only) is what the episode replies to, as in `write_episode`. `valid_from` and `valid_to`
    (facts only) say when the fact held, where the writer knows: without `valid_from`, the start of a period the
    text names, else the write time (`build_document`); without `valid_to`, until a fact supersedes it.
    """
    check_user(user_id)
    check_text(text)
    check_type(memory_type, allowed=C.USER_MEMORY_TYPES)
    if context is not None:
        context = check_context(context)
        if memory_type != "episodic":
            raise ValidationError(f"only an episode has a context (the message it replies to), "
                                  f"not a {memory_type} memory")
    check_choice(contradiction, C.CONTRADICTIONS, "contradiction")
    if fact_type is not None:
        check_choice(fact_type, C.FACT_TYPES, "fact_type")
    check_number(confidence, low=0.0, high=1.0, what="confidence")
    check_label(session_id, "session_id")
    check_label(name, "name")
    if trigger is not None:
        check_text(trigger, what="trigger")
    steps = check_steps(steps) if steps is not None else None
    supporting_episode_ids = check_ids(supporting_episode_ids, what="supporting_episode_ids")
    if memory_type == "procedural" and not steps:
        raise ValidationError("a procedural memory needs its ordered `steps`")
    check_valid_time(memory_type, valid_from, valid_to, now=store.now())
    fields: MemoryFields = {"fact_type": fact_type, "confidence": float(confidence), "session_id": session_id,
                            "valid_from": valid_from, "valid_to": valid_to, "name": name, "trigger": trigger,
                            "steps": list(steps) if steps else None, "context": context,
                            "supporting_episode_ids": list(supporting_episode_ids) or None}
    for episode in supporting_episode_ids:
        prove_ownership(store, user_id, episode, types=("episodic",))
    if supersedes_id is not None:
        old_ids = check_ids(supersedes_id, what="supersedes_id")
        return supersede(store, user_id, old_ids, text, memory_type, contradiction=contradiction, **fields)
    return index_document(store, build_document(user_id, text, memory_type, store.now(), **fields))


def forget_memory(store: Store, user_id: str, doc_id: str) -> str:
    """Hard delete, only on an explicit request, only of the user's own document. Returns its index.

    The archive too: a retired fact is still recalled with `include_superseded`, so its owner must be
    able to forget it there. A fact in an audit chain is spliced out of it (`supersession.splice`): the
    chain stays walkable, and forgetting its head makes the fact before it current again.
    """
    doc = prove_ownership(store, user_id, doc_id, archive=True)
    splice(store, user_id, doc)  # first: a forget that fails half-way is retried, and never leaves a dangling link
    store.es.delete(index=doc.index, id=doc.id, routing=doc.routing, refresh=store.refresh)
    return doc.index


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

    ops = [{"_op_type": "update", "_index": h.index, "_id": h.id, "routing": h.routing, "if_seq_no": h.seq_no,
            "if_primary_term": h.primary_term, "doc": bump(h.source)} for h in hits]
    _, errors = helpers.bulk(store.es, ops, raise_on_error=False, refresh=False)
    # `errors` is the list of failed items (a count only with stats_only=True).
    failed = errors if isinstance(errors, list) else []
    conflicted = {e["update"]["_id"] for e in failed if e.get("update", {}).get("status") == 409}
    for hit in hits:
        if hit.id in conflicted:
            update_owned(store, user_id, hit, bump)


def record_outcome(store: Store, user_id: str, playbook_id: str, success: bool, *,
                   refined_steps: Sequence[str] | None = None) -> dict:
    """A playbook worked ("thanks, that worked") or did not; keeps the smoothed success rate beside the counts."""
    check_flag(success, "success")
    refined_steps = check_steps(refined_steps, what="refined_steps") if refined_steps is not None else None
    doc = prove_ownership(store, user_id, playbook_id, types=("procedural",))
    stamp = es_date(store.now())

    def outcome(source: dict) -> dict:
        wins = int(source.get("success_count", 0)) + int(success)
        losses = int(source.get("failure_count", 0)) + int(not success)
        partial: dict[str, object] = {"success_count": wins, "failure_count": losses,
                                      "success_rate": smoothed_success_rate(wins, losses)}
        if success:
            partial["last_success_at"] = stamp
        if refined_steps:
            partial["refined_steps"] = list(refined_steps)
        return partial

    return update_owned(store, user_id, doc, outcome, refresh=store.refresh)


# --- bulk loading --------------------------------------------------------------------


def bulk_load(store: Store, docs: Sequence[dict], *, progress: bool = True, batch: int = C.BULK_BATCH,
              refresh: bool = True, ids: Sequence[str] | None = None) -> list[str]:
    """Index prepared documents (from `build_document`) with their vectors; returns ids in order.

    Used by data-set loaders, imports and the catalog; the embedding cache makes reruns cheap.
    `ids`, when given, are used instead of Elasticsearch's own, so loading again overwrites instead of duplicating.
    A document marked `archived_from` goes to the archive (`documents.target_index`).
    Every memory needs exactly one owner and a catalog item none (`validation.check_owner`): one that
    does not refuses the whole load, before anything is written.

    Every document is embedded first, in batches of `batch`, and the current ones get their hubness among the
    load's documents of the same owner (`hubness.attach_hubness`, which keeps one a document already carries, as
    an import's do); an embedding failure therefore writes nothing. The documents then go in `_bulk` batches of
    `batch`. A document the cluster refuses stops the load after its batch: `ValidationError` when nothing at
    all was written, otherwise `PartialWrite`, whose `indexed_ids` are every document written so far (the earlier
    batches and the accepted documents of the failing one); later batches are not sent.
    `progress` draws one bar per stage (the store's embedding caches draw none of their own).
    """
    if ids is not None and len(ids) != len(docs):
        raise ValidationError(f"ids has {len(ids)} entries for {len(docs)} documents: give one id per document")
    provision_users(store, [check_owner(d) for d in docs])
    docs = [dict(d) for d in docs]
    with tqdm(total=len(docs), desc="embedding", unit="doc", disable=not progress) as bar:
        for start in range(0, len(docs), batch):
            embed_documents(store, docs[start:start + batch])
            bar.update(len(docs[start:start + batch]))
    attach_hubness(store, docs)
    assigned: list[str] = []
    with tqdm(total=len(docs), desc="indexing", unit="doc", disable=not progress) as bar:
        for start in range(0, len(docs), batch):
            chunk = docs[start:start + batch]
            body = [line for i, d in enumerate(chunk)
                    for line in ({"index": {"_index": target_index(store.prefix, d), "routing": routing_of(d),
                                            **({"_id": ids[start + i]} if ids else {})}}, d)]
            unsent = len(docs) - start - len(chunk)
            try:
                items = [item["index"] for item in store.es.bulk(operations=body, refresh=False)["items"]]
            except (AtlasError, ApiError, TransportError) as exc:
                if not assigned:
                    raise
                raise _partial_write(store, assigned, unsent=unsent, refresh=refresh, ids_given=ids is not None,
                                     what=f"the batch of documents {start}-{start + len(chunk) - 1} failed "
                                          f"({type(exc).__name__}: {exc}), and some of them may have been written "
                                          "too") from exc
            assigned.extend(item["_id"] for item in items if not item.get("error"))
            if refused := [(start + i, item["error"]) for i, item in enumerate(items) if item.get("error")]:
                position, error = refused[0]
                what = (f"{len(refused)} of the documents {start}-{start + len(chunk) - 1} were refused "
                        f"(first: document {position}, {error.get('type')}: {error.get('reason')})")
                if not assigned:
                    raise ValidationError(f"{what}: nothing was written; fix them and load again")
                raise _partial_write(store, assigned, unsent=unsent, refresh=refresh, ids_given=ids is not None,
                                     what=what)
            bar.update(len(chunk))
    if refresh:
        store.es.indices.refresh(index=store.indices)
    return assigned


def _partial_write(store: Store, indexed: list[str], *, unsent: int, refresh: bool, ids_given: bool,
                   what: str) -> PartialWrite:
    """The error of a load that stopped after writing `indexed` (made visible first, as a full load would be)
    and did not send the `unsent` documents after the failing batch."""
    if refresh:
        try:
            store.es.indices.refresh(index=store.indices)
        except (AtlasError, ApiError, TransportError):
            pass  # the cluster may be what failed: the error must still say what was written
    todo = ("fix the cause and load again with the same ids (what was written is overwritten, not duplicated)"
            if ids_given else
            "delete them (PartialWrite.indexed_ids) before loading again, or load with ids= so that a reload "
            "overwrites instead of duplicating")
    return PartialWrite(f"{what}; the load stopped there: {len(indexed)} documents were indexed and stay "
                        f"written, {unsent} later ones were not sent: {todo}", indexed)


# --- listing ------------------------------------------------------------------------


def build_users_body(after: dict | None = None) -> dict:
    """One page of a composite aggregation over `user_id`, in id order, after the previous page's key."""
    composite: dict = {"size": C.LIST_PAGE_SIZE, "sources": [{"user_id": {"terms": {"field": "user_id"}}}]}
    if after is not None:
        composite["after"] = after
    return {"size": 0, "aggs": {"users": {"composite": composite}}}


def users_with_memory(store: Store, *, types: Sequence[C.MemoryType] = C.USER_MEMORY_TYPES) -> list[str]:
    """Every user with memory of `types` in the prefix, in id order (service credential).

    Paged (`C.LIST_PAGE_SIZE` users a request), so no cluster bucket limit cuts the list short.
    """
    indices = ",".join(index_name(store.prefix, t) for t in types)
    users: list[str] = []
    after: dict | None = None
    while True:
        page = store.es.search(index=indices, ignore_unavailable=True, **build_users_body(after))
        agg = page.get("aggregations", {}).get("users", {})
        users += [bucket["key"]["user_id"] for bucket in agg.get("buckets", [])]
        after = agg.get("after_key")
        if not agg.get("buckets") or after is None:
            return users


def parse_when(value: str | datetime) -> datetime:
    """Accept a datetime or an ISO string (loaders read JSON)."""
    if isinstance(value, datetime):
        return as_utc(value)
    return as_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
