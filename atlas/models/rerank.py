"""Second stage: re-score the fused candidate pool.

The default is not a cross-encoder: it is a second, different embedding model
(multilingual-e5-small; the first stage is nomic-embed-text-v1.5) whose passage vectors are
stored at write time, so a recall costs one extra query embedding, one `mget` and a few
dot products. `atlas.core.fusion.combine` adds its z-scored similarity to the z-scored RRF score, which already
carries the first model's vote. A local cross-encoder or an HTTP rerank endpoint
(Elasticsearch `_inference/rerank`, Cohere/Jina-style `/rerank`) can replace it; every stage's
scores are z-scored the same way, so a cross-encoder's logits and an endpoint's 0-1 relevance weigh
alike against the fusion. Which second model, and what each choice measured: docs/evaluation.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from atlas.core.errors import EmbeddingError
from atlas.core.store import Embedder, SecondStage
from atlas.models.embed import load_embedder


@dataclass
class EmbeddingSecondStage:
    """The second model's cosine, from the stored passage vectors."""

    embedder: Embedder

    @property
    def name(self) -> str:
        return f"embedding:{self.embedder.name}"

    def scores(self, query: str, texts: Sequence[str], vectors: np.ndarray | None) -> np.ndarray:
        assert vectors is not None
        return vectors @ self.embedder.embed_queries([query])[0]


@dataclass
class CrossEncoderStage:
    """A sentence-transformers CrossEncoder from a local path (the package is optional)."""

    path: str
    embedder: None = None

    @property
    def name(self) -> str:
        return f"cross-encoder:{self.path}"

    @cached_property
    def model(self):  # a sentence_transformers.CrossEncoder; loading it costs seconds, so once per stage
        try:
            from sentence_transformers import CrossEncoder
        except ImportError:
            raise EmbeddingError("cross-encoder second stage needs `pip install sentence-transformers`") from None
        return CrossEncoder(self.path, local_files_only=True)

    def scores(self, query: str, texts: Sequence[str], vectors: np.ndarray | None) -> np.ndarray:
        return np.asarray(self.model.predict([(query, text) for text in texts]), dtype=np.float32)


@dataclass
class HttpRerankStage:
    """An HTTP rerank endpoint: Elasticsearch `_inference/rerank/<id>` or Cohere/Jina-style `/rerank`."""

    url: str
    model: str | None = None
    api_key: str | None = None
    timeout: float = 30.0
    embedder: None = None

    @property
    def name(self) -> str:
        return f"http:{self.url}"

    def build_body(self, query: str, texts: Sequence[str]) -> dict:
        if "_inference" in self.url:
            return {"query": query, "input": list(texts)}
        return {"query": query, "documents": list(texts), **({"model": self.model} if self.model else {})}

    def scores(self, query: str, texts: Sequence[str], vectors: np.ndarray | None) -> np.ndarray:
        import httpx  # only this endpoint needs it (the `llm` extra): `import atlas` works without

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            resp = httpx.post(self.url, json=self.build_body(query, texts), headers=headers, timeout=self.timeout)
            resp.raise_for_status()
            payload = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise EmbeddingError(f"rerank endpoint {self.url} failed: {exc}") from None
        results = payload.get("results") or payload.get("rerank") or payload.get("data") or []
        out = np.full(len(texts), np.nan, dtype=np.float32)
        try:
            for item in results:
                out[int(item["index"])] = float(item.get("relevance_score", item.get("score", 0.0)))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EmbeddingError(f"rerank endpoint {self.url} answered without an index and score per "
                                 f"document: {exc!r}") from None
        if np.isnan(out).all():
            raise EmbeddingError(f"rerank endpoint {self.url} scored none of the {len(texts)} documents")
        # A document the endpoint left out (a top_n cut) gets the lowest score it gave.
        return np.where(np.isnan(out), np.nanmin(out), out)


def load_second_stage(spec: str | None, *, cache_dir: Path | None = None,
                      progress: bool | None = None) -> SecondStage | None:
    """An embedder spec ('e5' is the default), 'embed:<embedder spec>', 'cross-encoder:/path',
    'http(s)://...#model', or 'none' (`progress`: the embedding cache's bar, as in `load_embedder`)."""
    if not spec or spec == "none":
        return None
    if spec.startswith("cross-encoder:"):
        return CrossEncoderStage(spec.removeprefix("cross-encoder:"))
    if spec.startswith(("http://", "https://")):
        url, _, model = spec.partition("#")
        return HttpRerankStage(url, model or None, os.environ.get("ATLAS_RERANK_API_KEY"))
    return EmbeddingSecondStage(load_embedder(spec.removeprefix("embed:"), cache_dir=cache_dir, progress=progress))
