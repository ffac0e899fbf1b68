"""`open_store`: the whole stack in one call, the entry point of notebooks, the CLI and the server.

It connects, loads the models the settings name (`atlas.models`), makes sure the prefix's
indices exist and match the schema, and turns on tenancy (`atlas.security.tenancy`). The core
takes its models as arguments; this is the one place that chooses them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

from elasticsearch import Elasticsearch

from atlas.config import Settings, load_settings
from atlas.core.errors import ValidationError
from atlas.core.schemas import check_models, check_prefix, ensure_indices
from atlas.core.scoring import DEFAULT_PARAMS, ScoringParams
from atlas.core.store import Embedder, SecondStage, Store
from atlas.models.embed import load_embedder
from atlas.models.rerank import load_second_stage
from atlas.security.connection import connect
from atlas.security.tenancy import enable_tenancy


def open_store(prefix: str | None = None, *, settings: Settings | None = None, es: Elasticsearch | None = None,
               embedder: Embedder | None = None, second_stage: SecondStage | None | Literal["default"] = "default",
               create: bool = True, now: Callable[[], datetime] | None = None,
               params: ScoringParams = DEFAULT_PARAMS, tenancy: bool = True) -> Store:
    """Connect, load the models and make sure the prefix's indices exist and match the schema.

    With `tenancy` (the default) every read goes through the user's own DLS-restricted API
    key and a user's first write creates it; without, reads use the service credential and
    the `user_id` filter alone (with a warning, see `atlas.security.tenancy`).
    """
    settings = settings or load_settings()
    if not (settings.routing_partition == 1 or 1 < settings.routing_partition < settings.shards):
        raise ValidationError(f"ATLAS_ROUTING_PARTITION is {settings.routing_partition}: 1, or more but fewer than "
                              f"the {settings.shards} shard(s) of each index (ATLAS_SHARDS), docs/scaling.md")
    cache = settings.embedding_cache_dir
    es = es or connect(settings)
    # The store's caches draw no bars: the operation that embeds many texts draws one (`bulk_load`).
    embedder = embedder or load_embedder(settings.embedder, cache_dir=cache, progress=False)
    if isinstance(second_stage, str):
        second_stage = load_second_stage(settings.reranker, cache_dir=cache, progress=False)
    store = Store(es=es, prefix=check_prefix(prefix or settings.index_prefix), embedder=embedder,
                  second_stage=second_stage, params=params, settings=settings)
    if now is not None:
        store.now = now
    if create:
        rerank = store.passage_embedders.get("rerank_embedding")
        ensure_indices(es, store.prefix, embedder.dims, rerank.dims if rerank else None,
                       shards=settings.shards, replicas=settings.replicas, partition=settings.routing_partition,
                       vector_index=settings.vector_index, source_vectors=settings.source_vectors)
        check_models(es, store.prefix, {field: model.name for field, model in store.passage_embedders.items()})
    if tenancy:
        enable_tenancy(store)
    return store
