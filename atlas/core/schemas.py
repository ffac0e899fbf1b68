"""Index names, mappings and their lifecycle: create, check, upgrade, drop.

All four memory indices (and the archive) share one component template of common
fields, so one query spans them all: a decay function fails on a field that is
unmapped in any searched index. Type-specific fields are added per index.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from elasticsearch import ApiError, Elasticsearch

from atlas.constants import (
    ARCHIVE_SUFFIX,
    BBQ_MIN_DIMS,
    BBQ_OVERSAMPLE,
    CATALOG_SHARDS,
    ENGLISH_STOPWORDS,
    HNSW_EF_CONSTRUCTION,
    HNSW_M,
    MEMORY_TYPES,
    ROUTING_PARTITION_SIZE,
    SINGLE_NODE_REPLICAS,
    SINGLE_NODE_SHARDS,
    SOURCE_VECTORS,
    STATE_SUFFIX,
    USER_MEMORY_TYPES,
    VECTOR_INDEX,
    MemoryType,
    VectorIndex,
)
from atlas.core.errors import SchemaMismatch, ValidationError

PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,40}$")

#: Bumped when a mapping changes; stored in `_meta` so a mismatch names both versions.
SCHEMA_VERSION = 7

KEYWORD = {"type": "keyword"}
DATE = {"type": "date"}


def check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not PREFIX_PATTERN.fullmatch(prefix):
        raise ValidationError(f"index prefix {prefix!r} must match {PREFIX_PATTERN.pattern}")
    return prefix


def index_name(prefix: str, memory_type: MemoryType) -> str:
    return f"{check_prefix(prefix)}-{memory_type}"


def archive_name(prefix: str) -> str:
    return f"{check_prefix(prefix)}-{ARCHIVE_SUFFIX}"


def state_name(prefix: str) -> str:
    """Consolidation watermarks and plans (service credential only; no memory in it)."""
    return f"{check_prefix(prefix)}-{STATE_SUFFIX}"


def all_indices(prefix: str, *, archive: bool = True) -> list[str]:
    names = [index_name(prefix, t) for t in MEMORY_TYPES]
    return names + [archive_name(prefix)] if archive else names


def memory_type_of(index: str, prefix: str) -> MemoryType:
    """The memory type an index name stands for (hits carry index names)."""
    suffix = index.removeprefix(f"{prefix}-")
    if suffix not in MEMORY_TYPES:
        raise ValidationError(f"{index} is not a memory index of prefix {prefix}")
    return suffix


def vector_index_options(dims: int, vector_index: VectorIndex = VECTOR_INDEX) -> dict:
    """`index_options` of a kNN field of `dims` dimensions; a `bbq_hnsw` search re-scores `BBQ_OVERSAMPLE` x k
    candidates with the raw floats, which quantization keeps on disk (below `BBQ_MIN_DIMS`: `int8_hnsw`)."""
    if vector_index == "bbq_hnsw" and dims < BBQ_MIN_DIMS:
        vector_index = "int8_hnsw"
    options: dict = {"type": vector_index, "m": HNSW_M, "ef_construction": HNSW_EF_CONSTRUCTION}
    if vector_index == "bbq_hnsw":
        options["rescore_vector"] = {"oversample": BBQ_OVERSAMPLE}
    return options


def common_mappings(dims: int, rerank_dims: int | None, *, vector_index: VectorIndex = VECTOR_INDEX,
                    source_vectors: bool = SOURCE_VECTORS) -> dict:
    """Fields every memory index has, so that one query (and its decay functions) spans all."""
    vector = {"type": "dense_vector", "dims": dims, "similarity": "cosine", "index": True,
              "index_options": vector_index_options(dims, vector_index)}
    properties: dict = {
        # text: stemmed, without stop words; text.exact keeps tokens such as "E-0x41" or "17.4" whole (lowercased).
        "text": {"type": "text", "analyzer": "atlas_english",
                 "fields": {"exact": {"type": "text", "analyzer": "atlas_exact"}}},
        # The turn an episode replies to: searched (at CONTEXT_BOOST) and embedded with the text.
        "context": {"type": "text", "analyzer": "atlas_english"},
        "embedding": vector,
        # A speaker's sentences, one vector each (`atlas.core.passages.passage_sentences`), same model.
        "sentences": {"type": "nested", "properties": {"embedding": vector}},
        "speaker": KEYWORD,
        "embed_model": KEYWORD,
        "rerank_model": KEYWORD,
        "user_id": KEYWORD,
        "memory_type": KEYWORD,
        "source_key": KEYWORD,
        "timestamp": DATE,
        "created_at": DATE,
        "last_used_at": DATE,
        "use_count": {"type": "integer"},
        "confidence": {"type": "float"},
        "superseded_by": KEYWORD,
        "superseded_at": DATE,
        # A fact's valid time, where known (`documents.valid_start`): from when it held, and until when.
        "valid_from": DATE,
        "valid_to": DATE,
        "supersedes": KEYWORD,
        "contradiction": KEYWORD,
        "supporting_episode_ids": KEYWORD,
        "session_id": KEYWORD,
        "fact_type": KEYWORD,
        "archived_from": KEYWORD,
        # A LangGraph store item (`atlas.integrations.langgraph`): its namespace (the labels joined by ".", which no
        # label holds), its key, and its value as given, kept in `_source` and not indexed.
        "namespace": KEYWORD,
        "key": KEYWORD,
        "value": {"type": "object", "enabled": False},
        # Mean cosine to the owner's most similar memories, held against a candidate by the second stage
        # (`atlas.core.hubness`); written for all of an owner's memories at once, absent until then.
        "hubness": {"type": "float"},
    }
    if rerank_dims:
        # Read back by the second stage, never searched: no HNSW graph to build.
        properties["rerank_embedding"] = {"type": "dense_vector", "dims": rerank_dims, "index": False}
    if not source_vectors:
        # No vector is in `_source` (`index_settings`); each is read back from its vector file on request.
        return {"dynamic": "strict", "properties": properties}
    # Schema v3 (`source_vectors`, kept to measure against): sentence vectors were indexed but left out of
    # `_source`, and could not be read back at all.
    return {"dynamic": "strict", "_source": {"excludes": ["sentences"]}, "properties": properties}


TYPE_MAPPINGS: dict[str, dict] = {
    "procedural": {
        "name": {"type": "text", "fields": {"raw": KEYWORD}},
        "trigger": {"type": "text"},
        "steps": {"type": "text"},
        "refined_steps": {"type": "text"},
        "success_count": {"type": "integer"},
        # Smoothed success rate, kept beside the counters: no script engine to divide at query time.
        "success_rate": {"type": "float"},
        "failure_count": {"type": "integer"},
        "last_success_at": DATE,
    },
    "catalog": {
        "title": {"type": "text", "fields": {"raw": KEYWORD}},
        "category": KEYWORD,
        "tags": KEYWORD,
    },
}


#: Every text field scores a matching term with the query's boost alone: the BM25 path gives each word its IDF among
#: the memories the user can read (`atlas.core.recall.term_weights`), so no score counts another tenant's documents.
#: A static setting: `ensure_indices` closes an older index to change it.
SIMILARITY = {"default": {"type": "boolean"}}


def index_settings(*, shards: int = SINGLE_NODE_SHARDS, replicas: int = SINGLE_NODE_REPLICAS,
                   source_vectors: bool = SOURCE_VECTORS) -> dict:
    """Settings every memory index shares: `shards` primaries (`Settings.shards`; a user's documents are
    routed to one of them, `documents.routing_of`) with `replicas` replicas each (`Settings.replicas`).

    Vectors are not kept in `_source` unless `source_vectors`: a search leaves them out, the archive asks for them
    (`"_source": {"exclude_vectors": false}`), recall and a write's neighbours read e5's as `docvalue_fields`.
    """
    return {
        "number_of_shards": shards,
        "number_of_replicas": replicas,
        "mapping": {"exclude_source_vectors": not source_vectors},
        "similarity": SIMILARITY,
        # An erasure's `_forcemerge?only_expunge_deletes` rewrites every segment holding a deleted document (the
        # default, 10%, would leave a few erased documents in the term statistics).
        "merge": {"policy": {"expunge_deletes_allowed": 0}},
        "analysis": {"analyzer": {
            "atlas_exact": {"type": "custom", "tokenizer": "whitespace", "filter": ["lowercase"]},
            "atlas_english": {"type": "english", "stopwords": list(ENGLISH_STOPWORDS)},
        }},
    }


def index_mappings(suffix: str, dims: int, rerank_dims: int | None, *, vector_index: VectorIndex = VECTOR_INDEX,
                   source_vectors: bool = SOURCE_VECTORS) -> dict:
    """Full mapping of one index: common fields, plus every type-specific field for the archive."""
    mappings = common_mappings(dims, rerank_dims, vector_index=vector_index, source_vectors=source_vectors)
    extra = TYPE_MAPPINGS.get(suffix, {}) if suffix != ARCHIVE_SUFFIX else \
        {k: v for fields in TYPE_MAPPINGS.values() for k, v in fields.items()}
    mappings["properties"] = {**mappings["properties"], **extra}
    mappings["_meta"] = {"atlas_schema_version": SCHEMA_VERSION}
    return mappings


def build_component_template_body(dims: int, rerank_dims: int | None, *, shards: int = SINGLE_NODE_SHARDS,
                                  replicas: int = SINGLE_NODE_REPLICAS, vector_index: VectorIndex = VECTOR_INDEX,
                                  source_vectors: bool = SOURCE_VECTORS) -> dict:
    """PUT _component_template/{prefix}-common"""
    return {"template": {"settings": index_settings(shards=shards, replicas=replicas, source_vectors=source_vectors),
                         "mappings": common_mappings(dims, rerank_dims, vector_index=vector_index,
                                                     source_vectors=source_vectors)},
            "_meta": {"atlas_schema_version": SCHEMA_VERSION}}


def build_index_template_body(prefix: str) -> dict:
    """PUT _index_template/{prefix}-memory: exact names, so prefixes never overlap."""
    return {"index_patterns": all_indices(prefix), "composed_of": [f"{prefix}-common"], "priority": 500,
            "_meta": {"atlas_schema_version": SCHEMA_VERSION}}


def _diff(expected: dict, actual: dict, path: str = "") -> list[str]:
    """Human-readable differences between two mapping trees (only what Atlas declares is compared)."""
    problems = []
    for key, want in expected.items():
        where = f"{path}.{key}" if path else key
        if key not in actual:
            problems.append(f"{where}: missing")
        elif isinstance(want, dict) and isinstance(actual[key], dict):
            problems += _diff(want, actual[key], where)
        elif str(want).lower() != str(actual[key]).lower():
            problems.append(f"{where}: expected {want!r}, found {actual[key]!r}")
    return problems


def index_problems(expected: dict, mapping: dict, settings: dict, *,
                   source_vectors: bool = SOURCE_VECTORS) -> tuple[list[str], list[str]]:
    """(mapping differences, similarity differences) of an existing index, from its `_mapping` and `_settings`.

    Where vectors are kept counts as a mapping difference: `index.mapping.exclude_source_vectors` is fixed at
    creation.
    """
    index = settings["settings"]["index"]
    excluded = str(index.get("mapping", {}).get("exclude_source_vectors", True)).lower() == "true"
    source = [] if excluded != source_vectors else \
        [f"index.mapping.exclude_source_vectors: expected {not source_vectors}, found {excluded}"]
    return (_diff({"properties": expected["properties"]}, mapping["mappings"]) + source,
            _diff({"similarity": SIMILARITY}, index))


def schema_version(mapping: dict) -> str:
    """`v<N>` of an existing index, from the `_meta` its `_mapping` carries, or "an unversioned schema"."""
    version = (mapping["mappings"].get("_meta") or {}).get("atlas_schema_version")
    return f"v{version}" if version is not None else "an unversioned schema"


def set_similarity(es: Elasticsearch, index: str) -> None:
    """Apply SIMILARITY to an existing index: closed for the moment it takes, its documents kept."""
    try:
        es.indices.close(index=index)
    except ApiError as exc:
        reason = (exc.body.get("error") or {}).get("reason") if isinstance(exc.body, dict) else None
        raise SchemaMismatch(f"{index} scores with another similarity than {SIMILARITY}, and closing it to "
                             f"change that failed ({reason or exc.message}). Drop the prefix "
                             "(atlas.core.schemas.drop_indices) to rebuild, or change the setting on the closed index "
                             "yourself.") from None
    try:
        # The old similarity's own parameters (BM25's `b`) are unknown to the new one: set them to null.
        old = es.indices.get_settings(index=index, name="index.similarity.*", flat_settings=True)[index]["settings"]
        new = {f"index.similarity.{name}.{key}": value for name, options in SIMILARITY.items()
               for key, value in options.items()}
        es.indices.put_settings(index=index, settings=dict.fromkeys(old) | new, flat_settings=True)
    finally:
        es.indices.open(index=index, wait_for_active_shards="all")


def ensure_indices(es: Elasticsearch, prefix: str, dims: int, rerank_dims: int | None, *, upgrade: bool = True,
                   shards: int = SINGLE_NODE_SHARDS, replicas: int = SINGLE_NODE_REPLICAS,
                   partition: int = ROUTING_PARTITION_SIZE, vector_index: VectorIndex = VECTOR_INDEX,
                   source_vectors: bool = SOURCE_VECTORS) -> dict[str, str]:
    """Create missing indices (a user's documents spread over `partition` shards of each user index); check existing
    ones. Returns {index: "created"|"ok"|"upgraded"}. New fields and another similarity are applied in place when
    `upgrade` (the latter closes the index for a moment); a changed field type or vector format cannot be, and raises
    `SchemaMismatch` naming each difference (export the users and import them into a new prefix, or drop the prefix).
    """
    es.cluster.put_component_template(name=f"{prefix}-common", **build_component_template_body(
        dims, rerank_dims, shards=shards, replicas=replicas, vector_index=vector_index, source_vectors=source_vectors))
    es.indices.put_index_template(name=f"{prefix}-memory", **build_index_template_body(prefix))
    indices = all_indices(prefix)
    # One request each for the whole prefix; an index missing from the answer does not exist yet.
    mappings = es.indices.get_mapping(index=",".join(indices), ignore_unavailable=True)
    settings = es.indices.get_settings(index=",".join(indices), ignore_unavailable=True)
    report: dict[str, str] = {}
    missing = [index for index in indices if index not in mappings]

    def create(index: str) -> None:
        suffix = index.removeprefix(f"{prefix}-")
        expected = index_mappings(suffix, dims, rerank_dims, vector_index=vector_index, source_vectors=source_vectors)
        # The catalog's world data has no owner to route by: one shard, which a routed recall reads whole. A partition
        # needs routing on every write, and is ignored unless the routing shards are the shards (elasticsearch#48863).
        spread = partition > 1 and suffix in USER_MEMORY_TYPES
        es.indices.create(index=index, mappings=expected | ({"_routing": {"required": True}} if spread else {}),
                          settings={"number_of_shards": CATALOG_SHARDS} if suffix == "catalog" else
                          {"routing_partition_size": partition, "number_of_routing_shards": shards} if spread else None)
        report[index] = "created"

    # Together: the master folds concurrent creations into fewer cluster-state updates (half the wait of one by one).
    with ThreadPoolExecutor(max_workers=max(1, len(missing))) as pool:
        list(pool.map(create, missing))
    for index in indices:
        if index in missing:
            continue
        suffix = index.removeprefix(f"{prefix}-")
        expected = index_mappings(suffix, dims, rerank_dims, vector_index=vector_index, source_vectors=source_vectors)
        problems, similarity = index_problems(expected, mappings[index], settings[index], source_vectors=source_vectors)
        if not problems and not similarity:
            report[index] = "ok"
            continue
        if upgrade and all(p.endswith(": missing") for p in problems):
            if problems:
                es.indices.put_mapping(index=index, properties=expected["properties"], meta=expected["_meta"])
            if similarity:
                set_similarity(es, index)
            report[index] = "upgraded"
            continue
        raise SchemaMismatch(f"{index} does not match Atlas's mapping (schema v{SCHEMA_VERSION}, "
                             f"{schema_version(mappings[index])} found): " + "; ".join(problems + similarity)
                             + f". Move each user to a new prefix (`atlas users export`, then `atlas users import "
                             f"--prefix NEW`: the texts are embedded again), or drop prefix {prefix!r} "
                             "(atlas.core.schemas.drop_indices) and load it again.")
    return {index: report[index] for index in indices}


#: Vector field -> the keyword field naming the model that filled it.
MODEL_FIELDS = {"embedding": "embed_model", "rerank_embedding": "rerank_model"}


def check_models(es: Elasticsearch, prefix: str, models: dict[str, str]) -> None:
    """Refuse a prefix whose vectors came from other models than `models` ({vector field: name}).

    Models of the same width (e5 and MiniLM both have 384 dimensions) fit the same mapping, so the
    mapping alone cannot tell their vectors apart, and a kNN search would compare two vector spaces
    without an error.
    """
    aggs = {field: {"terms": {"field": MODEL_FIELDS[field], "size": 10}} for field in models}
    found = es.search(index=",".join(all_indices(prefix)), size=0, aggs=aggs, ignore_unavailable=True)["aggregations"]
    problems = [f"`{field}` holds vectors of {', '.join(others)}, this store embeds with {models[field]}"
                for field in models
                if (others := sorted({b["key"] for b in found[field]["buckets"]} - {models[field]}))]
    if problems:
        raise SchemaMismatch(f"prefix {prefix!r}: " + "; ".join(problems) + ". Set ATLAS_EMBEDDER / ATLAS_RERANKER "
                             "to the models it was written with, or drop it and load again.")


def drop_indices(es: Elasticsearch, prefix: str) -> None:
    """Drop every index (memory, archive, state) and template of a prefix. Idempotent."""
    for index in [*all_indices(prefix), state_name(prefix)]:
        es.indices.delete(index=index, ignore_unavailable=True)
    if es.indices.exists_index_template(name=f"{prefix}-memory"):
        es.indices.delete_index_template(name=f"{prefix}-memory")
    if es.cluster.exists_component_template(name=f"{prefix}-common"):
        es.cluster.delete_component_template(name=f"{prefix}-common")


def build_sole_owner_filter(user_id: str) -> dict:
    """Documents whose `user_id` is `user_id` and nothing else.

    A range on a keyword field matches a document when any one of its values falls in the range, so
    the two ranges leave out a document that names another user beside this one (`["alice", "bob"]`):
    such a document is nobody's, not both users'. Writes refuse it (`validation.check_owner`); this
    keeps one that an operator planted from being read. No script needed (the cluster has none).
    """
    return {"bool": {"filter": [{"term": {"user_id": user_id}}],
                     "must_not": [{"range": {"user_id": {"lt": user_id}}}, {"range": {"user_id": {"gt": user_id}}}]}}


def build_owner_filter(prefix: str, user_id: str) -> dict:
    """The user's own documents, or the catalog's documents without an owner (its shared world data).

    One clause for both guards: the code filter of every recall and the DLS query of the user's key
    (a role is made per prefix, hence the prefix). Only the catalog index may hold ownerless documents:
    a memory without `user_id`, or with an empty list, is read by no user, whoever wrote it.
    """
    return {"bool": {"should": [
        build_sole_owner_filter(user_id),
        {"bool": {"filter": [{"term": {"_index": index_name(prefix, "catalog")}}],
                  "must_not": [{"exists": {"field": "user_id"}}]}},
    ], "minimum_should_match": 1}}


def searchable(prefix: str, *, types: Iterable[MemoryType] | None = None) -> list[str]:
    """Index names a recall over `types` searches (all four by default)."""
    return [index_name(prefix, t) for t in (types or MEMORY_TYPES)]
