"""Privacy operations users expect: erase everything of theirs, export it, import it back.

This cluster has no `_delete_by_query` (docs/elasticsearch.md), so an erasure pages the user's
documents from one point in time and deletes each page with `_bulk`; an export pages the same way.
An export line is one document: its `_id` (supersession links are ids, so they stay valid), its
`_index` as a memory type or `archive` (so it loads into any prefix) and its `_source` without
vectors: those belong to the model, not the user, and an import recomputes them from the text.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from elasticsearch import helpers

from atlas import constants as C
from atlas.core.documents import VECTOR_FIELDS, pages
from atlas.core.errors import AtlasError, NotFound, ValidationError
from atlas.core.memory import bulk_load
from atlas.core.schemas import (
    MODEL_FIELDS,
    all_indices,
    archive_name,
    build_sole_owner_filter,
    index_name,
    state_name,
)
from atlas.core.store import Store
from atlas.core.validation import check_id, check_owner, check_text, check_type, check_user
from atlas.security.tenancy import Scope
from atlas.security.tokens import Revocation, revoke_user

#: What an export leaves out of `_source`: the vectors and the names of the models that made them.
EXPORT_EXCLUDES = (*VECTOR_FIELDS, *MODEL_FIELDS.values())
#: The `_index` of an export line: where the document lives, without the prefix.
KINDS = (*C.USER_MEMORY_TYPES, C.ARCHIVE_SUFFIX)


@dataclass(frozen=True)
class ErasureReport:
    """What `erase_user` removed: documents per index, keys invalidated in the cluster, tokens revoked."""

    user_id: str
    prefix: str
    deleted: dict[str, int]
    key_ids: list[str]
    token_ids: list[str]

    @property
    def documents(self) -> int:
        return sum(self.deleted.values())


@dataclass(frozen=True)
class ImportReport:
    """What `import_user` wrote: documents per kind (memory type or `archive`) and their ids, in file order."""

    user_id: str
    prefix: str
    imported: dict[str, int]
    ids: list[str]


# --- request bodies ---------------------------------------------------------------------------


def build_erase_query(user_id: str) -> dict:
    """Every document naming the user, alone or beside others: an erasure leaves nothing of theirs behind
    (a planted document naming two users is nobody's to read, but still carries this user's id)."""
    return {"term": {"user_id": check_user(user_id)}}


# --- paging -------------------------------------------------------------------------------------


# --- erase ----------------------------------------------------------------------------------------


def erase_user(scope: Scope, user_id: str, *, batch: int = C.PRIVACY_BATCH) -> ErasureReport:
    """Delete every document of the user in the prefix (memory, archive, consolidation state), invalidate
    every key the cluster holds for them and revoke their tokens. Idempotent: a second call reports zeros.

    Keys and tokens go first, so the user can neither read nor write while their documents are deleted,
    and an erasure that fails half-way leaves them locked out until it is run again. The deleted documents are
    then merged out of their segments (`expunge`: about half a minute), so that they count in nobody's scores.
    """
    check_user(user_id)
    revocation = _revoke(scope, user_id)
    indices = [*all_indices(scope.prefix), state_name(scope.prefix)]
    deleted = dict.fromkeys(indices, 0)
    for hits in pages(scope, indices, build_erase_query(user_id), source=False, batch=batch):
        for index in _delete(scope, user_id, hits):
            deleted[index] += 1
    if touched := [index for index, count in deleted.items() if count]:
        expunge(scope, touched)
    scope.es.indices.refresh(index=",".join(indices), ignore_unavailable=True)
    return ErasureReport(user_id, scope.prefix, deleted, revocation.key_ids if revocation else [],
                         revocation.token_ids if revocation else [])


def shard_marks(scope: Scope, indices: list[str]) -> dict[tuple[str, str], tuple[int, int]]:
    """(index, shard) -> (max sequence number, lowest sequence number its retention leases still keep), over
    every copy: `GET <indices>/_stats/docs?level=shards`."""
    stats = scope.es.indices.stats(index=",".join(indices), metric="docs", level="shards")["indices"]
    return {(index, shard): (max(copy["seq_no"]["max_seq_no"] for copy in copies),
                             min((lease["retaining_seq_no"] for copy in copies
                                  for lease in copy["retention_leases"]["leases"]), default=2**63))
            for index, body in stats.items() for shard, copies in body["shards"].items()}


def expunge(scope: Scope, indices: list[str]) -> None:
    """Merge the deleted documents of `indices` out of their segments, so that they count in no term statistics.

    A deleted document stays in its segment (a soft delete) while a retention lease keeps its operation for
    replicas, and the leases move up only every 30 s or so: so wait until every shard's leases are past its
    deletes, then `_forcemerge?only_expunge_deletes=true` (every segment holding one: `index_settings`).
    """
    deleted_up_to = {key: seq_no for key, (seq_no, _) in shard_marks(scope, indices).items()}
    deadline = time.monotonic() + C.ERASE_MERGE_TIMEOUT
    while any(kept <= deleted_up_to.get(key, -1) for key, (_, kept) in shard_marks(scope, indices).items()):
        if time.monotonic() > deadline:
            raise AtlasError(f"the erased documents are deleted, but the cluster still keeps them for its replicas "
                             f"after {C.ERASE_MERGE_TIMEOUT} s, so they still count in term statistics: run the "
                             "erasure again later")
        time.sleep(C.ERASE_MERGE_POLL)
    scope.es.options(request_timeout=C.ERASE_MERGE_TIMEOUT).indices.forcemerge(index=",".join(indices),
                                                                               only_expunge_deletes=True)


def _revoke(scope: Scope, user_id: str) -> Revocation | None:
    """`revoke_user`, or None for a user who never had a key or token in the prefix (memory written
    without tenancy, or an erasure already done: the stored key stays, marked revoked)."""
    try:
        return revoke_user(scope, user_id)
    except NotFound:
        return None


def _delete(scope: Scope, user_id: str, hits: list[dict]) -> list[str]:
    """Delete one page with `_bulk`; the index of each document deleted (one already gone is not counted)."""
    ops = [{"_op_type": "delete", "_index": h["_index"], "_id": h["_id"], "routing": h.get("_routing")} for h in hits]
    done: list[str] = []
    failed: list[dict] = []
    for ok, item in helpers.streaming_bulk(scope.es, ops, raise_on_error=False, raise_on_exception=False,
                                           chunk_size=len(ops)):
        result = item["delete"]
        if ok and result.get("result") == "deleted":
            done.append(result["_index"])
        elif result.get("status") != 404:
            failed.append(result)
    if failed:
        first = failed[0]
        raise AtlasError(f"{len(failed)} documents of user {user_id} could not be deleted (first: {first['_id']} "
                         f"in {first['_index']}: {first.get('error')}); erasure is idempotent: run it again")
    return done


# --- export -----------------------------------------------------------------------------------------


def export_indices(prefix: str) -> list[str]:
    """Where a user's memory lives: the three indices a user writes and the archive (the catalog is nobody's)."""
    return [index_name(prefix, t) for t in C.USER_MEMORY_TYPES] + [archive_name(prefix)]


def export_user(scope: Scope, user_id: str, *, batch: int = C.PRIVACY_BATCH) -> Iterator[dict]:
    """Every document the user owns, one dict per document: `_id`, `_index` (memory type or `archive`)
    and `_source` without vectors; `json.dumps` of each is a line of the export (`atlas users export`)."""
    check_user(user_id)
    source = {"excludes": list(EXPORT_EXCLUDES)}
    for hits in pages(scope, export_indices(scope.prefix), build_sole_owner_filter(user_id), source=source,
                      batch=batch):
        for hit in hits:
            yield {"_id": hit["_id"], "_index": hit["_index"].removeprefix(f"{scope.prefix}-"),
                   "_source": hit["_source"]}


# --- import -----------------------------------------------------------------------------------------


def read_lines(lines: Iterable[str]) -> Iterator[object]:
    """The JSON values of an export file's lines (blank lines skipped); a line that is not JSON is refused."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"line {number} is not JSON ({exc.msg}): is this an `atlas users export` "
                                  "file?") from None


def check_line(line: object, *, prefix: str) -> tuple[str, str, dict]:
    """(id, kind, document to load) of one export line. Vectors in it are dropped (the import recomputes
    them); an archived document is marked as coming from this prefix's index of its type."""
    if not isinstance(line, Mapping) or not isinstance(line.get("_source"), Mapping):
        raise ValidationError('not an exported document: expected {"_id": ..., "_index": ..., "_source": {...}}')
    kind = line.get("_index")
    if kind not in KINDS:
        raise ValidationError(f"_index must be one of {', '.join(KINDS)}, not {kind!r}")
    doc_id = check_id(line.get("_id"))
    source = {k: v for k, v in line["_source"].items() if k not in EXPORT_EXCLUDES}
    memory_type = check_type(source.get("memory_type"), allowed=C.USER_MEMORY_TYPES)
    check_owner(source)
    check_text(source.get("text"))
    if kind == C.ARCHIVE_SUFFIX:
        source["archived_from"] = index_name(prefix, memory_type)
    elif kind != memory_type or "archived_from" in source:
        raise ValidationError(f"a {memory_type} memory{' marked archived' if 'archived_from' in source else ''} "
                              f"cannot go into {kind}")
    return doc_id, str(kind), source


def import_user(store: Store, lines: Iterable[object], *, user_id: str | None = None,
                progress: bool = False) -> ImportReport:
    """Load an export back (`export_user` dicts, or `read_lines` of its file): same ids, so supersession
    links hold and importing again overwrites; the texts are embedded again by this store's models.

    Every line must belong to `user_id` (by default, the owner of the first line): one user's memory per
    import, and a file naming somebody else is refused, with its line number, before anything is written.
    """
    if user_id is not None:
        check_user(user_id)
    ids: list[str] = []
    kinds: list[str] = []
    docs: list[dict] = []
    for number, line in enumerate(lines, 1):
        try:
            doc_id, kind, doc = check_line(line, prefix=store.prefix)
        except ValidationError as exc:
            raise ValidationError(f"document {number} of the export: {exc}; nothing was imported") from None
        owner = doc["user_id"]
        if user_id is None:
            user_id = owner
        elif owner != user_id:
            raise ValidationError(f"document {number} of the export ({doc_id}) belongs to {owner}, not {user_id}: "
                                  "an import restores one user's own memory; nothing was imported")
        ids.append(doc_id)
        kinds.append(kind)
        docs.append(doc)
    if user_id is None:
        raise ValidationError("the export holds no documents: nothing to import")
    written = bulk_load(store, docs, ids=ids, progress=progress)
    return ImportReport(user_id, store.prefix, dict(Counter(kinds)), written)
