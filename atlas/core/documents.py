"""Documents: the stored form of a memory and the operations every write is made of.

Build a document (`build_document`) and the passages it embeds, index it with its vectors
(`index_document`) on its owner's shard (`routing_of`), prove a user owns one (`prove_ownership`, a
read through the user's own client) and change it with optimistic concurrency (`update_owned`): this
cluster has no script engine, so every change is read-modify-write with retries. `atlas.core.memory` and
`atlas.core.supersession` are both made of these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np
from elasticsearch import ConflictError as ESConflict
from elasticsearch import Elasticsearch, NotFoundError

from atlas import constants as C
from atlas.core.clock import as_utc, es_date, mentioned_period
from atlas.core.errors import AtlasError, ConflictError, NotFound
from atlas.core.passages import passage_sentences, passage_text
from atlas.core.schemas import MODEL_FIELDS, archive_name, build_sole_owner_filter, index_name
from atlas.core.scoring import smoothed_success_rate
from atlas.core.store import Store
from atlas.core.validation import check_id, check_owner, check_user

#: Fields that hold vectors, left out of what recall reads back.
VECTOR_FIELDS = ("embedding", "rerank_embedding", "sentences")


def routing_of(doc: Mapping) -> str | None:
    """The routing of a stored document: its owner's `user_id`, so that all of one user's memories live on
    one shard of each index, and a read of that user (`routing=user_id`) asks that shard only.

    Every write, get, update and delete of a document passes this, and every read of a user passes
    `routing=user_id`: a document written with a routing is found by id only with the same routing.
    A catalog item without owner has none (routed by its id); the catalog has one shard
    (`C.CATALOG_SHARDS`), so a search routed by a user still reads all of it.
    """
    owner = doc.get("user_id")
    return owner if isinstance(owner, str) else None


@dataclass(frozen=True)
class Owned:
    """A document the user was shown to own, with what an OCC update needs."""

    id: str
    index: str
    source: dict
    seq_no: int
    primary_term: int

    @classmethod
    def from_hit(cls, hit: dict) -> Owned:
        """From a search hit or a get response read with `seq_no_primary_term`."""
        return cls(hit["_id"], hit["_index"], hit["_source"], hit["_seq_no"], hit["_primary_term"])

    @property
    def routing(self) -> str | None:
        return routing_of(self.source)


def build_document(user_id: str | None, text: str, memory_type: C.MemoryType, now: datetime, **fields: object) -> dict:
    """The stored form of a memory, without vectors. `None` fields are left out.

    A fact whose text names a period that has begun by `now` ("since March 2025", "in 2024") gets that period's
    start as its `valid_from`, unless `fields` give one.
    """
    stamp = es_date(now)
    doc: dict = {"text": text, "memory_type": memory_type, "created_at": stamp, "confidence": 1.0}
    if user_id is not None:
        doc["user_id"] = user_id
    if memory_type == "episodic":
        doc["timestamp"] = stamp
    if memory_type == "semantic":
        doc.update(last_used_at=stamp, use_count=0)
        if (named := mentioned_period(text, now)) is not None and named[0] <= as_utc(now):
            doc["valid_from"] = es_date(named[0])
    if memory_type == "procedural":
        doc.update(success_count=0, failure_count=0, success_rate=smoothed_success_rate(0, 0))
    doc.update({k: (es_date(v) if isinstance(v, datetime) else v) for k, v in fields.items() if v is not None})
    return doc


def valid_start(source: Mapping) -> str:
    """From when a fact held: its `valid_from` where known, else when it was written."""
    return source.get("valid_from") or source["created_at"]


def target_index(prefix: str, doc: Mapping) -> str:
    """Where a document is stored: its memory type's index, or the archive for one `archive` moved there
    (marked `archived_from`), so that a reload (`atlas users import`) puts retired facts back where they were."""
    return archive_name(prefix) if "archived_from" in doc else index_name(prefix, doc["memory_type"])


def embed_documents(store: Store, docs: Sequence[dict]) -> None:
    """Fill every vector field of `docs` in place (the cache skips known texts).

    A speaker's sentences go to the first model in the same call as the passages, so they share its batches.
    """
    texts = [passage_text(doc) for doc in docs]
    sentences = [passage_sentences(doc) for doc in docs]
    flat = [s for group in sentences for s in group]
    for field, embedder in store.passage_embedders.items():
        vectors = embedder.embed_passages(texts + flat if field == "embedding" else texts)
        for doc, vector in zip(docs, vectors[:len(docs)], strict=True):
            doc[field] = vector.tolist()
            doc[MODEL_FIELDS[field]] = embedder.name
        if field == "embedding" and flat:
            sentence_vectors = iter(vectors[len(docs):])
            for doc, group in zip(docs, sentences, strict=True):
                if group:
                    doc["sentences"] = [{"embedding": next(sentence_vectors).tolist()} for _ in group]


def provision_users(store: Store, user_ids: Iterable[str | None]) -> None:
    """Give each writing user their read key before their first document exists."""
    if store.provision is not None:
        for user_id in dict.fromkeys(u for u in user_ids if u is not None):
            store.provision(user_id)


def build_neighbours_body(user_id: str, vector: Sequence[float], *, size: int = C.HUB_CANDIDATES) -> dict:
    """The owner's `size` current memories nearest to `vector` (the first model's, whose kNN graph the index has),
    with their second-model vectors as doc values (no graph, no scripts here) and no stored field, not even `_id`."""
    owned = {"bool": {"filter": [build_sole_owner_filter(user_id)],
                      "must_not": [{"exists": {"field": "superseded_by"}}]}}
    return {"size": size, "stored_fields": "_none_", "docvalue_fields": ["rerank_embedding"],
            "query": {"knn": {"field": "embedding", "query_vector": list(vector), "k": size,
                              "num_candidates": max(size, C.KNN_NUM_CANDIDATES), "filter": [owned]}}}


def neighbour_hubness(store: Store, docs: Sequence[Mapping]) -> list[float | None]:
    """New memories' `hubness` (`atlas.core.hubness`), each among its owner's memories as they stand when it is
    written (not among the others of `docs`), in one `_msearch`: the mean second-model cosine of its HUB_NEIGHBOURS
    most similar ones, looked for among the HUB_CANDIDATES nearest by the first model. None for an owner's first
    memory (unknown, not 0)."""
    if not docs:
        return []
    indices = ",".join(index_name(store.prefix, t) for t in C.USER_MEMORY_TYPES)
    searches = [part for doc in docs for part in ({"index": indices, "routing": doc["user_id"],
                                                   "ignore_unavailable": True},
                                                  build_neighbours_body(doc["user_id"], doc["embedding"]))]
    values: list[float | None] = []
    for doc, response in zip(docs, store.es.msearch(searches=searches)["responses"], strict=True):
        if "error" in response:
            raise AtlasError(f"the neighbours of a new memory could not be read: {response['error']}")
        vectors = np.asarray([hit["fields"]["rerank_embedding"][0] for hit in response["hits"]["hits"]
                              if "rerank_embedding" in hit.get("fields", {})], dtype=np.float32)
        if not len(vectors):
            values.append(None)
            continue
        own = np.asarray(doc["rerank_embedding"], dtype=np.float32)
        cosines = vectors @ own / np.maximum(np.linalg.norm(vectors, axis=1) * np.linalg.norm(own), 1e-12)
        values.append(round(float(np.sort(cosines)[-C.HUB_NEIGHBOURS:].mean()), 5))
    return values


def _prepare(store: Store, docs: Sequence[dict]) -> None:
    """Before indexing: check each owner and make their read key, embed, and (with an embedding second stage) give
    each current memory its hubness among its owner's memories (`neighbour_hubness`)."""
    provision_users(store, [check_owner(doc) for doc in docs])
    embed_documents(store, docs)
    owned = [doc for doc in docs if doc.get("user_id") and "rerank_embedding" in doc and not doc.get("superseded_by")]
    for doc, value in zip(owned, neighbour_hubness(store, owned), strict=True):
        doc["hubness"] = value  # null for the first: an export carries it as it is


def index_document(store: Store, doc: dict, *, refresh: str | None = None) -> str:
    """Index one document with its vectors and hubness (`_prepare`); returns its id."""
    _prepare(store, [doc])
    resp = store.es.index(index=index_name(store.prefix, doc["memory_type"]), document=doc,
                          routing=routing_of(doc), refresh=refresh or store.refresh)
    return resp["_id"]


def index_documents(store: Store, docs: Sequence[dict], *, refresh: str | None = None) -> list[str]:
    """Index new documents in one `_bulk`, embedded in one batch, each with its hubness among its owner's memories
    as they stood before (`_prepare`); returns their ids in order. A refused document raises `AtlasError` naming
    it, the others written."""
    if not docs:
        return []
    _prepare(store, docs)
    operations = [line for doc in docs for line in (
        {"index": {"_index": index_name(store.prefix, doc["memory_type"]), "routing": routing_of(doc)}}, doc)]
    items = [item["index"] for item in store.es.bulk(operations=operations, refresh=refresh or store.refresh)["items"]]
    if refused := [(i, item["error"]) for i, item in enumerate(items) if item.get("error")]:
        position, error = refused[0]
        raise AtlasError(f"{len(refused)} of {len(docs)} documents were refused (first: document {position}, "
                         f"{error.get('type')}: {error.get('reason')}); the others were written")
    return [item["_id"] for item in items]


def prove_ownership(store: Store, user_id: str, doc_id: str, *,
                    types: Iterable[C.MemoryType] = C.USER_MEMORY_TYPES, archive: bool = False) -> Owned:
    """The authorisation read: prove `user_id` owns `doc_id` by reading it through the user's own client.

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
    return Owned.from_hit(hits[0])


def build_owned_query(user_id: str, doc_id: str) -> dict:
    """The search behind `prove_ownership`: the id, filtered on its sole owner, with what OCC needs,
    on the owner's shard."""
    return {"routing": user_id,
            "query": {"bool": {"filter": [{"ids": {"values": [doc_id]}}, build_sole_owner_filter(user_id)]}},
            "seq_no_primary_term": True, "size": 1, "_source": {"excludes": list(VECTOR_FIELDS)},
            "ignore_unavailable": True}


def update_owned(store: Store, user_id: str, doc: Owned, change: Callable[[dict], dict], *,
                 refresh: str = "false") -> dict:
    """Apply `change(source) -> partial doc` with optimistic concurrency, re-reading on conflict.

    The one retry loop of Atlas: a conflict re-reads the document (still the user's, or
    `NotFound`) and calls `change` again on the fresh source, so `change` sees every concurrent
    writer's result and may raise to give up (supersession does when somebody else won).
    Gives up with `ConflictError` after `C.OCC_RETRIES` attempts. Returns the partial doc written.
    """
    current = doc
    for _ in range(C.OCC_RETRIES):
        partial = change(current.source)
        try:
            store.es.update(index=current.index, id=current.id, routing=current.routing, doc=partial,
                            if_seq_no=current.seq_no, if_primary_term=current.primary_term, refresh=refresh)
            return partial
        except ESConflict:
            try:
                fresh = store.es.get(index=current.index, id=current.id, routing=current.routing,
                                     source_excludes=list(VECTOR_FIELDS))
            except NotFoundError:
                raise NotFound(f"memory {doc.id} was deleted meanwhile") from None
            if fresh["_source"].get("user_id") != user_id:
                raise NotFound(f"no memory {doc.id} belongs to user {user_id}") from None
            current = Owned.from_hit(fresh.body)
        except NotFoundError:
            raise NotFound(f"memory {doc.id} was deleted meanwhile") from None
    raise ConflictError(f"memory {doc.id} kept changing under {C.OCC_RETRIES} attempts; retry later")


# --- paging -------------------------------------------------------------------------------------


def build_page_body(pit: str, query: dict, after: list | None, *, size: int, source: bool | dict) -> dict:
    """One page of a point-in-time search in index order, after the previous page's last sort values."""
    body: dict = {"pit": {"id": pit, "keep_alive": C.PIT_KEEP_ALIVE}, "query": query,
                  "sort": [{"_shard_doc": "asc"}], "size": size, "_source": source}
    if after is not None:
        body["search_after"] = after
    return body


class Client(Protocol):
    """Whatever holds the service client: a `Store`, or a scope that loads no models."""

    @property
    def es(self) -> Elasticsearch: ...


def pages(scope: Client, indices: list[str], query: dict, *, source: bool | dict,
          batch: int = C.PRIVACY_BATCH) -> Iterator[list[dict]]:
    """Pages of the hits of `query` (service credential), all from one point in time: deleting a page's
    hits does not shift the next page. Refreshes first, so a document written just before is seen."""
    names = ",".join(indices)
    scope.es.indices.refresh(index=names, ignore_unavailable=True)
    pit = scope.es.open_point_in_time(index=names, keep_alive=C.PIT_KEEP_ALIVE, ignore_unavailable=True)["id"]
    after: list | None = None
    try:
        while True:
            page = scope.es.search(**build_page_body(pit, query, after, size=batch, source=source))
            pit = page.get("pit_id", pit)
            hits = page["hits"]["hits"]
            if not hits:
                return
            yield hits
            after = hits[-1]["sort"]
    finally:
        scope.es.close_point_in_time(id=pit)
