"""Where Atlas finds its cluster, its secrets folder and its caches: environment first, then defaults.

Tuning constants are not here (see `atlas.constants`); this module only answers
"which cluster, which credentials, which folders, which models".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atlas import constants as C
from atlas.constants import DEFAULT_EMBEDDER, DEFAULT_INDEX_PREFIX, DEFAULT_RERANKER, SERVICE_PRINCIPAL

#: The checkout the package runs from (an editable install): its data/, results/ and es-plugin/.
REPO_ROOT = Path(__file__).resolve().parents[1]


def _find_home() -> Path:
    """ATLAS_HOME, else the nearest ancestor of the working directory that is an Atlas checkout."""
    if env := os.environ.get("ATLAS_HOME"):
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / ".atlas").is_dir() or (folder / "atlas" / "constants.py").is_file():
            return folder
    return Path.home() / ".atlas-home"


@dataclass(frozen=True)
class Settings:
    """Everything that differs between machines. Build with `load_settings()`."""

    home: Path
    #: An external cluster (Docker start-local, Elastic Cloud, self-managed); None means the local node.
    es_url: str | None = None
    es_api_key: str | None = None
    es_username: str | None = None
    es_password: str | None = None
    es_ca_certs: str | None = None
    #: Nodes of the local cluster (`atlas es up --nodes N`); node i listens on es_port + i - 1.
    es_nodes: int = 1
    es_port: int = C.SINGLE_NODE_HTTP_PORT
    es_transport_port: int = C.CLUSTER_TRANSPORT_PORT
    #: Heap of each local node.
    es_heap: str = C.SINGLE_NODE_HEAP
    #: Primary shards and replicas of each memory index (the catalog has `C.CATALOG_SHARDS`).
    shards: int = C.SINGLE_NODE_SHARDS
    replicas: int = C.SINGLE_NODE_REPLICAS
    #: Shards of each memory index that one user's documents spread over (`C.ROUTING_PARTITION_SIZE`).
    routing_partition: int = C.ROUTING_PARTITION_SIZE
    #: Index type of the kNN fields and whether vectors stay in `_source` (`C.VECTOR_INDEX`, `C.SOURCE_VECTORS`).
    vector_index: C.VectorIndex = C.VECTOR_INDEX
    source_vectors: bool = C.SOURCE_VECTORS
    index_prefix: str = DEFAULT_INDEX_PREFIX
    #: Where the embedding cache lives, when not under `cache_dir` (`atlas notebooks times` empties it for a cold run).
    embedding_cache: Path | None = None
    #: Name of Atlas's service user and of its role (`atlas.ops.service`).
    service_user: str = SERVICE_PRINCIPAL
    #: Embedder spec of the first stage (see `atlas.models.embed.load_embedder`).
    embedder: str = DEFAULT_EMBEDDER
    #: Second stage: an embedder spec, "cross-encoder:/path" or an HTTP rerank URL.
    reranker: str = DEFAULT_RERANKER
    llm_base_url: str | None = None
    llm_api_key: str | None = None
    llm_model: str | None = None
    #: How a JSON schema is asked of the endpoint (`atlas.models.llm.json_format`): "openai" (`json_schema`, also
    #: vLLM's and Ollama's) or "llama.cpp" (`json_object` with a `schema`, llama-cpp-python's server).
    llm_json: str = "openai"
    #: Addresses whose X-Forwarded-For the MCP server believes (the reverse proxies in front of it); none by default,
    #: so the throttle counts the peer that connected, whatever headers it sends.
    trusted_proxies: tuple[str, ...] = ()

    @property
    def cluster_name(self) -> str:
        """Name of the local cluster: `atlas-local`, or `atlas-local-N` for N nodes."""
        return "atlas-local" if self.es_nodes == 1 else f"atlas-local-{self.es_nodes}"

    @property
    def secrets_dir(self) -> Path:
        """Git-ignored folder of credentials (0700; files 0600). A local multi-node cluster has its own
        (its passwords are not the single node's)."""
        root = self.home / ".atlas"
        return root if self.es_nodes == 1 else root / self.cluster_name

    @property
    def local_credentials_path(self) -> Path:
        """The local node's URL and `elastic` password, written by `atlas es up` (`atlas.ops.cluster`): the
        operator's superuser, used to set the node up and never by a running Atlas process."""
        return self.secrets_dir / "elastic.json"

    @property
    def service_credentials_path(self) -> Path:
        """URL, user and password of Atlas's own least-privilege user, written by `atlas es up` or
        `atlas service create` (`atlas.ops.service`)."""
        return self.secrets_dir / "service.json"

    @property
    def es_dir(self) -> Path:
        """Git-ignored folder of the local node: distribution, config, data, logs, pid (a multi-node
        cluster keeps one folder per node under it, see `atlas.ops.cluster.nodes_for`)."""
        return Path(os.environ["ATLAS_ES_DIR"]) if os.environ.get("ATLAS_ES_DIR") else self.home / ".es"

    @property
    def node_urls(self) -> list[str]:
        """HTTP address of every node the client may use: ES_URL, or each local node."""
        if self.es_url:
            return [self.es_url]
        return [f"http://127.0.0.1:{self.es_port + i}" for i in range(self.es_nodes)]

    @property
    def cache_dir(self) -> Path:
        """Content-keyed caches (embeddings, downloads)."""
        return self.home / ".cache"

    @property
    def embedding_cache_dir(self) -> Path:
        """The on-disk vectors of every model, keyed by model and text (`atlas.models.embed.CachedEmbedder`)."""
        return self.embedding_cache or self.cache_dir / "embeddings"

    @property
    def outputs_dir(self) -> Path:
        return self.home / "outputs"

    @property
    def local(self) -> bool:
        """True when Atlas runs (and may start) its own node rather than an external cluster."""
        return self.es_url is None

    @property
    def url(self) -> str:
        return self.es_url or f"http://127.0.0.1:{self.es_port}"


def local_llm_url() -> str:
    """The OpenAI-compatible URL of the local server `atlas llm up` starts."""
    return f"http://127.0.0.1:{C.LLM_PORT}/v1"


def llm_endpoint(base_url: str | None, api_key: str | None, model: str | None,
                 json: str | None) -> dict[str, str | None]:
    """The chat endpoint's settings: as given, or, with neither a base URL nor a key, the local server that
    `atlas llm up` starts (loopback, `C.LLM_PORT`, serving `model` or `C.LOCAL_LLM_MODEL`, schemas the llama.cpp
    way)."""
    if base_url is None and api_key is None:
        base_url, model, json = local_llm_url(), model or C.LOCAL_LLM_MODEL, json or "llama.cpp"
    return {"llm_base_url": base_url, "llm_api_key": api_key, "llm_model": model, "llm_json": json or "openai"}


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment (ES_URL, ES_API_KEY, ES_USERNAME, ES_PASSWORD, ES_CA_CERTS,
    ATLAS_ES_NODES, ATLAS_ES_PORT, ATLAS_ES_TRANSPORT_PORT, ATLAS_ES_HEAP, ATLAS_SHARDS, ATLAS_REPLICAS,
    ATLAS_ROUTING_PARTITION,
    ATLAS_INDEX_PREFIX, ATLAS_EMBEDDING_CACHE, ATLAS_SERVICE_USER, ATLAS_EMBEDDER, ATLAS_RERANKER, OPENAI_BASE_URL,
    OPENAI_API_KEY, ATLAS_LLM_MODEL, ATLAS_LLM_JSON, ATLAS_TRUSTED_PROXIES: comma-separated), then keyword
    overrides. Ports, heap, shards and replicas default by the number of local nodes."""
    env = os.environ.get
    nodes = int(str(overrides.get("es_nodes") or env("ATLAS_ES_NODES", "1")))
    single = nodes == 1
    values: dict[str, Any] = {  # each a field of `Settings`, of that field's type
        "home": _find_home(),
        "es_url": env("ES_URL") or None,
        "es_api_key": env("ES_API_KEY") or None,
        "es_username": env("ES_USERNAME") or None,
        "es_password": env("ES_PASSWORD") or None,
        "es_ca_certs": env("ES_CA_CERTS") or None,
        "es_nodes": nodes,
        "es_port": int(env("ATLAS_ES_PORT", C.SINGLE_NODE_HTTP_PORT if single else C.CLUSTER_HTTP_PORT)),
        "es_transport_port": int(env("ATLAS_ES_TRANSPORT_PORT", C.CLUSTER_TRANSPORT_PORT)),
        "es_heap": env("ATLAS_ES_HEAP", C.SINGLE_NODE_HEAP if single else C.CLUSTER_HEAP),
        "shards": int(env("ATLAS_SHARDS", C.SINGLE_NODE_SHARDS if single else nodes)),
        "replicas": int(env("ATLAS_REPLICAS", C.SINGLE_NODE_REPLICAS if single else C.CLUSTER_REPLICAS)),
        "routing_partition": int(env("ATLAS_ROUTING_PARTITION", C.ROUTING_PARTITION_SIZE)),
        "index_prefix": env("ATLAS_INDEX_PREFIX", DEFAULT_INDEX_PREFIX),
        "embedding_cache": Path(cache) if (cache := env("ATLAS_EMBEDDING_CACHE")) else None,
        "service_user": env("ATLAS_SERVICE_USER", SERVICE_PRINCIPAL),
        "embedder": env("ATLAS_EMBEDDER", DEFAULT_EMBEDDER),
        "reranker": env("ATLAS_RERANKER", DEFAULT_RERANKER),
        **llm_endpoint(env("OPENAI_BASE_URL") or None, env("OPENAI_API_KEY") or None, env("ATLAS_LLM_MODEL") or None,
                       env("ATLAS_LLM_JSON") or None),
        "trusted_proxies": tuple(part.strip() for part in env("ATLAS_TRUSTED_PROXIES", "").split(",") if part.strip()),
    }
    values.update(overrides)
    return Settings(**values)
