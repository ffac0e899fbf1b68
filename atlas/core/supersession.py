"""Supersession, never silent overwrite: audit chains, repair, and the archive of retired facts.

A new fact that makes older ones false is written with `supersedes=[old ids]`; each
old one gets `superseded_by`/`superseded_at` through an optimistic-concurrency update.
The new document is indexed without a refresh, but the marks are written one by one, each
with the store's refresh policy: the first refresh shows the new fact while later old ones
are still unmarked. A recall does not see two versions as current all the same, because
`atlas.core.recall.settle_supersessions` counts a new fact only once the facts it retires
point to it. If marking fails half-way (a crash, a lost race), `repair()` finishes or undoes
the job from the new document's `supersedes` field. `archive()` moves old superseded documents to `<prefix>-archive`
with point-in-time paging and `_bulk` (no `_reindex` on this cluster).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from elasticsearch import helpers
from tqdm.auto import tqdm

from atlas import constants as C
from atlas.core.clock import es_date
from atlas.core.documents import (
    VECTOR_FIELDS,
    Owned,
    build_document,
    index_document,
    prove_ownership,
    routing_of,
    update_owned,
    valid_start,
)
from atlas.core.errors import AlreadySuperseded, ConflictError, NotFound, ValidationError
from atlas.core.schemas import archive_name, build_sole_owner_filter, index_name
from atlas.core.scoring import days
from atlas.core.store import Store
from atlas.core.validation import check_id, check_user


def harsh_confidence(confidence: float, contradiction: C.Contradiction, *,
                     penalty: float = C.SUPERSEDE_CONFIDENCE_PENALTY) -> float:
    """A harsh contradiction (the user flatly contradicts an earlier statement) lowers trust in the new fact."""
    return max(0.0, confidence - penalty) if contradiction == "harsh" else confidence


def chain_head(store: Store, user_id: str, doc_id: str) -> str:
    """Follow `superseded_by` to the current document of a chain."""
    seen = {doc_id}
    current = prove_ownership(store, user_id, doc_id, archive=True)
    while current.source.get("superseded_by"):
        nxt = current.source["superseded_by"]
        following = None if nxt in seen else _owned_or_none(store, user_id, nxt)
        if following is None:
            break
        seen.add(nxt)
        current = following
    return current.id


def ended(old: dict, new: dict) -> dict:
    """The valid time a fact's successor gives it: it held until the successor started to (never before it
    started itself), unless its own `valid_to` says otherwise."""
    if old.get("memory_type") != "semantic" or old.get("valid_to"):
        return {}
    return {"valid_to": max(valid_start(old), valid_start(new))}


def _mark(store: Store, old: Owned, new_id: str, new: dict) -> None:
    """Mark one old document superseded by `new` (its source), only if nobody superseded it since we read it.

    A concurrent recall bumping its use count changes its seq_no too; that is no conflict, so the
    mark is retried on the fresh copy (`update_owned`). Without this, a fact recalled often could
    never be superseded. One that somebody else superseded meanwhile raises `ConflictError`.
    """
    def mark(source: dict) -> dict:
        if source.get("superseded_by"):
            raise ConflictError(f"memory {old.id} was superseded by {source['superseded_by']} meanwhile")
        return {"superseded_by": new_id, "superseded_at": new["created_at"], **ended(source, new)}

    update_owned(store, old.source.get("user_id", ""), old, mark, refresh=store.refresh)


def supersede(store: Store, user_id: str, old_ids: Sequence[str], text: str, memory_type: C.MemoryType = "semantic",
              *, contradiction: C.Contradiction = "natural", confidence: float = 1.0,
              penalty: float = C.SUPERSEDE_CONFIDENCE_PENALTY, **fields: object) -> str:
    """Write `text` as the new current fact and retire every one of `old_ids`. Returns the new id.

    Exactly one of two concurrent writers superseding the same document wins; the
    other gets `ConflictError` and its new document is removed (no orphan).
    """
    check_user(user_id)
    if not old_ids:
        raise ValidationError("supersedes_id is empty")
    olds = [prove_ownership(store, user_id, check_id(i)) for i in dict.fromkeys(old_ids)]
    for old in olds:
        if old.source.get("superseded_by"):
            raise AlreadySuperseded(old.id, chain_head(store, user_id, old.id))
        if not _settled(store, user_id, old):
            raise ConflictError(f"memory {old.id} is still being written by a concurrent supersession (or one that "
                                "crashed: run `atlas repair`); nothing was written, re-read and retry")
    now = store.now()
    doc = build_document(user_id, text, memory_type, now, contradiction=contradiction,
                         supersedes=[o.id for o in olds], **fields)
    doc["confidence"] = harsh_confidence(float(confidence), contradiction, penalty=penalty)
    new_id = index_document(store, doc, refresh="false")
    marked: list[Owned] = []
    try:
        for old in olds:
            _mark(store, old, new_id, doc)
            marked.append(old)
    except (ConflictError, NotFound):
        _undo(store, user_id, new_id, memory_type, marked)
        lost = _find(store, olds[len(marked)].id)
        winner = lost.source.get("superseded_by") if lost else None
        raise ConflictError(
            f"memory {olds[len(marked)].id} {'changed' if lost else 'was deleted'} while superseding it"
            + (f" (now superseded by {winner})" if winner else "") + "; nothing was written, re-read and retry"
        ) from None
    store.es.indices.refresh(index=index_name(store.prefix, memory_type))
    return new_id


def _settled(store: Store, user_id: str, doc: Owned) -> bool:
    """Whether every fact `doc` supersedes points back to it. Until then its own supersession is in
    flight, or lost its race and `doc` is about to be removed: superseding it would fork the chain.

    Read through the user's client: a link into another user's fact (only a planted document has one)
    is not the user's to wait for."""
    previous = list(doc.source.get("supersedes") or ())
    if not previous:
        return True
    hits = store.read_client(user_id).search(index=store.indices, routing=user_id, query={"ids": {"values": previous}},
                                             size=len(previous), source_includes=["superseded_by"])["hits"]["hits"]
    return all(hit["_source"].get("superseded_by") == doc.id for hit in hits)


def _undo(store: Store, user_id: str, new_id: str, memory_type: C.MemoryType, marked: Sequence[Owned]) -> None:
    """Roll back a half-done supersession: unmark what we marked (valid time as it was), delete the new document."""
    for old in marked:
        store.es.update(index=old.index, id=old.id, routing=old.routing,
                        doc={"superseded_by": None, "superseded_at": None, "valid_to": old.source.get("valid_to")})
    store.es.delete(index=index_name(store.prefix, memory_type), id=new_id, routing=user_id, refresh=store.refresh)


@dataclass
class RepairReport:
    completed: list[tuple[str, str]] = field(default_factory=list)
    removed_orphans: list[str] = field(default_factory=list)


def repair(store: Store, user_id: str | None = None) -> RepairReport:
    """Finish supersessions a crash interrupted; remove new documents that lost a race.

    Looks at every current document with `supersedes` (the user's own, when `user_id` is given): an
    old document not yet marked is marked now; one marked by somebody else means ours is an orphan.
    A link counts only when the old document has the new one's owner (`_linked`), so a document that
    names another user's fact neither marks that fact nor is removed because of it.
    """
    report = RepairReport()
    query: dict = {"bool": {"filter": [{"exists": {"field": "supersedes"}}],
                            "must_not": [{"exists": {"field": "superseded_by"}}]}}
    if user_id is not None:
        query["bool"]["filter"].append(build_sole_owner_filter(check_user(user_id)))
    indices = ",".join(index_name(store.prefix, t) for t in C.USER_MEMORY_TYPES)
    store.es.indices.refresh(index=indices)
    for hit in helpers.scan(store.es, index=indices, query={"query": query}, _source_excludes=list(VECTOR_FIELDS)):
        new_id, source = hit["_id"], hit["_source"]
        for old_id in source["supersedes"]:
            old = _linked(store, user_id, source.get("user_id"), old_id)
            if old is None:
                continue
            holder = old.source.get("superseded_by")
            if holder is None:
                _mark(store, old, new_id, source)
                report.completed.append((old_id, new_id))
            elif holder != new_id:
                store.es.delete(index=hit["_index"], id=new_id, routing=routing_of(source), refresh=store.refresh)
                report.removed_orphans.append(new_id)
                break
    return report


def _linked(store: Store, user_id: str | None, owner: object, old_id: str) -> Owned | None:
    """The document a `supersedes` link names, if it has the same single owner as the document linking it.

    For a user's repair, read through the user's key (`prove_ownership`); for the whole prefix, read
    with the service credential and compared with `owner`, the linking document's `user_id`.
    """
    if user_id is not None:
        try:
            return prove_ownership(store, user_id, old_id, archive=True)
        except NotFound:
            return None
    old = _find(store, old_id)
    if old is None or not isinstance(owner, str) or old.source.get("user_id") != owner:
        return None
    return old


def _find(store: Store, doc_id: str) -> Owned | None:
    """A document by id in any of the prefix's indices, read with the service credential (repair of a whole
    prefix, and the error of a lost race)."""
    resp = store.es.search(index=store.indices, query={"ids": {"values": [doc_id]}},
                           seq_no_primary_term=True, source_excludes=list(VECTOR_FIELDS))
    hits = resp["hits"]["hits"]
    if not hits:
        return None
    return Owned.from_hit(hits[0])


def splice(store: Store, user_id: str, gone: Owned) -> None:
    """Take a forgotten document out of its chain, as if it had never been written.

    Its predecessors now point to its successor, or become current again when it was the chain's head (and hold
    again from then on, when it had ended their valid time); its successor supersedes its predecessors instead of
    it. Neighbours already gone are skipped, and a second call changes nothing, so a forget that failed half-way
    can be retried.
    """
    successor = gone.source.get("superseded_by")
    predecessors = list(gone.source.get("supersedes") or ())

    def repoint(source: dict) -> dict:
        if source.get("superseded_by") != gone.id:  # relinked by a concurrent writer meanwhile
            return {}
        if successor:
            return {"superseded_by": successor}
        ended_by_gone = ended({**source, "valid_to": None}, gone.source).get("valid_to")
        reopened = {"valid_to": None} if ended_by_gone and source.get("valid_to") == ended_by_gone else {}
        return {"superseded_by": None, "superseded_at": None, **reopened}

    def relink(source: dict) -> dict:
        before = list(source.get("supersedes") or ())
        after = [i for i in before if i != gone.id] + [i for i in predecessors if i not in before]
        return {"supersedes": after or None}

    changes = [(p, repoint) for p in predecessors] + ([(successor, relink)] if successor else [])
    for neighbour_id, change in changes:
        try:
            update_owned(store, user_id, prove_ownership(store, user_id, neighbour_id, archive=True), change,
                         refresh=store.refresh)
        except NotFound:
            continue


def history(store: Store, user_id: str, doc_id: str) -> list[dict]:
    """The whole audit chain through `doc_id`, oldest first, read with the user's own client.

    Walks back through `supersedes` (a fact can retire several) and forward through
    `superseded_by`; each entry is the stored document plus its `id`.
    """
    start = prove_ownership(store, user_id, doc_id, archive=True)
    found: dict[str, dict] = {}
    frontier: list[Owned | None] = [start]
    while frontier:
        doc = frontier.pop()
        if doc is None or doc.id in found:
            continue
        found[doc.id] = {"id": doc.id, **doc.source}
        neighbours = list(doc.source.get("supersedes") or [])
        if doc.source.get("superseded_by"):
            neighbours.append(doc.source["superseded_by"])
        frontier += [_owned_or_none(store, user_id, n) for n in neighbours if n not in found]
    return chain_order(found)


def _owned_or_none(store: Store, user_id: str, doc_id: str) -> Owned | None:
    """A chain link, or None for one forgotten before `forget_memory` spliced chains (such links dangle)."""
    try:
        return prove_ownership(store, user_id, doc_id, archive=True)
    except NotFound:
        return None


def chain_order(docs: dict[str, dict]) -> list[dict]:
    """Every document after the ones it supersedes (timestamps can tie: facts written in one
    second, or under a fixed clock); among documents free to come next, the oldest first."""
    waiting = {i: {p for p in d.get("supersedes") or () if p in docs} for i, d in docs.items()}
    ordered: list[dict] = []
    while waiting:
        ready = sorted((i for i, parents in waiting.items() if not parents),
                       key=lambda i: (docs[i]["created_at"], i))
        if not ready:  # a cycle cannot be written through `supersede`; keep whatever is left by time
            ready = sorted(waiting, key=lambda i: (docs[i]["created_at"], i))
        first = ready[0]
        ordered.append(docs[first])
        del waiting[first]
        for parents in waiting.values():
            parents.discard(first)
    return ordered


# --- archive -----------------------------------------------------------------------------


def build_archive_query(cutoff: datetime) -> dict:
    return {"bool": {"filter": [{"exists": {"field": "superseded_by"}},
                                {"range": {"superseded_at": {"lt": es_date(cutoff)}}}]}}


def archive(store: Store, *, older_than: str = C.ARCHIVE_OLDER_THAN, now: datetime | None = None,
            batch: int = C.ARCHIVE_BATCH, progress: bool = True) -> int:
    """Move documents superseded more than `older_than` ago into the archive. Returns how many moved.

    Copy first (same id, so a rerun overwrites instead of duplicating), then delete:
    a crash between the two leaves a copy that the next run finishes. The chain stays
    readable through `history` and `include_superseded` recall, which also search the archive.
    """
    cutoff = (now or store.now()) - timedelta(days=days(older_than))
    sources = ",".join(index_name(store.prefix, t) for t in C.USER_MEMORY_TYPES)
    target = archive_name(store.prefix)
    pit = store.es.open_point_in_time(index=sources, keep_alive="2m")["id"]
    moved, after = 0, None
    bar = tqdm(desc="archiving", unit="doc", disable=not progress)
    try:
        while True:
            # Vectors are not in `_source` (`schemas.index_settings`): ask for them, so that the copy has them.
            page = store.es.search(pit={"id": pit, "keep_alive": "2m"}, query=build_archive_query(cutoff),
                                   sort=[{"_shard_doc": "asc"}], size=batch, search_after=after,
                                   source={"exclude_vectors": False})
            hits = page["hits"]["hits"]
            if not hits:
                break
            copies = [{"_op_type": "index", "_index": target, "_id": h["_id"], "routing": routing_of(h["_source"]),
                       "_source": {**h["_source"], "archived_from": h["_index"]}} for h in hits]
            helpers.bulk(store.es, copies, refresh="wait_for")
            helpers.bulk(store.es, [{"_op_type": "delete", "_index": h["_index"], "_id": h["_id"],
                                     "routing": routing_of(h["_source"])} for h in hits], raise_on_error=False)
            moved += len(hits)
            bar.update(len(hits))
            after = hits[-1]["sort"]
    finally:
        bar.close()
        store.es.close_point_in_time(id=pit)
    store.es.indices.refresh(index=f"{sources},{target}")
    return moved

