"""Hubness: how much a memory resembles the rest of its owner's memories, which the second stage holds against it.

In a space of sentence vectors some points are near almost any query: here a user's small talk ("Wow, that's great,
Caroline!"), which names the people and the mood of every conversation and says nothing in particular. Such hubs
fill the top of a list, most of all for a question whose answer is spread over many specific turns. A memory's
`hubness` is the mean cosine of its HUB_NEIGHBOURS most similar memories of the same owner (the second model's
vectors, `rerank_embedding`); the embedding second stage scores a candidate by its cosine to the question minus
HUB_PENALTY x hubness, the local scaling of cross-domain similarity (CSLS) applied to one side
(`atlas.core.fusion.held`; measured in docs/evaluation.md).

Every write path gives a memory its hubness. A single write (`write_episode`, `write_memory`, the MCP and agent
tools) computes it from the owner's memories as they stand (`documents.neighbour_hubness`); a load computes it
for its documents among themselves before it indexes them (`attach_hubness`, called by `bulk_load`; an import keeps
the exported one). A memory's neighbours change as its owner writes more, so consolidation recomputes all of an
owner's at once (`refresh_hubness`). A memory without one (an owner's first, one a load holds alone, or one written
with no embedding second stage) counts as the pool's average.
"""

from __future__ import annotations

import numpy as np
from elasticsearch import helpers

from atlas import constants as C
from atlas.core.documents import pages
from atlas.core.errors import AtlasError
from atlas.core.schemas import build_sole_owner_filter, index_name
from atlas.core.store import Store
from atlas.core.validation import check_user

#: Rows compared at once: a block of cosines is rows x memories floats.
_BLOCK = 1024


def hubness(vectors: np.ndarray, *, neighbours: int = C.HUB_NEIGHBOURS) -> np.ndarray:
    """Each row's mean cosine to its `neighbours` most similar other rows (fewer if there are fewer; 0 alone)."""
    count = len(vectors)
    if count < 2:
        return np.zeros(count, dtype=np.float32)
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    take = min(neighbours, count - 1)
    out = np.empty(count, dtype=np.float32)
    for start in range(0, count, _BLOCK):
        block = unit[start:start + _BLOCK] @ unit.T
        block[np.arange(len(block)), np.arange(start, start + len(block))] = -np.inf  # not its own neighbour
        out[start:start + _BLOCK] = np.partition(block, count - take, axis=1)[:, count - take:].mean(axis=1)
    return out


def stored(vectors: np.ndarray) -> list[float | None]:
    """The hubness of each of one owner's memories as it is written: five decimals, whether a load or consolidation
    writes it; None (unknown, not 0) for a memory alone, which `hubness` would score as having no neighbour."""
    if len(vectors) < 2:
        return [None] * len(vectors)
    return [round(float(value), 5) for value in hubness(vectors)]


def has_hubness(store: Store) -> bool:
    """Whether the store's memories get hubness: only the embedding second stage has the vectors it is made of."""
    return store.second_stage is not None and store.second_stage.embedder is not None


def attach_hubness(store: Store, docs: list[dict]) -> None:
    """Set `hubness` on each current document of `docs` (not superseded, not archived, embedded by `embed_documents`)
    from the others of its owner among them; a document that already has the field (an import's, even null) keeps
    it, so that an import restores what was exported. Nothing without an embedding second stage."""
    if not has_hubness(store):
        return
    owners: dict[str | None, list[dict]] = {}
    for doc in docs:
        if not doc.get("superseded_by") and not doc.get("archived_from"):
            owners.setdefault(doc.get("user_id"), []).append(doc)
    for group in owners.values():
        values = stored(np.asarray([doc["rerank_embedding"] for doc in group], dtype=np.float32))
        for doc, value in zip(group, values, strict=True):
            doc.setdefault("hubness", value)


def build_hubness_query(user_id: str | None) -> dict:
    """The current memories whose hubness is computed together: one user's (`build_sole_owner_filter`), or the
    catalog's ownerless items."""
    current = {"exists": {"field": "superseded_by"}}
    if user_id is None:
        return {"bool": {"filter": [], "must_not": [current, {"exists": {"field": "user_id"}}]}}
    return {"bool": {"filter": [build_sole_owner_filter(check_user(user_id))], "must_not": [current]}}


def refresh_hubness(store: Store, user_id: str | None) -> int:
    """Compute `hubness` of every current memory of `user_id` (None: the catalog) and write it: the number
    written. Reads the second model's vectors with the service credential, a page at a time, then one `_bulk`
    of partial updates routed by owner; 0 when the store has no embedding second stage."""
    if not has_hubness(store):
        return 0
    types: tuple[C.MemoryType, ...] = C.USER_MEMORY_TYPES if user_id is not None else ("catalog",)
    indices = [index_name(store.prefix, memory_type) for memory_type in types]
    hits = [hit for page in pages(store, indices, build_hubness_query(user_id),
                                  source={"includes": ["rerank_embedding"]}) for hit in page
            if "rerank_embedding" in hit["_source"]]
    if not hits:
        return 0
    values = stored(np.asarray([hit["_source"]["rerank_embedding"] for hit in hits], dtype=np.float32))
    updates = [{"_op_type": "update", "_index": hit["_index"], "_id": hit["_id"], "routing": hit.get("_routing"),
                "doc": {"hubness": value}} for hit, value in zip(hits, values, strict=True)]
    written, failed = helpers.bulk(store.es, updates, refresh=True, raise_on_error=False)  # recall searches for it
    if errors := failed if isinstance(failed, list) else []:
        first = errors[0].get("update", {})
        raise AtlasError(f"hubness: {len(errors)} of {len(updates)} memories were not updated (first: "
                         f"{first.get('_id')}, {(first.get('error') or {}).get('reason')}); run it again")
    return written
