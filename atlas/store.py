"""`Store`: the handles every layer needs (clients, index prefix, models, clock) in one place.

Writes go through the service credential; reads go through `reader(user)`, which the
tenancy layer points at the user's own DLS-restricted API key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from elasticsearch import Elasticsearch

from .clock import utcnow
from .config import Settings, load_settings
from .connection import connect
from .embed import Embedder, load_embedder
from .rerank import SecondStage, load_second_stage
from .schemas import all_indices, check_models, check_prefix, drop_indices, ensure_indices
from .scoring import DEFAULT_PARAMS, ScoringParams


@dataclass
class Store:
    """One Atlas namespace (index prefix) on one cluster."""

    es: Elasticsearch
    prefix: str
    embedder: Embedder
    second_stage: SecondStage | None = None
    #: Read client of a user; the default (service client) relies on the code filter alone.
    reader: Callable[[str], Elasticsearch] | None = None
    #: Called before a user's write; tenancy creates the user's read key there on first use.
    provision: Callable[[str], None] | None = None
    #: Second guard: every query also filters on user_id. Off only to prove DLS alone holds.
    code_filter: bool = True
    params: ScoringParams = DEFAULT_PARAMS
    now: Callable[[], datetime] = utcnow
    refresh: str = "true"
    settings: Settings = field(default_factory=load_settings)

    def read_client(self, user_id: str) -> Elasticsearch:
        return self.reader(user_id) if self.reader else self.es

    @property
    def indices(self) -> str:
        """Every memory index of the prefix and its archive, comma-joined (never `prefix-*`,
        which would also match a longer prefix such as `prefix-ci`)."""
        return ",".join(all_indices(self.prefix))

    @property
    def passage_embedders(self) -> dict[str, Embedder]:
        """Vector field -> model that fills it at write time."""
        fields = {"embedding": self.embedder}
        if self.second_stage is not None and self.second_stage.embedder is not None:
            fields["rerank_embedding"] = self.second_stage.embedder
        return fields

    def drop(self) -> None:
        """Drop every index of this prefix and invalidate its user keys (notebook and test cleanup)."""
        drop_indices(self.es, self.prefix)
        if self.provision is not None:
            from .tenancy import forget_prefix_keys  # tenancy builds on this module

            forget_prefix_keys(self)


def open_store(prefix: str | None = None, *, settings: Settings | None = None, es: Elasticsearch | None = None,
               embedder: Embedder | None = None, second_stage: SecondStage | None | str = "default",
               create: bool = True, now: Callable[[], datetime] | None = None,
               params: ScoringParams = DEFAULT_PARAMS, tenancy: bool = True) -> Store:
    """Connect, load the models and make sure the prefix's indices exist and match the schema.

    With `tenancy` (the default) every read goes through the user's own DLS-restricted API
    key and a user's first write creates it; without, reads use the service credential and
    the `user_id` filter alone (with a warning, see `atlas.tenancy`).
    """
    settings = settings or load_settings()
    cache = settings.embedding_cache_dir
    es = es or connect(settings)
    embedder = embedder or load_embedder(settings.embedder, cache_dir=cache)
    if second_stage == "default":
        second_stage = load_second_stage(settings.reranker, cache_dir=cache)
    store = Store(es=es, prefix=check_prefix(prefix or settings.index_prefix), embedder=embedder,
                  second_stage=second_stage, params=params, settings=settings)  # type: ignore[arg-type]
    if now is not None:
        store.now = now
    if create:
        rerank = store.passage_embedders.get("rerank_embedding")
        ensure_indices(es, store.prefix, embedder.dims, rerank.dims if rerank else None)
        check_models(es, store.prefix, {field: model.name for field, model in store.passage_embedders.items()})
    if tenancy:
        from .tenancy import enable_tenancy  # tenancy builds on this module

        enable_tenancy(store)
    return store
