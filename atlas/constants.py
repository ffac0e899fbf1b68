"""Every tunable and every vocabulary of Atlas, defined once.

Names follow the design. Functions that use a tunable take it as a keyword
argument defaulting to the value here, so that a notebook can sweep it.
"""

from __future__ import annotations

from typing import Literal, get_args

# --- vocabularies -----------------------------------------------------------
#: Types a user writes; the catalog is world data loaded by an operator.
UserMemoryType = Literal["episodic", "semantic", "procedural"]
USER_MEMORY_TYPES: tuple[UserMemoryType, ...] = get_args(UserMemoryType)
MemoryType = Literal[UserMemoryType, "catalog"]
MEMORY_TYPES: tuple[MemoryType, ...] = get_args(MemoryType)

Contradiction = Literal["natural", "harsh"]
CONTRADICTIONS: tuple[Contradiction, ...] = get_args(Contradiction)

FactType = Literal["preference", "device", "home", "person", "location", "routine", "issue", "other"]
FACT_TYPES: tuple[FactType, ...] = get_args(FactType)

RecallMode = Literal["bm25", "dense", "hybrid", "hybrid+rerank"]
RECALL_MODES: tuple[RecallMode, ...] = get_args(RecallMode)
DEFAULT_RECALL_MODE: RecallMode = "hybrid+rerank"

#: What each memory type holds: tool descriptions and the agent's system prompt are built from it.
MEMORY_TYPE_MEANINGS: dict[MemoryType, str] = {
    "episodic": "the user's own messages, verbatim, with their time",
    "semantic": "distilled facts about the user in the third person, e.g. \"Sarah's hub is on Zigbee channel 20\"",
    "procedural": "playbooks: the ordered steps that fixed a problem, with their trigger and success rate",
    "catalog": "shared product, firmware and error-code documentation (read-only)",
}

#: When to use each kind of contradiction when a new fact supersedes older ones.
CONTRADICTION_MEANINGS: dict[Contradiction, str] = {
    "natural": "the world changed and the old fact was true until now (a move, new firmware, a new job or tariff)",
    "harsh": "the user says the old fact was wrong all along (\"no, it was never a G1, it's a GD-200\"); "
             "the new fact is stored with lower confidence",
}

# --- models -------------------------------------------------------------------
#: Embedder spec of the first stage (kNN) and of the second stage, unless ATLAS_EMBEDDER / ATLAS_RERANKER say.
DEFAULT_EMBEDDER = "nomic"
DEFAULT_RERANKER = "e5"

# --- the local cluster and index layout -------------------------------------------
#: HTTP and transport port of the local single node (`ATLAS_ES_PORT`), and its heap (`ATLAS_ES_HEAP`).
SINGLE_NODE_HTTP_PORT = 9200
SINGLE_NODE_HEAP = "1g"
#: A local multi-node cluster (`atlas es up --nodes N`): node i (1..N) listens on these ports + i - 1, so
#: it runs beside the single node. Each node's heap is smaller: three of them share one machine.
CLUSTER_HTTP_PORT = 9201
CLUSTER_TRANSPORT_PORT = 9301
CLUSTER_HEAP = "512m"
#: Primary shards and replicas of each memory index, unless ATLAS_SHARDS / ATLAS_REPLICAS say:
#: one and none on one node; on several nodes, one primary per node and one replica of each.
SINGLE_NODE_SHARDS, SINGLE_NODE_REPLICAS = 1, 0
CLUSTER_REPLICAS = 1
#: The catalog is world data without an owner, read by every recall: one shard, so that a recall routed
#: by its user still reads all of it.
CATALOG_SHARDS = 1
#: Shards each user's documents spread over (`index.routing_partition_size`), unless ATLAS_ROUTING_PARTITION says:
#: one, so that a recall asks one shard per index; more spreads a heavy user's load (docs/scaling.md, hot shards).
ROUTING_PARTITION_SIZE = 1

# --- index names ------------------------------------------------------------
DEFAULT_INDEX_PREFIX = "atlas"
ARCHIVE_SUFFIX = "archive"
STATE_SUFFIX = "state"
#: Users' read keys and token hashes (`atlas.security.credentials`): the service principal's alone.
CREDENTIALS_SUFFIX = "credentials"

# --- hybrid recall ------------------------------------------------------------
#: Reciprocal rank fusion: score = sum over paths of 1 / (RRF_RANK_CONSTANT + rank).
RRF_RANK_CONSTANT = 30
#: Candidates taken from each retrieval path (BM25 and kNN) before fusion.
RRF_WINDOW = 80
#: HNSW graph of the kNN field: links per node and candidates examined while building it.
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 100
#: How the kNN fields (`embedding`, `sentences.embedding`) are indexed: full floats, or quantized to one byte or
#: one bit per dimension (raw floats kept on disk beside them, for rescoring and reading back).
VectorIndex = Literal["hnsw", "int8_hnsw", "bbq_hnsw"]
#: Chosen by measurement (docs/benchmarks.md "Compact vectors", `scripts/vector_formats.py`).
VECTOR_INDEX: VectorIndex = "bbq_hnsw"
#: A `bbq_hnsw` search re-scores this many times `k` candidates with the raw float vectors.
BBQ_OVERSAMPLE = 3.0
#: Elasticsearch builds `bbq_hnsw` for this many dimensions or more; a narrower model's field gets `int8_hnsw`.
BBQ_MIN_DIMS = 64
#: Whether vectors are kept as JSON floats in `_source` (schema v3 did). Without, they are read back from the
#: vector files on request (`"_source": {"exclude_vectors": false}`, naming the field in `includes`, or as doc values).
SOURCE_VECTORS = False
#: The BM25 path's first phase: 0 multiplies every matching memory's score by recency, use and priors; N takes the
#: top N per shard by the words' weights alone, which Elasticsearch finds without scoring every match, and
#: multiplies those (`rescore`).
BM25_RESCORE_WINDOW = 0
#: In that first phase, ties go to the newest: a `distance_feature` on `timestamp` of at most this much.
RESCORE_TIE_BOOST = 1e-4
#: HNSW candidates examined per shard for the kNN path.
KNN_NUM_CANDIDATES = 200
#: How many fused candidates the second stage re-scores.
RERANK_POOL = 40
#: Weight of the fused-rank prior (z-scored RRF) against the second model's z-scored similarity.
RERANK_RRF_WEIGHT = 1.0
#: Hubness penalty of the embedding second stage: a candidate's cosine minus HUB_PENALTY x its `hubness`, the mean
#: cosine of its HUB_NEIGHBOURS most similar memories of the same owner (`atlas.core.hubness`). Chosen on LoCoMo dev
#: and the persona set (docs/evaluation.md, "Hubness"); 0 turns it off.
HUB_PENALTY = 1.0
HUB_NEIGHBOURS = 30
#: A single write looks for those neighbours among this many of the owner's memories nearest by the first model
#: (`documents.neighbour_hubness`: the second model's vectors have no kNN graph).
HUB_CANDIDATES = 100
#: Weights in the BM25 path, `text` (stemmed) having 1: `text.exact` (whole tokens such as "E-0x41";
#: at full weight its unstemmed stop words outvote the content words) and `context` (the messages an
#: episode follows).
EXACT_BOOST = 0.3
#: Whether a query's stop words are searched in `text.exact`. Its analyzer keeps them (for tokens like "E-0x41");
#: searched, they let a chatty turn that shares only "the" or "on" with the query into BM25's top 10
#: (docs/evaluation.md, "Stop words in `text.exact`").
EXACT_STOP_WORDS = False
CONTEXT_BOOST = 0.4
#: An episode's `context` as the loaders and the agent build it: the messages before it in its session,
#: oldest first, at most this many (for an agent: the user's previous message and its own last reply).
#: BM25 searches them all; only the last, the one the turn replies to, is embedded with the text: with
#: more, mean pooling drowned the turn's own words (docs/evaluation.md, "Reply context").
CONTEXT_MESSAGES = 2
#: A turn that names its speaker and says at least two sentences of at least this many words gets one
#: vector per sentence too, each headed by the speaker; the kNN path scores a passage by its best vector.
SENTENCE_MIN_WORDS = 3
#: Stop words of the `english` analyzer of `text` and `context`: Lucene's English set plus
#: pronouns, auxiliaries and question words, which a question shares with every chatty turn.
ENGLISH_STOPWORDS: tuple[str, ...] = tuple(sorted(set("""
a an and are as at be but by for if in into is it no not of on or such that the their then there these they this
to was will with i me my mine myself we us our ours ourselves you your yours yourself yourselves he him his himself
she her hers herself its itself them theirs themselves what which who whom whose when where why how am were been
being have has had having do does did doing done can could would should shall may might must about above after
again against all any because before below between both during each few from further here more most other out over
own same so some than too under until up very just only also nor off once while through down
""".split())))
MAX_K = 200
#: Words of a query the BM25 path uses: a pasted 100 kB message would exceed the cluster's clause limit.
MAX_QUERY_TERMS = 256
#: Longest query accepted (characters); longer is refused. BM25 reads MAX_QUERY_TERMS words and the embedders
#: EMBED_MAX_TOKENS tokens, about 1,500 characters of English, so this leaves room for long words and codes;
#: a longer query is a pasted document, searched with the head of it (`atlas.core.recall.clip_query`).
#: Memories themselves may be far longer (MAX_TEXT_CHARS).
MAX_QUERY_CHARS = 4_000

# --- decay, use and priors ------------------------------------------------------
#: Recency multiplier is 1.0 for documents younger than this.
DECAY_OFFSET = "180d"
#: ... then falls (Gaussian) to DECAY_AT_SCALE at DECAY_OFFSET + DECAY_SCALE.
DECAY_SCALE = "1825d"
DECAY_AT_SCALE = 0.5
#: Semantic facts: multiplier 1 + log10(1 + use_count) * USE_COUNT_WEIGHT.
USE_COUNT_WEIGHT = 0.2
#: Catalog documents are world data, a little below a user's own memory.
CATALOG_SOURCE_PRIOR = 0.85
#: Episodes said within the period a question names ("in June 2024", "last week"): score x PERIOD_BOOST; facts that
#: began to hold only after it: score / PERIOD_BOOST.
PERIOD_BOOST = 2.0
#: "N days ago" with N above this (a century) names no period; a million days would overflow the date arithmetic.
MAX_DAYS_AGO = 36_525
#: Confidence taken off a fact written with contradiction="harsh".
SUPERSEDE_CONFIDENCE_PENALTY = 0.1
#: Procedural success-rate multiplier (smoothed); 0 switches it off (the reference default).
PROCEDURAL_SUCCESS_WEIGHT = 0.0
#: Laplace smoothing of the procedural success rate (successes + a) / (runs + 2a).
PROCEDURAL_SUCCESS_SMOOTHING = 1.0

# --- writing ----------------------------------------------------------------
#: Refresh policy of a single write: visible to a recall in the same turn.
Refresh = Literal["true", "wait_for", "false"]
WRITE_REFRESH: Refresh = "true"
#: Retries of an optimistic-concurrency update before giving up.
OCC_RETRIES = 20
#: Documents embedded and indexed per `_bulk` request of a load (`bulk_load`).
BULK_BATCH = 256
#: Longest text accepted in one memory (characters); longer is refused.
MAX_TEXT_CHARS = 200_000
#: Longest passage an embedder sees, in model tokens; longer is truncated with a warning.
EMBED_MAX_TOKENS = 256
#: Texts per model call of the int8 nomic model (its vectors do not depend on the batch). On this 2-core
#: machine, 384 persona memories: 26 texts/s one at a time, 35 in batches of 8, 27 in batches of 32
#: (`scripts/nomic_batching.py`).
NOMIC_BATCH = 8

# --- listing ------------------------------------------------------------------
#: Page size of listings that page until done (API keys of a prefix, users with memory).
LIST_PAGE_SIZE = 1000

# --- archive -----------------------------------------------------------------
#: `archive` moves documents superseded longer ago than this, this many per page.
ARCHIVE_OLDER_THAN = "90d"
ARCHIVE_BATCH = 500

# --- privacy (atlas.security.privacy) ---------------------------------------------------
#: Documents one page of an erasure or an export reads (point-in-time paging), and `_bulk` deletes at once.
PRIVACY_BATCH = 500
#: How long a point in time of those pages stays open between two pages.
PIT_KEEP_ALIVE = "2m"
#: Seconds an erasure waits for the merge that takes its deleted documents out of the term statistics (the cluster
#: keeps deleted documents for its replicas until their retention leases move up, every 30 s or so), and between
#: two looks at those leases.
ERASE_MERGE_TIMEOUT = 300
ERASE_MERGE_POLL = 2.0

# --- serving ------------------------------------------------------------------
#: Where `atlas serve` listens unless told otherwise (loopback only).
MCP_HOST = "127.0.0.1"
MCP_PORT = 8765

# --- the service principal (atlas.ops.service) ----------------------------------------
#: The Elasticsearch user (and role) every Atlas process runs as, unless ATLAS_SERVICE_USER names another;
#: the operator's superuser only sets it up.
SERVICE_PRINCIPAL = "atlas_service"
#: Cluster privileges of that role: read cluster state and health (`monitor`), make, read and invalidate
#: the user keys it owns (`manage_own_api_key`), and keep the prefixes' index templates.
SERVICE_CLUSTER_PRIVILEGES = ("monitor", "manage_own_api_key", "manage_index_templates")
#: Index privileges on the prefixes' indices: create, map, refresh and drop them, read and write documents.
SERVICE_INDEX_PRIVILEGES = ("create_index", "manage", "read", "write")
#: Index patterns the role covers unless `atlas service create --indices` says otherwise: every
#: non-system index, for a cluster that holds Atlas alone. On a shared cluster name the prefixes.
SERVICE_INDEX_PATTERNS = ("*",)

#: What a user's DLS key may do: search and multi-search (a count is a search), not all of `read`, whose
#: `_termvectors` prints a word's document frequency over every tenant's documents of the shard, and whose `_get`
#: and `_explain` Atlas never needs.
USER_KEY_PRIVILEGES = ("indices:data/read/search*", "indices:data/read/msearch*")

# --- bearer tokens (atlas.security.tokens) ------------------------------------------------
#: Every Atlas token starts with this, so a leaked one is recognisable (secret scanners, logs).
TOKEN_PREFIX = "atl_"
#: Random bytes of a token (`secrets.token_urlsafe`): 256 bits, so a plain sha256 is a safe stored form.
TOKEN_BYTES = 32
#: Lifetime of a token unless `--expiration` says otherwise.
TOKEN_EXPIRATION = "90d"
#: Seconds a server trusts its in-memory copy of the tokens and of a user's stored key (the credentials index): a
#: revocation or rotation through another server is honoured within this bound, through this process at once.
TOKEN_CACHE_SECONDS = 5.0
#: Failed authentications one client address may make per window before it gets 429.
AUTH_FAILURE_LIMIT = 10
#: The window of that limit, in seconds (also the longest Retry-After).
AUTH_FAILURE_WINDOW = 60.0
#: Client addresses the throttle remembers at most (the stalest are forgotten first).
AUTH_THROTTLE_CLIENTS = 10_000

# --- agent tools ----------------------------------------------------------------
#: Hits an agent sees per recall: the pre-recall of every turn and the recall tool's default.
RECALL_K = 8
#: How an agent turn lets the model decide what to remember (`atlas.serve.agent`): narrow questions with constrained
#: answers, or an open loop with the three tools.
AgentMode = Literal["guided", "tools"]
AGENT_MODES: tuple[AgentMode, ...] = get_args(AgentMode)
#: Model calls of one agent turn before it gives up (a model stuck calling tools).
AGENT_MAX_STEPS = 8
#: Seconds one call to the OpenAI-compatible endpoint may take.
LLM_TIMEOUT = 60.0
#: Attempts of one LLM request (timeouts, rate limits, malformed JSON) before `LLMError`.
LLM_ATTEMPTS = 4
#: First backoff between attempts, in seconds; doubled after each failure.
LLM_BACKOFF = 1.0
#: Sampling temperature of every request the agent sends: 0, so that a turn is reproducible on one machine.
LLM_TEMPERATURE = 0.0
#: Words of which the user's own message must hold one for the agent to run the model's `forget_memory`: a memory
#: that says "forget everything", read back into the prompt, must not make a model delete anything.
FORGET_WORDS = ("forget", "delete", "remove", "erase")

#: Tokens of one answer of a guided turn's narrow questions (`atlas.serve.guided`), and of its reply.
GUIDED_MAX_TOKENS = 200
#: Times a guided question's unusable answer is shown back to the model before the question is given up.
GUIDED_RETRIES = 1
GUIDED_ANSWER_TOKENS = 160
#: Exchanges of the session (user message and reply) a guided answer sees before the message.
GUIDED_HISTORY = 1
#: A guided turn asks whether a playbook worked only when one is among the pre-recall's first hits, and the message
#: holds one of these words.
GUIDED_OUTCOME_RANK = 3
OUTCOME_WORDS = ("worked", "work", "fixed", "didn", "help", "helped", "thanks", "still", "failed", "success")

# --- the local model server (`atlas llm up`, atlas.ops.llm_server) ----------------
#: Loopback port of the local OpenAI-compatible server; OPENAI_BASE_URL defaults to it.
LLM_PORT = 8081
#: The model it serves by default (a key of `atlas.ops.llm_server.LOCAL_MODELS`); ATLAS_LLM_MODEL defaults to it.
LOCAL_LLM_MODEL = "smollm2-135m"
#: Context window of the local server, in tokens: the system prompt, the tools' schemas, a recall and a few turns.
LLM_CONTEXT = 8192

# --- consolidation ----------------------------------------------------------------
#: Embedder spec whose cosines the consolidation similarities below are, whatever the first stage is.
CONSOLIDATION_EMBEDDER = "minilm"
#: Proposed facts below this confidence are not written.
CONSOLIDATION_MIN_CONFIDENCE = 0.6
#: A proposed fact at least this similar (cosine, CONSOLIDATION_EMBEDDER) to a current fact of the user is a duplicate.
CONSOLIDATION_DEDUP_SIMILARITY = 0.90
#: A proposed playbook whose trigger is at least this similar to an existing playbook's is not new.
CONSOLIDATION_TRIGGER_SIMILARITY = 0.80
#: Episodes one consolidation run reads (oldest first); the rest wait for the next run.
CONSOLIDATION_BATCH = 200
#: `maybe_consolidate` runs once a user has this many episodes past the watermark.
CONSOLIDATE_EVERY = 20
#: The proposer consolidation runs unless told (a key of `atlas.consolidation.proposers.PROPOSERS`): for every model
#: recorded, the run with the higher mean precision and recall on data/consolidation, the rules or a proposer on that
#: model (metrics.json; tests/test_consolidate.py checks it). The rules, ahead of both local models (docs/llm.md).
CONSOLIDATION_PROPOSER = "rule"
#: Rule baseline: a statement with a change cue retires the most similar current fact at or above this cosine.
CONSOLIDATION_RULE_SUPERSEDE_SIMILARITY = 0.5
#: Rule baseline: feedback is about the playbook most similar to its session, at or above this cosine.
CONSOLIDATION_RULE_PLAYBOOK_SIMILARITY = 0.4
#: Guided proposer: a new fact is shown at most this many current facts, the most similar to it and at or above
#: CONSOLIDATION_GUIDED_SIMILARITY, to pick the ones it makes untrue (few enough for a small model to read).
CONSOLIDATION_GUIDED_CANDIDATES = 5
CONSOLIDATION_GUIDED_SIMILARITY = 0.5
#: Evaluation: a proposed fact matches a labelled one at or above this cosine (and with a shared episode).
CONSOLIDATION_MATCH_SIMILARITY = 0.7
