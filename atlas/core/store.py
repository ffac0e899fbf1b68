"""`Store`: the handles every layer needs (clients, index prefix, models, clock) in one place.

Writes go through the service credential; reads go through `reader(user)`. That and `provision` and `forget`
are the tenancy hook: `atlas.security.tenancy` points them at the user's own DLS-restricted API key. The core
knows its two models only by the protocols below; `atlas.models` implements them and `atlas.stack.open_store` picks
them from the settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol, runtime_checkable

import numpy as np
from elasticsearch import Elasticsearch

from atlas import constants as C
from atlas.config import Settings, load_settings
from atlas.core.clock import utcnow
from atlas.core.schemas import all_indices, drop_indices
from atlas.core.scoring import DEFAULT_PARAMS, ScoringParams


@runtime_checkable
class Embedder(Protocol):
    """What recall and ingestion need from a model: fixed-size unit vectors for queries and passages.

    Rows are float32 and L2-normalised, so a dot product is a cosine. `name` identifies the vector
    space: it goes into cache keys and stored documents, so vectors of two models are never compared.
    """

    name: str
    dims: int

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...


class SecondStage(Protocol):
    """What recall needs from its second stage: one score per candidate of the fused pool."""

    @property
    def name(self) -> str: ...

    @property
    def embedder(self) -> Embedder | None:
        """Model whose passage vectors are stored in `rerank_embedding` at write time, if any."""
        ...

    def scores(self, query: str, texts: Sequence[str], vectors: np.ndarray | None) -> np.ndarray:
        """One score per candidate, higher is better, on any scale; `vectors` are the stored `rerank_embedding`s."""
        ...


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
    #: Called by `drop`; tenancy invalidates the prefix's user keys and forgets its tokens there.
    forget: Callable[[], None] | None = None
    #: Second guard: every query also filters on user_id. Off only to prove DLS alone holds.
    code_filter: bool = True
    params: ScoringParams = DEFAULT_PARAMS
    now: Callable[[], datetime] = utcnow
    #: Refresh policy of a single write (`C.WRITE_REFRESH`; the benchmark sweeps it).
    refresh: C.Refresh = C.WRITE_REFRESH
    #: Whether a recall counts as a use of the facts it returns, unless the call says (off for an audit such
    #: as the leak sweep, which must not change what it measures).
    touch: bool = True
    settings: Settings = field(default_factory=load_settings)
    #: Whether the memory tools count a recall as a use of the facts it returned (`recall.record_recall`); off for
    #: an audit such as the leak sweep, which must not change what it measures. `recall` itself only reads.
    record_use: bool = True

    def at(self, when: datetime) -> Store:
        """The same store with its clock stopped at `when`: what a recall or write made then would see and stamp."""
        return replace(self, now=lambda: when)

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
        """Drop every index of this prefix and, with tenancy, its user keys and tokens (notebook and test cleanup)."""
        drop_indices(self.es, self.prefix)
        if self.forget is not None:
            self.forget()
