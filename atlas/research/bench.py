"""Performance of Atlas on this machine, in one run so that ratios between the numbers hold.

`run()` measures write latency per refresh policy, recall latency per mode and corpus size
(split into query embedding, Elasticsearch, fusion and second stage), throughput under
concurrent clients, bulk ingest, embedding speed, index size and memory, then writes
`outputs/bench/bench-<quick|full>.json` and figures. Published numbers of other memory systems
sit beside ours for scale only: they were measured elsewhere, on other hardware and data.

The scale corpora cannot be embedded for real (100k texts with nomic would take about two hours), so
texts are built from templates over a small vocabulary, each from one head clause and one detail
clause. Only the clauses are embedded (once, cached by content and model); a memory's vector is
the normalised sum head + 0.6 * detail + Gaussian noise, in both models' spaces. Queries, single
writes and the "with embedding" ingest run the real models, uncached.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import resource
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, cast, get_args
from unittest.mock import patch

import numpy as np
from elasticsearch import Elasticsearch, helpers
from tqdm.auto import tqdm

from atlas import constants as C
from atlas.config import REPO_ROOT, Settings, load_settings
from atlas.core import documents
from atlas.core.clock import es_date
from atlas.core.documents import build_document, routing_of
from atlas.core.errors import ValidationError
from atlas.core.memory import bulk_load, write_episode
from atlas.core.recall import Tuning, pre_recall, recall
from atlas.core.schemas import MODEL_FIELDS, all_indices, check_prefix, drop_indices, index_name
from atlas.core.store import Embedder, Store
from atlas.models.embed import has_vnni, load_embedder
from atlas.models.rerank import EmbeddingSecondStage, load_second_stage
from atlas.reporting import Table, table
from atlas.research.metrics import percentiles
from atlas.security.connection import connect, server_version
from atlas.security.tenancy import forget_prefix
from atlas.security.tokens import TokenVerifier, issue_token
from atlas.stack import open_store

#: The fixed "now" of the synthetic corpus and of every recall.
BENCH_NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
PARTS = ("embed", "es", "fusion", "second")
#: Within those parts (`RecallResult.timings`): each path's search on the server (inside "es") and the check of
#: in-flight supersessions (inside "fusion").
DETAIL = ("took_bm25", "took_dense", "settle")
#: The steps of one write, in order (`documents._prepare`, then the index request with its refresh).
WRITE_PARTS = ("provision", "first model", "second model", "neighbours", "index")
REFRESH_POLICIES: tuple[C.Refresh, ...] = get_args(C.Refresh)

#: Published numbers of peer systems, quoted as issue 8 gives them; not measured here.
PEERS = {
    "zep": {"what": "retrieval latency", "p50_ms": 87.0, "p95_ms": 155.0, "source": "Zep, published (issue 8)"},
    "mem0": {"what": "search latency", "p95_ms": 200.0, "source": "Mem0, published (~0.2 s p95, issue 8)"},
    "reference_design": {"what": "write per user message", "max_ms": 100.0,
                         "source": "the reference design's claim (< 100 ms, issue 8)"},
}


@dataclass(frozen=True)
class Plan:
    """How much to measure: `QUICK` for CI, `FULL` for the published table."""

    name: str
    scales: tuple[int, ...]
    recall_reps: int
    warmup: int
    write_reps: int
    clients: tuple[int, ...]
    throughput_requests: int
    ingest_docs: int
    embed_texts: int
    #: Distinct head clauses per memory type (each embedded once by both models, then cached).
    clauses_per_type: int = 150
    #: Hits per recall.
    k: int = 10
    #: Token checks timed per cache setting (each a few microseconds).
    token_checks: int = 2_000


#: What the notebook runs when no saved results exist: one small corpus, seconds per part.
SMOKE = Plan("smoke", (1_000,), recall_reps=10, warmup=2, write_reps=5, clients=(1, 4, 16), throughput_requests=32,
             ingest_docs=32, embed_texts=32, clauses_per_type=40)
QUICK = Plan("quick", (1_000, 10_000), recall_reps=30, warmup=3, write_reps=20, clients=(1, 4, 16),
             throughput_requests=48, ingest_docs=128, embed_texts=128)
FULL = Plan("full", (1_000, 10_000, 100_000), recall_reps=150, warmup=5, write_reps=60, clients=(1, 4, 16),
            throughput_requests=160, ingest_docs=512, embed_texts=512)
#: The growth curve to a million memories : recall as in `FULL`, the rest as in `QUICK`.
MILLION = replace(FULL, name="million", scales=(10_000, 100_000, 1_000_000), write_reps=20, throughput_requests=48,
                  ingest_docs=128, embed_texts=128)
PLANS = {plan.name: plan for plan in (SMOKE, QUICK, FULL, MILLION)}
#: Where a run worth keeping is committed (`atlas bench --record`): `results/bench/bench-<plan>.json`.
RECORDED_DIR = REPO_ROOT / "results"
MAX_SCALE = 1_000_000


# --- the synthetic corpus ------------------------------------------------------------------------

NAMES = ("Sarah", "Tom", "Priya", "Marco", "Lena", "Omar", "Grace", "Kenji", "Ana", "Felix")
DEVICES = ("hub", "thermostat", "smart plug", "doorbell camera", "motion sensor", "light strip", "speaker",
           "smoke alarm", "robot vacuum", "door lock", "router", "blinds motor", "air purifier", "baby monitor")
ROOMS = ("kitchen", "hallway", "nursery", "garage", "living room", "bedroom", "office", "porch", "bathroom",
         "attic", "basement")
PROBLEMS = ("keeps disconnecting", "turns on by itself", "shows error E-0x41", "blinks red", "stopped responding",
            "drains its battery", "lags by a few seconds", "resets overnight", "is far too loud",
            "reports the wrong temperature")
SETTINGS_ = ("warm white light", "19 degrees", "quiet mode", "away mode", "half brightness", "eco mode", "night mode")
HEADS = {
    "episodic": ("My {device} in the {room} {problem}", "Can you set the {device} in the {room} to {setting}",
                 "The {device} {problem} again", "{name} says the {room} {device} {problem}",
                 "I moved the {device} to the {room}"),
    "semantic": ("{name} prefers {setting} in the {room}", "The {device} is installed in the {room}",
                 "{name} works from the {room} on weekdays", "{name} wants the {device} in {setting} at night"),
    "procedural": ("How to fix a {device} that {problem}",),
    "catalog": ("Lumio {device}: {setting} built in, pairs with the hub",),
}
DETAILS = ("at 3am", "every morning", "since the last update", "after the storm", "when the router restarts",
           "on weekends", "during video calls", "at sunset", "and the app shows nothing", "which started last week",
           "but only when it rains", "while we were away", "right after dinner", "for the third time today")
QUESTIONS = ("why does my {device} {problem}", "what does {name} prefer in the {room}", "where is the {device}",
             "how do I fix the {device} in the {room}", "{device} {problem}", "what is set for the {room} at night")
STEPS = ("Unplug it for ten seconds", "Hold the reset button", "Re-pair it from the app", "Update the firmware",
         "Move it closer to the hub")
TYPE_WEIGHTS: dict[C.MemoryType, float] = {"episodic": 0.6, "semantic": 0.3, "procedural": 0.05, "catalog": 0.05}


def _fill(template: str, rng: random.Random) -> str:
    return template.format(device=rng.choice(DEVICES), room=rng.choice(ROOMS), problem=rng.choice(PROBLEMS),
                           setting=rng.choice(SETTINGS_), name=rng.choice(NAMES))


def clause_pool(rng: random.Random, per_type: int = 150) -> dict[str, list[str]]:
    """Distinct head clauses per memory type, filled from the templates (the only texts embedded)."""
    pool: dict[str, list[str]] = {}
    for memory_type, templates in HEADS.items():
        seen: dict[str, None] = {}
        for _ in range(per_type * 20):
            seen[_fill(rng.choice(templates), rng)] = None
            if len(seen) == per_type:
                break
        pool[memory_type] = list(seen)
    return pool


def questions(rng: random.Random, count: int = 80) -> list[str]:
    return [_fill(rng.choice(QUESTIONS), rng) for _ in range(count)]


def users_for(scale: int) -> list[str]:
    """More users in bigger corpora, with Zipf-like activity (see `user_weights`)."""
    return [f"u{i:04d}" for i in range(max(10, scale // 250))]


def user_weights(users: Sequence[str]) -> list[float]:
    """Heavy users own (and query) far more than the median user: weight 1 / rank^0.8."""
    return [1.0 / (rank ** 0.8) for rank in range(1, len(users) + 1)]


@dataclass
class Corpus:
    """A scale's memories, with the clauses each was built from (the ingredients of its vectors)."""

    docs: list[dict]
    heads: list[int]
    details: list[int]
    users: list[str]


class ClauseVectors:
    """Clause vectors of both models, embedded once (cached on disk by content and model)."""

    def __init__(self, pool: dict[str, list[str]], models: dict[str, Embedder]) -> None:
        self.heads = [text for texts in pool.values() for text in texts]
        self.offsets = {}
        at = 0
        for memory_type, texts in pool.items():
            self.offsets[memory_type] = (at, at + len(texts))
            at += len(texts)
        self.vectors = {field: (model.embed_passages(self.heads), model.embed_passages(list(DETAILS)))
                        for field, model in models.items()}

    def compose(self, field: str, heads: Sequence[int], details: Sequence[int], rng: np.random.Generator) -> np.ndarray:
        head, detail = self.vectors[field]
        mixed = head[list(heads)] + 0.6 * detail[list(details)]
        mixed += rng.normal(0.0, 0.1 / np.sqrt(mixed.shape[1]), mixed.shape).astype(np.float32)
        return mixed / np.linalg.norm(mixed, axis=1, keepdims=True)


def synthetic_corpus(scale: int, clauses: ClauseVectors, rng: random.Random, now: datetime = BENCH_NOW) -> Corpus:
    """`scale` memories over Zipf-weighted users, dated over the two years before `now`."""
    users = users_for(scale)
    weights = user_weights(users)
    types = rng.choices(list(TYPE_WEIGHTS), list(TYPE_WEIGHTS.values()), k=scale)
    owners = rng.choices(users, weights, k=scale)
    docs, heads, details = [], [], []
    for memory_type, owner in zip(types, owners, strict=True):
        low, high = clauses.offsets[memory_type]
        head, detail = rng.randrange(low, high), rng.randrange(len(DETAILS))
        text = clauses.heads[head] if memory_type == "catalog" else f"{clauses.heads[head]} {DETAILS[detail]}"
        when = now - timedelta(days=rng.uniform(0, 730))
        fields = {"steps": rng.sample(STEPS, 3)} if memory_type == "procedural" else {}
        docs.append(build_document(None if memory_type == "catalog" else owner, text, memory_type, when, **fields))
        heads.append(head)
        details.append(detail)
    return Corpus(docs, heads, details, users)


def provision_users(store: Store, users: Sequence[str]) -> dict:
    """Each user's read key, made before loading: with tenancy, recalls read through it (seconds it took)."""
    provision = store.provision
    if provision is None:
        return {"users": 0, "seconds": 0.0}
    return {"users": len(users), "seconds": sum(timed(partial(provision, user)) for user in users)}


def load_corpus(store: Store, corpus: Corpus, clauses: ClauseVectors, seed: int, *, batch: int = 500,
                progress: bool = True) -> float:
    """Index the corpus with composed vectors through `_bulk`, two requests in flight (the client encodes one
    while Elasticsearch indexes the other: 886 memories/s against 499 with one, 10k memories on this 2-core
    machine); returns memories per second (no embedding)."""
    noise = np.random.default_rng(seed)
    fields = list(store.passage_embedders)

    def actions() -> Iterator[dict]:
        for start in range(0, len(corpus.docs), batch):
            chunk = slice(start, start + batch)
            vectors = {f: clauses.compose(f, corpus.heads[chunk], corpus.details[chunk], noise) for f in fields}
            for i, doc in enumerate(corpus.docs[chunk]):
                source = {**doc, **{MODEL_FIELDS[f]: store.passage_embedders[f].name for f in fields},
                          **{f: vectors[f][i].tolist() for f in fields}}
                yield {"_index": index_name(store.prefix, doc["memory_type"]), "routing": routing_of(doc),
                       "_source": source}

    started = time.perf_counter()
    with tqdm(total=len(corpus.docs), desc=f"loading {len(corpus.docs):,}", unit="doc", disable=not progress) as bar:
        for _ in helpers.parallel_bulk(store.es, actions(), thread_count=2, chunk_size=batch, refresh=False):
            bar.update(1)
    store.es.indices.refresh(index=store.indices)
    return len(corpus.docs) / (time.perf_counter() - started)


# --- measuring ------------------------------------------------------------------------------------


def latency_stats(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 (`atlas.research.metrics.percentiles`) and mean of durations in seconds, as milliseconds."""
    ms = [s * 1000 for s in samples_s]
    return {"n": len(ms), "mean_ms": float(np.mean(ms)),
            **{f"{name}_ms": value for name, value in percentiles(ms).items()}}


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def measure_recall(store: Store, corpus: Corpus, queries: Sequence[str], mode: C.RecallMode, reps: int, warmup: int,
                   rng: random.Random, now: datetime, k: int = 10, *, routed: bool = True) -> dict:
    """Latency of `reps` recalls (users drawn by activity), with the mean of each part of the time and the load
    average (1 min) before and after; `routed` as in `recall`."""
    load_before = os.getloadavg()[0]
    weights = user_weights(corpus.users)
    totals: list[float] = []
    parts: dict[str, list[float]] = {p: [] for p in (*PARTS, *DETAIL)}
    for i in range(warmup + reps):
        user, query = rng.choices(corpus.users, weights)[0], rng.choice(queries)
        started = time.perf_counter()
        result = recall(store.at(now), user, query, k=k, mode=mode, tuning=Tuning(routed=routed))
        if i >= warmup:
            totals.append(time.perf_counter() - started)
            for part in parts:
                parts[part].append(result.timings.get(part, 0.0))
    stats = latency_stats(totals)
    mean_ms = {p: float(np.mean(v)) * 1000 for p, v in parts.items()}
    parts_ms = {p: mean_ms[p] for p in PARTS}
    parts_ms["other"] = max(0.0, stats["mean_ms"] - sum(parts_ms.values()))
    return {**stats, "parts_ms": parts_ms, "detail_ms": {p: mean_ms[p] for p in DETAIL},
            "loadavg": [load_before, os.getloadavg()[0]]}


def settle_merges(es: Elasticsearch, prefix: str, *, poll_s: float = 5.0, limit_s: float = 3600.0) -> dict:
    """Wait until no merge runs on the prefix's indices, at most `limit_s` (a load leaves merges behind it, which slow
    the recalls timed next): the seconds waited, the load average then, and the last `_stats/merge` read."""
    started = time.perf_counter()
    while (merges := es.indices.stats(index=f"{prefix}-*", metric="merge")["_all"]["total"]["merges"])["current"]:
        if time.perf_counter() - started > limit_s:
            break
        time.sleep(poll_s)
    return {"waited_s": time.perf_counter() - started, "loadavg": os.getloadavg(), "still_merging": merges}


def measure_arms(corpus: Corpus, queries: Sequence[str], mode: C.RecallMode, arms: dict[str, tuple[Store, Tuning]],
                 reps: int, warmup: int, rng: random.Random, now: datetime, k: int = 10, *,
                 users: Sequence[str] | None = None) -> dict:
    """The same `reps` recalls (users drawn by activity, or from `users`) in each arm (a store holding `corpus` and a
    `Tuning`), the arms in turn for each, a different one first each time (the first of a recall pays for what the
    others find cached: the term statistics' search, pages): per arm the latency, the mean server time of each path's
    search, and the share of recalls whose top `k` is the first arm's."""
    weights = user_weights(corpus.users) if users is None else None
    totals: dict[str, list[float]] = {arm: [] for arm in arms}
    took: dict[str, dict[str, list[float]]] = {arm: {"took_bm25": [], "took_dense": []} for arm in arms}
    same = dict.fromkeys(arms, 0)
    for i in range(warmup + reps):
        user, query = rng.choices(users or corpus.users, weights)[0], rng.choice(queries)
        names = list(arms)
        top: dict[str, list[str]] = {}
        for arm in names[i % len(names):] + names[:i % len(names)]:
            store, tuning = arms[arm]
            started = time.perf_counter()
            result = recall(store.at(now), user, query, k=k, mode=mode, tuning=tuning)
            elapsed = time.perf_counter() - started
            top[arm] = result.ids()
            if i >= warmup:
                totals[arm].append(elapsed)
                for part, values in took[arm].items():
                    values.append(result.timings.get(part, 0.0))
        if i >= warmup:
            for arm in names:
                same[arm] += top[arm] == top[names[0]]
    return {arm: {**latency_stats(totals[arm]), "same_top_k": same[arm] / reps,
                  "took_ms": {part: float(np.mean(values)) * 1000 for part, values in took[arm].items()}}
            for arm in arms}


@contextlib.contextmanager
def timing_write_parts(store: Store) -> Iterator[dict[str, list[float]]]:
    """{step: [seconds, ...]} of each `WRITE_PARTS` step of the writes made inside, timed by wrapping, for the
    duration, the very objects a write calls (the store's provisioning, its two embedders, the neighbours' search
    with its hubness, the client's `index`): the writes take their usual path."""
    seconds: dict[str, list[float]] = {part: [] for part in WRITE_PARTS}

    def timing(part: str, call: Callable) -> Callable:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                seconds[part].append(time.perf_counter() - started)
        return timed_call

    models = zip(("first model", "second model"), store.passage_embedders.values(), strict=False)
    targets = [("provision", store, "provision"), *((part, model, "embed_passages") for part, model in models),
               ("neighbours", documents, "neighbour_hubness"), ("index", store.es, "index")]
    with contextlib.ExitStack() as stack:
        for part, owner, name in targets:
            if getattr(owner, name) is not None:
                stack.enter_context(patch.object(owner, name, timing(part, getattr(owner, name))))
        yield seconds


def measure_writes(store: Store, users: Sequence[str], reps: int, rng: random.Random, progress: bool = True) -> dict:
    """One `write_episode` (embedding + index) per call, under each refresh policy, with the mean of each of its
    steps (`timing_write_parts`); then, under the default policy, the turn: each write with the recall that follows
    it (`pre_recall` of the same message)."""
    out: dict = {}
    run_tag = uuid.uuid4().hex[:6]  # never in the embedding cache: every write embeds for real
    for policy in tqdm(REFRESH_POLICIES, desc="writes", disable=not progress):
        store.refresh = policy
        with timing_write_parts(store) as steps:
            samples = [timed(partial(_write_note, store, users, rng, f"{run_tag}-{policy}-{i}")) for i in range(reps)]
        out[policy] = latency_stats(samples) | {
            "parts_ms": {part: 1000 * sum(took) / reps for part, took in steps.items() if took}}
    store.refresh = C.WRITE_REFRESH
    out["true"]["turn"] = latency_stats(
        [timed(partial(_write_note, store, users, rng, f"{run_tag}-turn-{i}", recall=True)) for i in range(reps)])
    return out


def _write_note(store: Store, users: Sequence[str], rng: random.Random, tag: str, *, recall: bool = False) -> None:
    """One episode of a random user, made from the templates and marked with `tag`; with `recall`, the turn's
    `pre_recall` after it."""
    user, text = rng.choice(users), f"{_fill(rng.choice(HEADS['episodic']), rng)} (note {tag})"
    written = write_episode(store, user, text)
    if recall:
        pre_recall(store, user, text, written=written)


def measure_token_check(store: Store, users: Sequence[str], checks: int, rng: random.Random) -> dict | None:
    """What authenticating one MCP call costs: `TokenVerifier.verify` of a live token, with the verifier's
    cache (a revocation is honoured within `C.TOKEN_CACHE_SECONDS`) and with the token file read on every
    call (no cache). None without tenancy (no user keys, so no tokens)."""
    if store.provision is None:
        return None
    issued = [issue_token(store, user).secret for user in users]
    out: dict = {"tokens": len(issued), "revocation_bound_s": C.TOKEN_CACHE_SECONDS}
    for name, ttl in (("cached", C.TOKEN_CACHE_SECONDS), ("no cache", 0.0)):
        verifier = TokenVerifier(store.es, store.prefix, ttl=ttl)
        verifier.verify(issued[0])
        out[name] = latency_stats([timed(partial(verifier.verify, rng.choice(issued))) for _ in range(checks)])
    return out


def es_cpu_ms(es: Elasticsearch) -> float:
    """CPU milliseconds the cluster's node processes have used since they started (`_nodes/stats/process`)."""
    return float(sum(node["process"]["cpu"]["total_in_millis"]
                     for node in es.nodes.stats(metric="process")["nodes"].values()))


def python_cpu_s() -> float:
    """CPU seconds (user + system) of this process, every thread (the models' ONNX threads included)."""
    times = os.times()
    return times.user + times.system


def measure_throughput(store: Store, corpus: Corpus, queries: Sequence[str], clients: Sequence[int], requests: int,
                       rng: random.Random, now: datetime, k: int = 10, progress: bool = True) -> dict:
    """Recalls per second of the default mode with N concurrent clients (threads sharing one store), and where a
    recall's CPU goes under that load: this process's (the models, fusion, the client) and the cluster's, per
    recall, beside the mean wall time of each part of a recall (`RecallResult.timings`)."""
    out = {}
    weights = user_weights(corpus.users)
    for n in tqdm(clients, desc="throughput", disable=not progress):
        jobs = [(rng.choices(corpus.users, weights)[0], rng.choice(queries)) for _ in range(requests)]

        def one(job: tuple[str, str]) -> tuple[float, dict[str, float]]:
            started = time.perf_counter()
            result = recall(store.at(now), job[0], job[1], k=k)
            return time.perf_counter() - started, result.timings

        cpu_before, es_before, started = python_cpu_s(), es_cpu_ms(store.es), time.perf_counter()
        with ThreadPoolExecutor(max_workers=n) as pool:
            runs = list(pool.map(one, jobs))
        wall = time.perf_counter() - started
        cpu = {"python": (python_cpu_s() - cpu_before) * 1000 / requests,
               "elasticsearch": (es_cpu_ms(store.es) - es_before) / requests}
        parts = {p: float(np.mean([t.get(p, 0.0) for _, t in runs])) * 1000 for p in (*PARTS, "stats")}
        out[str(n)] = {"recalls_per_s": requests / wall, **latency_stats([s for s, _ in runs]),
                       "cpu_ms_per_recall": cpu, "parts_ms": parts}
    return out


def measure_embedding(specs: Sequence[str], texts: Sequence[str], queries: Sequence[str]) -> dict:
    """Passages per second in batches, and the latency of one query, per model (no cache)."""
    out = {}
    for spec in specs:
        model = load_embedder(spec)
        model.embed_queries([queries[0]])  # first call allocates
        seconds = timed(partial(_embed_passages, model, texts))
        single = [timed(partial(_embed_query, model, q)) for q in queries[:20]]
        out[model.name] = {"passages_per_s": len(texts) / seconds, "query": latency_stats(single)}
    return out


def _embed_passages(model: Embedder, texts: Sequence[str]) -> None:
    model.embed_passages(list(texts))


def _embed_query(model: Embedder, query: str) -> None:
    model.embed_queries([query])


@dataclass
class _Clocked:
    """An embedder that adds up the texts and seconds of its passage calls: one stage of a load."""

    inner: Embedder
    texts: int = 0
    seconds: float = 0.0
    name: str = field(init=False)
    dims: int = field(init=False)

    def __post_init__(self) -> None:
        self.name, self.dims = self.inner.name, self.inner.dims

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_queries(texts)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        started = time.perf_counter()
        vectors = self.inner.embed_passages(texts)
        self.seconds += time.perf_counter() - started
        self.texts += len(texts)
        return vectors


def measure_ingest_with_embedding(store: Store, rng: random.Random, count: int, now: datetime) -> dict:
    """`bulk_load` of fresh texts, embedded by both models: memories per second overall, and per model the
    texts per second and the share of the load's wall time it took (the rest is indexing that embedding
    did not hide, and Python). The texts are those `measure_embedding` times alone: head and detail clauses, no
    run tag (the store's models have no cache, and a tag's hex tokens slowed both models by a third)."""
    docs = [build_document(f"u{i % 10:04d}", f"{_fill(rng.choice(HEADS['episodic']), rng)} {rng.choice(DETAILS)}",
                           "episodic", now) for i in range(count)]
    first = _Clocked(store.embedder)
    second = (_Clocked(store.second_stage.embedder) if isinstance(store.second_stage, EmbeddingSecondStage)
              else None)
    clocked = replace(store, embedder=first,
                      second_stage=EmbeddingSecondStage(second) if second is not None else store.second_stage)
    seconds = timed(lambda: bulk_load(clocked, docs, progress=False))
    return {"docs": count, "per_s": count / seconds, "seconds": seconds,
            "stages": {m.name: {"texts_per_s": m.texts / m.seconds, "share": m.seconds / seconds}
                       for m in (first, second) if m is not None and m.texts}}


def index_size(es: Elasticsearch, prefix: str) -> dict:
    """Bytes on disk of the prefix's primary segments (after a flush; not force-merged), of every copy
    (primaries and replicas), and of the vector files (`vector_files`, `knn_memory`).

    Summed from `_cat/segments`, because `_stats`' store size is cached for
    `index.store.stats_refresh_interval` (10 s) and read an index loaded faster than that as empty.
    """
    indices = ",".join(all_indices(prefix))
    es.indices.flush(index=indices)
    docs = es.count(index=indices)["count"]  # memories: `_stats` would also count nested sentence vectors
    # With format=json the body is a list of rows, which the client's annotation (object or text) leaves out.
    segments = cast(list[dict[str, Any]], es.cat.segments(index=indices, format="json", bytes="b").body)
    size = sum(int(segment["size"]) for segment in segments if segment["prirep"] == "p")
    files = vector_files(es, prefix)
    return {"docs": docs, "bytes": size, "bytes_per_1k": size / max(docs, 1) * 1000,
            "bytes_all_copies": sum(int(segment["size"]) for segment in segments), "vector_files": files,
            "knn_bytes": knn_memory(files)}


def vector_files(es: Elasticsearch, prefix: str) -> dict[str, int]:
    """Bytes of each vector file kind over the prefix's primaries (`_stats/dense_vector`, `off_heap`: the HNSW
    graph `vex`, raw floats `vec`, int8 `veq`, bbq `veb`), and how many vectors (nested ones included)."""
    stats = es.indices.stats(index=",".join(all_indices(prefix)), metric="dense_vector")["_all"]["primaries"]
    vectors = stats["dense_vector"]
    return {"vectors": vectors["value_count"]} | {
        key.removeprefix("total_").removesuffix("_size_bytes"): value
        for key, value in vectors.get("off_heap", {}).items() if key.startswith("total_") and key != "total_size_bytes"}


def knn_memory(files: dict[str, int]) -> int:
    """Bytes a kNN search wants in the page cache: the graph and the vectors it scores, the quantized ones where
    the field has them (`veb` for `bbq_hnsw`, `veq` for `int8_hnsw`), else the floats (`vec`, plain `hnsw`).
    `bbq_hnsw`'s rescoring also reads the floats of a few candidates per search, from disk or the page cache."""
    return files.get("vex", 0) + (files.get("veb") or files.get("veq") or files.get("vec", 0))


def proc_memory(pid: int | str) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process in bytes, from /proc (empty where unreadable)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM") if k in fields}


def memory_use(es: Elasticsearch) -> dict:
    """RSS of this Python process, and heap and RSS of each Elasticsearch node (`_nodes/stats/jvm,process`)."""
    me = proc_memory("self")
    out: dict = {"python_rss_mb": me.get("VmRSS", 0) / 2**20, "python_peak_rss_mb": me.get("VmHWM", 0) / 2**20,
                 "python_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "es": {}}
    stats = es.nodes.stats(metric="jvm,process")["nodes"]
    pids = {node_id: info.get("process", {}).get("id") for node_id, info in
            es.nodes.info(node_id="_all", metric="process")["nodes"].items()}
    for node_id, node in stats.items():
        heap = node["jvm"]["mem"]
        rss = proc_memory(pids[node_id]).get("VmRSS") if pids.get(node_id) else None
        out["es"][node.get("name", node_id)] = {
            "heap_used_mb": heap["heap_used_in_bytes"] / 2**20, "heap_max_mb": heap["heap_max_in_bytes"] / 2**20,
            "non_heap_used_mb": heap["non_heap_used_in_bytes"] / 2**20,
            "virtual_mb": node["process"]["mem"]["total_virtual_in_bytes"] / 2**20,
            "rss_mb": rss / 2**20 if rss else None}
    return out


def machine_info() -> dict:
    """The processor (its name, and whether it has VNNI, with which the int8 model runs its fast kernel:
    `needs_exact_int8`), cores, memory, OS and Python of this machine."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
               platform.processor())
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "vnni": has_vnni(cpuinfo), "cores": os.cpu_count(),
            "ram_gib": round(ram, 1), "os": platform.platform(), "python": platform.python_version(),
            "loadavg_start": os.getloadavg()}


def machine(es: Elasticsearch) -> dict:
    """`machine_info` and the cluster's version."""
    return machine_info() | {"elasticsearch": server_version(es)}


# --- the run -------------------------------------------------------------------------------------


def label(scale: int) -> str:
    return f"{scale // 1000}k" if scale % 1000 == 0 else str(scale)


def check_scales(scales: Sequence[int]) -> tuple[int, ...]:
    scales = tuple(scales)
    if not scales or any(isinstance(s, bool) or not isinstance(s, int) or not 100 <= s <= MAX_SCALE for s in scales):
        raise ValidationError(f"scales must be whole numbers from 100 to {MAX_SCALE:,}, not {list(scales)!r}")
    return tuple(sorted(set(scales)))


def bench_store(prefix: str, settings: Settings, es: Elasticsearch, *, fresh: bool = True) -> Store:
    """A store on a fresh prefix whose models embed every query and write for real (no cache).

    The indices and read keys an interrupted run left are dropped, so that key creation is measured; `fresh=False`
    keeps them (a corpus loaded by an earlier run, measured again).
    """
    if fresh:
        drop_indices(es, prefix)
    store = open_store(prefix, settings=settings, es=es, embedder=load_embedder(settings.embedder),
                       second_stage=load_second_stage(settings.reranker), now=lambda: BENCH_NOW)
    if fresh:
        forget_prefix(store)
    return store


def run(*, quick: bool = False, plan: Plan | None = None, scales: Sequence[int] | None = None, prefix: str = "bench",
        seed: int = 7, now: datetime = BENCH_NOW, settings: Settings | None = None, out_dir: str | Path | None = None,
        progress: bool = True) -> dict:
    """Run the benchmark, write `<out_dir>/bench/bench-<plan>.json` and figures, return the results.

    Each scale gets its own prefix `<prefix>-<scale>`, dropped before and after (with its users' keys).
    """
    plan = plan or (QUICK if quick else FULL)
    if scales is not None:
        plan = replace(plan, scales=check_scales(scales))
    prefixes = {scale: check_prefix(f"{prefix}-{label(scale)}") for scale in plan.scales}
    settings = settings or load_settings()
    es = connect(settings)
    rng = random.Random(seed)
    started = time.perf_counter()
    results: dict = {"meta": {"plan": asdict(plan), "seed": seed, "now": es_date(now), "machine": machine(es),
                              "embedder": settings.embedder, "reranker": settings.reranker,
                              "corpus": "templates + composed clause vectors (see atlas.research.bench)"},
                     "peers": PEERS, "corpus": {}, "user_keys": {}, "recall": {}, "index_size": {},
                     "ingest": {"without_embedding": {}}, "memory": {"start": memory_use(es)}}
    pool, asked = clause_pool(rng, plan.clauses_per_type), questions(rng)
    clauses: ClauseVectors | None = None
    opened: list[Store] = []
    try:
        for scale in tqdm(plan.scales, desc="scales", disable=not progress):
            store = bench_store(prefixes[scale], settings, es)
            opened.append(store)
            results["meta"]["reads"] = "per-user DLS keys" if store.reader is not None else "service credential"
            specs = vector_specs(store, settings)
            clauses = clauses or ClauseVectors(pool, {field: load_embedder(spec, cache_dir=settings.embedding_cache_dir,
                                                                           progress=None if progress else False)
                                                      for field, spec in specs.items()})
            _bench_scale(results, plan, store, synthetic_corpus(scale, clauses, rng, now), clauses, asked, rng, now,
                         seed, progress)
            opened.pop().drop()
        texts = [f"{pool['episodic'][i % len(pool['episodic'])]} {DETAILS[i % len(DETAILS)]}"
                 for i in range(plan.embed_texts)]
        results["embedding"] = measure_embedding(list(specs.values()), texts, asked)
    finally:
        for store in opened:
            store.drop()
    results["meta"]["duration_s"] = time.perf_counter() - started
    results["meta"]["machine"]["loadavg_end"] = os.getloadavg()
    save_results(results, Path(out_dir) if out_dir is not None else settings.outputs_dir)
    return results


def _bench_scale(results: dict, plan: Plan, store: Store, corpus: Corpus, clauses: ClauseVectors,
                 asked: Sequence[str], rng: random.Random, now: datetime, seed: int, progress: bool) -> None:
    """Everything measured on one corpus; writes, ingest and throughput only at the scales that carry them."""
    scale, key = len(corpus.docs), str(len(corpus.docs))
    owned = Counter(doc["user_id"] for doc in corpus.docs if "user_id" in doc)
    results["corpus"][key] = {"users": len(corpus.users), "per_user_median": float(np.median(list(owned.values()))),
                              "per_user_max": max(owned.values()),
                              "types": dict(Counter(d["memory_type"] for d in corpus.docs))}
    results["user_keys"][key] = provision_users(store, corpus.users)
    results["ingest"]["without_embedding"][key] = load_corpus(store, corpus, clauses, seed, progress=progress)
    results.setdefault("merges", {})[key] = settle_merges(store.es, store.prefix)
    results["index_size"][key] = index_size(store.es, store.prefix)
    results["recall"][key] = {mode: measure_recall(store, corpus, asked, mode, plan.recall_reps, plan.warmup, rng, now,
                                                   plan.k)
                              for mode in tqdm(C.RECALL_MODES, desc=f"recall {label(scale)}", disable=not progress)}
    if scale == plan.scales[0]:
        results["write"] = measure_writes(store, corpus.users, plan.write_reps, rng, progress)
        results["token_check"] = measure_token_check(store, corpus.users, plan.token_checks, rng)
        results["ingest"]["with_embedding"] = measure_ingest_with_embedding(store, rng, plan.ingest_docs, now)
    if scale == min(plan.scales, key=lambda s: abs(s - 10_000)):
        results["throughput"] = {"scale": scale, "mode": C.DEFAULT_RECALL_MODE, "clients": measure_throughput(
            store, corpus, asked, plan.clients, plan.throughput_requests, rng, now, plan.k, progress)}
    results["memory"][key] = memory_use(store.es)


def vector_specs(store: Store, settings: Settings) -> dict[str, str]:
    """{vector field: embedder spec} of each vector the store writes, to embed the clauses with."""
    specs = {"embedding": settings.embedder}
    if "rerank_embedding" in store.passage_embedders:
        specs["rerank_embedding"] = settings.reranker.removeprefix("embed:")
    return specs


# --- results: JSON, tables, figures ---------------------------------------------------------------


def results_path(out_dir: str | Path, plan_name: str) -> Path:
    return Path(out_dir) / "bench" / f"bench-{plan_name}.json"


def save_results(results: dict, out_dir: str | Path) -> Path:
    """The JSON under `<out_dir>/bench/`, and the figures under `<out_dir>/figures/`."""
    from atlas.notebook.plots import bench_ingest, bench_latency, bench_time_split, bench_writes_throughput

    path = write_json(results, out_dir)
    for figure in (bench_latency, bench_time_split, bench_writes_throughput, bench_ingest):
        figure(results, out_dir=out_dir)
    return path


def write_json(results: dict, out_dir: str | Path) -> Path:
    """`<out_dir>/bench/bench-<plan>.json`; with `RECORDED_DIR`, the run a fresh clone's notebook 13 shows."""
    path = results_path(out_dir, results["meta"]["plan"]["name"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path


def load_results(out_dir: str | Path, *, plans: Sequence[str] = ("full", "quick", "smoke")) -> dict | None:
    """The first of `plans` saved under `out_dir`, or None when there is none (the million run is asked for by
    name: notebook 13 shows it beside its own run)."""
    for name in plans:
        if (path := results_path(out_dir, name)).is_file():
            return json.loads(path.read_text())
    return None


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def tables(results: dict) -> list[Table]:
    """Every number of a run as tables (the notebook shows them, `render_markdown` prints them)."""
    recall_rows = [{"memories": f"{int(scale):,}", "mode": mode, "p50": _ms(r["p50_ms"]), "p95": _ms(r["p95_ms"]),
                    "p99": _ms(r["p99_ms"]), **{part: _ms(ms) for part, ms in r["parts_ms"].items()},
                    **({"load average": "{:.1f} to {:.1f}".format(*r["loadavg"])} if "loadavg" in r else {})}
                   for scale, modes in results["recall"].items() for mode, r in modes.items()]
    out = [table([{"memories": f"{int(s):,}", "users": c["users"], "median per user": f"{c['per_user_median']:.0f}",
                   "most per user": c["per_user_max"], **c["types"]} for s, c in results["corpus"].items()],
                 title="Synthetic corpora", numeric=("users", "median per user", "most per user")),
           table(recall_rows, title="Recall latency (ms; parts are means: query embedding, Elasticsearch, fusion, "
                                    "second stage, other; then the load average before and after)",
                 numeric=("p50", "p95", "p99", *PARTS, "other"))]
    detail_rows = [{"memories": f"{int(scale):,}", "mode": mode,
                    **{part: _ms(ms) for part, ms in r["detail_ms"].items()}}
                   for scale, modes in results["recall"].items() for mode, r in modes.items() if "detail_ms" in r]
    if detail_rows:
        out.append(table(detail_rows, title="Inside the parts (ms, means): each path's search on the server (took), "
                                            "the supersession check (in fusion)", numeric=DETAIL))
    if "write" in results:
        rows = [{"refresh": policy, "p50": _ms(w["p50_ms"]), "p95": _ms(w["p95_ms"]), "n": w["n"],
                 **{part: _ms(ms) for part, ms in w.get("parts_ms", {}).items()}}
                for policy, w in results["write"].items()]
        turn = results["write"]["true"].get("turn")
        if turn:
            rows.append({"refresh": "true, with the turn's pre_recall", "p50": _ms(turn["p50_ms"]),
                         "p95": _ms(turn["p95_ms"]), "n": turn["n"]})
        out.append(table(rows, title="Write one episode: embedding (both models) + index (ms; then the mean of each "
                                     f"step{'; last, the turn: the write and its recall' if turn else ''})",
                         numeric=("p50", "p95", "n", *WRITE_PARTS)))
    if results.get("token_check"):
        t = results["token_check"]
        out.append(table([{"token file": f"{name} (revocations honoured within {t['revocation_bound_s']:g} s)"
                           if name == "cached" else "read on every call", "p50": f"{t[name]['p50_ms']:.3f}",
                           "p95": f"{t[name]['p95_ms']:.3f}", "p99": f"{t[name]['p99_ms']:.3f}", "n": t[name]["n"]}
                          for name in ("cached", "no cache")],
                         title=f"Token check per MCP call, {t['tokens']} live tokens (ms)",
                         numeric=("p50", "p95", "p99", "n")))
    if "throughput" in results:
        t = results["throughput"]
        cpu_parts = ("python CPU", "es CPU", "embed", "stats", "es", "second")
        out.append(table([{"clients": n, "recalls/s": f"{c['recalls_per_s']:.1f}", "p50": _ms(c["p50_ms"]),
                           "p95": _ms(c["p95_ms"]),
                           **({"python CPU": _ms(c["cpu_ms_per_recall"]["python"]),
                               "es CPU": _ms(c["cpu_ms_per_recall"]["elasticsearch"]),
                               **{p: _ms(c["parts_ms"][p]) for p in cpu_parts[2:]}} if "parts_ms" in c else {})}
                          for n, c in t["clients"].items()],
                         title=f"Throughput: {t['mode']} at {int(t['scale']):,} memories (ms; CPU per recall, "
                               "then the mean wall time of its parts)",
                         numeric=("clients", "recalls/s", "p50", "p95", *cpu_parts)))
    ingest = results["ingest"]
    rows = [{"ingest": f"bulk, vectors precomputed, {int(s):,} memories", "memories/s": f"{rate:,.0f}",
             "minutes": f"{int(s) / rate / 60:.1f}"} for s, rate in ingest["without_embedding"].items()]
    if "with_embedding" in ingest:
        loaded = ingest["with_embedding"]
        rows.append({"ingest": f"bulk_load with embedding (both models), {loaded['docs']} memories",
                     "memories/s": f"{loaded['per_s']:,.1f}"})
        rows += [{"ingest": f"  of which embedding, {name}: {stage['share']:.0%} of the time",
                  "texts/s": f"{stage['texts_per_s']:,.1f}"} for name, stage in loaded.get("stages", {}).items()]
    rows += [{"ingest": f"read keys of {k['users']} users (tenancy, once per user)", "memories/s": "",
              "ms per user": f"{k['seconds'] / k['users'] * 1000:.0f}"}
             for k in results.get("user_keys", {}).values() if k["users"]]
    out.append(table(rows, title="Bulk ingest", numeric=("memories/s", "minutes", "texts/s", "ms per user")))
    if "embedding" in results:
        out.append(table([{"model": name, "passages/s": f"{e['passages_per_s']:.1f}",
                           "one query p50 (ms)": _ms(e["query"]["p50_ms"])}
                          for name, e in results["embedding"].items()],
                         title="Embedding (CPU, no cache)", numeric=("passages/s", "one query p50 (ms)")))
    out.append(table([{"memories": f"{int(s):,}", "docs": z["docs"], "MB": f"{z['bytes'] / 2**20:.1f}",
                       "MB per 1k memories": f"{z['bytes_per_1k'] / 2**20:.2f}",
                       "kNN memory B/memory": f"{z['knn_bytes'] / z['docs']:.0f}" if "knn_bytes" in z else ""}
                      for s, z in results["index_size"].items()],
                     title="Index size on disk (primaries, after flush) and what kNN wants in the page cache",
                     numeric=("docs", "MB", "MB per 1k memories", "kNN memory B/memory")))
    out.append(table([{"after": "start" if stage == "start" else f"{int(stage):,} memories",
                       "python RSS (MB)": f"{m['python_rss_mb']:.0f}",
                       **{f"{node} heap used/max (MB)": f"{e['heap_used_mb']:.0f}/{e['heap_max_mb']:.0f}"
                          for node, e in m["es"].items()},
                       **{f"{node} RSS (MB)": "" if e["rss_mb"] is None else f"{e['rss_mb']:.0f}"
                          for node, e in m["es"].items()}}
                      for stage, m in results["memory"].items()], title="Memory"))
    return out


def peers_table(results: dict) -> Table:
    """Our recall and write latency beside the published numbers of peers."""
    rows = [{"system": f"Atlas {mode}, {int(scale):,} memories", "what": "recall", "p50": _ms(r["p50_ms"]),
             "p95": _ms(r["p95_ms"])}
            for scale, modes in results["recall"].items() for mode, r in modes.items() if mode == C.DEFAULT_RECALL_MODE]
    if "write" in results:
        rows.append({"system": "Atlas write_episode, refresh=true", "what": "write per user message",
                     "p50": _ms(results["write"]["true"]["p50_ms"]), "p95": _ms(results["write"]["true"]["p95_ms"])})
    rows += [{"system": name, "what": p["what"], "p50": _ms(p.get("p50_ms")),
              "p95": _ms(p.get("p95_ms")) or (f"< {p['max_ms']:.0f}" if "max_ms" in p else "")}
             for name, p in results["peers"].items()]
    return table(rows, title="Beside published peers (ms; theirs were measured elsewhere)", numeric=("p50", "p95"))


def render_markdown(results: dict) -> str:
    """The results section of docs/benchmarks.md, generated from a run's JSON."""
    meta = results["meta"]
    m = meta["machine"]
    vnni = {True: ", VNNI", False: ", no VNNI"}.get(m.get("vnni"), "")  # runs before 2026-12-07 did not say
    head = (f"Plan `{meta['plan']['name']}`, {meta['duration_s'] / 60:.1f} min on {m['cores']} cores "
            f"({m['cpu']}{vnni}), {m['ram_gib']} GiB RAM, Elasticsearch {m['elasticsearch']}, Python {m['python']}; "
            f"load average {m['loadavg_start'][0]:.1f} at start, {m.get('loadavg_end', [0])[0]:.1f} at end; "
            f"reads through {meta.get('reads', 'the service credential')}.")
    return "\n\n".join([head, *(t.to_markdown() for t in [*tables(results), peers_table(results)])])
