"""Three local nodes beside one, in one run (`atlas bench-nodes`), and hot shards on three (`--study shards`).

The same synthetic corpus (`atlas.research.bench`) is loaded into each cluster in turn: recall p50/p95 per
mode with routing (`routing=user_id`, one shard per index) and without (every shard), write latency (with
one replica on the cluster), bulk ingest, and the per-memory disk, heap and vector figures that
docs/scaling.md sizes nodes with. Both clusters run on this one machine and share its cores with the
models and with each other's idle nodes: only the ratios (cluster / single node) mean something.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from elasticsearch import Elasticsearch

from atlas import constants as C
from atlas.config import Settings, load_settings
from atlas.core.clock import es_date
from atlas.core.recall import DEFAULT_TUNING
from atlas.core.schemas import all_indices, index_name
from atlas.core.store import Store
from atlas.models.embed import load_embedder
from atlas.reporting import Table, table
from atlas.research.bench import (
    BENCH_NOW,
    ClauseVectors,
    Corpus,
    bench_store,
    clause_pool,
    index_size,
    load_corpus,
    machine,
    measure_arms,
    measure_recall,
    measure_writes,
    memory_use,
    provision_users,
    questions,
    settle_merges,
    synthetic_corpus,
    vector_specs,
    write_json,
)
from atlas.research.results import load_expected, lookup
from atlas.security.connection import connect


@dataclass(frozen=True)
class NodesPlan:
    """How much to measure on each cluster."""

    name: str
    scale: int
    recall_reps: int
    warmup: int
    write_reps: int
    clauses_per_type: int = 150
    k: int = 10


#: The published comparison: 100k memories.
NODES = NodesPlan("nodes", 100_000, recall_reps=40, warmup=3, write_reps=20)
#: A small run for a notebook or a smoke test.
NODES_SMOKE = NodesPlan("nodes-smoke", 2_000, recall_reps=8, warmup=2, write_reps=4, clauses_per_type=40)


def _corpus(settings: Settings, store: Store, plan: NodesPlan, rng: random.Random,
            progress: bool) -> tuple[ClauseVectors, Corpus, list[str]]:
    """The plan's synthetic corpus, the clause vectors it is built from, and the questions it is asked."""
    pool, asked = clause_pool(rng, plan.clauses_per_type), questions(rng)
    clauses = ClauseVectors(pool, {field: load_embedder(spec, cache_dir=settings.embedding_cache_dir,
                                                        progress=None if progress else False)
                                   for field, spec in vector_specs(store, settings).items()})
    return clauses, synthetic_corpus(plan.scale, clauses, rng, BENCH_NOW), asked


def measure_cluster(settings: Settings, plan: NodesPlan, *, prefix: str, seed: int, progress: bool) -> dict:
    """Everything measured on one cluster, on a fresh prefix dropped afterwards."""
    es = connect(settings)
    store = bench_store(prefix, settings, es)
    rng = random.Random(seed)
    clauses, corpus, asked = _corpus(settings, store, plan, rng, progress)
    try:
        out: dict = {"nodes": settings.es_nodes, "shards": settings.shards, "replicas": settings.replicas,
                     "machine": machine(es), "user_keys": provision_users(store, corpus.users),
                     "ingest_per_s": load_corpus(store, corpus, clauses, seed, progress=progress)}
        out["index_size"] = index_size(es, store.prefix)
        out["recall"] = {f"{mode}{'' if routed else ', every shard'}": measure_recall(
            store, corpus, asked, mode, plan.recall_reps, plan.warmup, rng, BENCH_NOW, plan.k, routed=routed)
            for mode in C.RECALL_MODES for routed in (True, False)}
        out["write"] = measure_writes(store, corpus.users, plan.write_reps, rng, progress)
        out["memory"] = memory_use(es)
        return out
    finally:
        store.drop()


def run_nodes(*, nodes: int = 3, plan: NodesPlan = NODES, baseline: Settings | None = None, prefix: str = "bnodes",
              seed: int = 7, out_dir: str | Path | None = None, progress: bool = True) -> dict:
    """Measure the single node (`baseline`, the local one by default), then the local `nodes`-node cluster;
    write `<out_dir>/bench/bench-<plan>.json` and return the results."""
    single = baseline or load_settings(es_nodes=1)
    cluster = load_settings(es_nodes=nodes)
    started = time.perf_counter()
    results = {"meta": {"plan": asdict(plan), "seed": seed, "now": es_date(BENCH_NOW),
                        "recorded": datetime.now(UTC).date().isoformat(),
                        "corpus": "templates + composed clause vectors (see atlas.research.bench)"},
               "clusters": {}}
    for name, settings in (("1 node", single), (f"{nodes} nodes", cluster)):
        results["clusters"][name] = measure_cluster(settings, plan, prefix=prefix, seed=seed, progress=progress)
    results["meta"]["duration_s"] = time.perf_counter() - started
    write_json(results, out_dir if out_dir is not None else cluster.outputs_dir)
    return results


# --- hot shards ---------------------------------------------------------------------------------

#: Hot shards (issue 37): one corpus on the local N-node cluster, each user on one shard of each user index, then
#: spread over two (`Settings.routing_partition`, docs/scaling.md).
SHARDS = NodesPlan("shards", 100_000, recall_reps=60, warmup=3, write_reps=0)
SHARDS_SMOKE = NodesPlan("shards-smoke", 2_000, recall_reps=8, warmup=2, write_reps=0, clauses_per_type=40)
PARTITIONS = (1, 2)


def primary_docs(es: Elasticsearch, index: str) -> list[int]:
    """Documents in each primary shard of `index`, by shard number."""
    shards = es.indices.stats(index=index, level="shards")["indices"][index]["shards"]
    return [next(c["docs"]["count"] for c in shards[str(n)] if c["routing"]["primary"]) for n in range(len(shards))]


def load_partition(store: Store, settings: Settings, corpus: Corpus, clauses: ClauseVectors, *, seed: int,
                   progress: bool) -> dict:
    """`corpus` into `store` (of `settings.routing_partition` shards per user), merges settled; then where the
    documents sit: per user index, documents per primary shard, the heaviest user's (the Zipf head, `user_weights`)
    per shard, and the shards a recall routed by that user asks."""
    es = store.es
    heaviest = corpus.users[0]
    out: dict = {"partition": settings.routing_partition, "shards": settings.shards,
                 "user_keys": provision_users(store, corpus.users),
                 "ingest_per_s": load_corpus(store, corpus, clauses, seed, progress=progress),
                 "merges": settle_merges(es, store.prefix)}
    es.indices.refresh(index=store.indices)
    indices = {t: index_name(store.prefix, t) for t in C.USER_MEMORY_TYPES}
    out["docs_per_shard"] = {t: primary_docs(es, index) for t, index in indices.items()}
    out["heaviest"] = {"user": heaviest, "docs_per_shard": {t: [
        es.count(index=index, preference=f"_shards:{n}", query={"term": {"user_id": heaviest}})["count"]
        for n in range(settings.shards)] for t, index in indices.items()}}
    read = ",".join(all_indices(store.prefix, archive=False))  # what a recall reads
    out["shards_per_recall"] = len(es.search_shards(index=read, routing=heaviest)["shards"])
    return out


def run_shards(*, nodes: int = 3, plan: NodesPlan = SHARDS, prefix: str = "bshards", seed: int = 7,
               out_dir: str | Path | None = None, progress: bool = True) -> dict:
    """The same corpus on the local `nodes`-node cluster once per partition size of `PARTITIONS` (`load_partition`),
    then the default mode's recalls for the heaviest user and for users drawn by activity, asked of every prefix in
    turn (`measure_arms`: none gains from going second); writes `<out_dir>/bench/bench-<plan>.json`."""
    cluster = load_settings(es_nodes=nodes)
    started = time.perf_counter()
    rng = random.Random(seed)
    stores: dict[str, Store] = {}
    results: dict = {"meta": {"plan": asdict(plan), "seed": seed, "now": es_date(BENCH_NOW), "nodes": nodes,
                              "recorded": datetime.now(UTC).date().isoformat(),
                              "corpus": "templates + composed clause vectors (see atlas.research.bench)"},
                     "partitions": {}}
    try:
        for partition in PARTITIONS:
            settings = replace(cluster, routing_partition=partition)
            store = stores[str(partition)] = bench_store(f"{prefix}-p{partition}", settings, connect(settings))
            if partition == PARTITIONS[0]:  # one corpus for every partition size
                clauses, corpus, asked = _corpus(settings, store, plan, rng, progress)
            results["partitions"][str(partition)] = load_partition(store, settings, corpus, clauses, seed=seed,
                                                                   progress=progress)
        results["meta"]["machine"] = machine(connect(cluster))
        arms = {name: (store, DEFAULT_TUNING) for name, store in stores.items()}
        for name, users in (("heaviest user", [corpus.users[0]]), ("users by activity", None)):
            timed = measure_arms(corpus, asked, C.DEFAULT_RECALL_MODE, arms, plan.recall_reps, plan.warmup, rng,
                                 BENCH_NOW, plan.k, users=users)
            for partition, measured in timed.items():
                results["partitions"][partition].setdefault("recall", {})[name] = measured
    finally:
        for store in stores.values():
            store.drop()
    results["meta"]["duration_s"] = time.perf_counter() - started
    write_json(results, out_dir if out_dir is not None else cluster.outputs_dir)
    return results


def shards_table(results: dict) -> Table:
    """One row per partition size: how the documents spread over the shards, and what the heaviest user pays."""
    rows = []
    for partition, run in results["partitions"].items():
        episodic, heavy = run["docs_per_shard"]["episodic"], run["heaviest"]["docs_per_shard"]["episodic"]
        total = sum(sum(docs) for docs in run["docs_per_shard"].values())
        theirs = sum(sum(docs) for docs in run["heaviest"]["docs_per_shard"].values())
        largest = max(max(docs) / (sum(docs) / len(docs)) for docs in run["docs_per_shard"].values())
        rows.append({"shards per user": partition, "episodic documents per shard": " / ".join(map(str, episodic)),
                     "largest shard / mean": f"{largest:.2f}",
                     "heaviest user's share": f"{theirs / total:.1%}",
                     "its episodic shards": " / ".join(map(str, heavy)),
                     "shards a recall asks": run["shards_per_recall"],
                     **{f"{name} p50 / p95 (ms)": f"{r['p50_ms']:.0f} / {r['p95_ms']:.0f}"
                        for name, r in run["recall"].items()}})
    return table(rows, title=f"Hot shards: {results['meta']['plan']['scale']:,} memories on "
                             f"{results['meta']['nodes']} nodes, default mode", numeric=("largest shard / mean",))


def render_shards_markdown(results: dict) -> str:
    """docs/scaling.md's hot-shard block, from a `run_shards` result: the command, then `shards_table`."""
    meta = results["meta"]
    head = (f"Reproduce with `atlas bench-nodes --study shards --scale {meta['plan']['scale']}` (recorded "
            f"{meta['recorded']}, {meta['duration_s'] / 60:.0f} min; {meta['plan']['recall_reps']} recalls per row "
            f"and column, the partitions asked in turn; load average {meta['machine']['loadavg_start'][0]:.1f} when "
            "the recalls began).")
    return f"{head}\n\n{shards_table(results).to_markdown()}"


def per_memory(result: dict) -> dict[str, float]:
    """Per-memory figures of one cluster: disk of one copy and of all copies, and heap used after the load."""
    size, docs = result["index_size"], result["index_size"]["docs"]
    heap = sum(node["heap_used_mb"] for node in result["memory"]["es"].values()) * 2**20
    return {"disk_bytes": size["bytes"] / docs, "disk_bytes_all_copies": size["bytes_all_copies"] / docs,
            "heap_bytes": heap / docs}


def vector_bytes(dims: int, index: C.VectorIndex = C.VECTOR_INDEX) -> float:
    """Page-cache bytes one vector of `dims` dimensions needs for kNN search, by Elasticsearch's sizing rules:
    the vectors a search scores (floats 4 x dims, int8 dims + 4, bbq dims / 8 + 14) and the HNSW graph
    (4 x m). `bbq_hnsw` also keeps the floats on disk, read for the few candidates it re-scores."""
    scored = {"hnsw": 4 * dims, "int8_hnsw": dims + 4, "bbq_hnsw": dims / 8 + 14}[index]
    return scored + 4 * C.HNSW_M


def ratios(results: dict) -> dict[str, float]:
    """Cluster / single node, per recall variant (p50 and p95), write (refresh=true) and ingest."""
    single, many = results["clusters"].values()
    out = {f"recall {variant} {p}": many["recall"][variant][f"{p}_ms"] / single["recall"][variant][f"{p}_ms"]
           for variant in single["recall"] for p in ("p50", "p95")}
    out |= {f"write {p}": many["write"]["true"][f"{p}_ms"] / single["write"]["true"][f"{p}_ms"] for p in ("p50", "p95")}
    out["ingest rate"] = many["ingest_per_s"] / single["ingest_per_s"]
    return out


def nodes_tables(results: dict) -> list[Table]:
    """The comparison as tables: latency per cluster, the ratios, per-memory figures."""
    clusters = results["clusters"]
    rows = [{"recall": variant, **{f"{name} {p}": f"{c['recall'][variant][f'{p}_ms']:.1f}"
                                   for name, c in clusters.items() for p in ("p50", "p95")}}
            for variant in next(iter(clusters.values()))["recall"]]
    rows += [{"recall": f"write_episode, refresh={policy}",
              **{f"{name} {p}": f"{c['write'][policy][f'{p}_ms']:.1f}" for name, c in clusters.items()
                 for p in ("p50", "p95")}} for policy in next(iter(clusters.values()))["write"]]
    numeric = tuple(f"{name} {p}" for name in clusters for p in ("p50", "p95"))
    return [table(rows, title="Latency (ms)", numeric=numeric),
            table([{"cluster / single node": k, "ratio": f"{v:.2f}"} for k, v in ratios(results).items()],
                  title="Ratios (three nodes on the same two cores: read the ratio, not the absolute)",
                  numeric=("ratio",)),
            table([{"cluster": name, "shards x replicas": f"{c['shards']} x {c['replicas']}",
                    "ingest (memories/s)": f"{c['ingest_per_s']:,.0f}",
                    **{k.replace("_", " "): f"{v:,.0f}" for k, v in per_memory(c).items()}}
                   for name, c in clusters.items()], title="Per memory (bytes)")]


#: Node sizes the sizing guide tabulates (RAM GiB, disk GiB), and the memories one user keeps there.
NODE_SIZES = ((8, 200), (16, 400), (32, 800), (64, 1600))
MEMORIES_PER_USER = (1_000, 10_000)
#: Primary shard sizes of Elastic's guidance (10-50 GB per shard).
SHARD_GB = (10, 30, 50)
#: Heap: half the RAM, at most 31 GiB (compressed object pointers); disk usable up to the 85% watermark.
HEAP_CAP_GIB = 31
DISK_WATERMARK = 0.85


def node_capacity(ram_gib: int, disk_gib: int, *, figures: dict[str, float], dims: int, replicas: int) -> dict:
    """How many memories one node holds: vectors in the page cache (RAM left beside the heap), copies on disk."""
    heap = min(ram_gib / 2, HEAP_CAP_GIB)
    by_vectors = (ram_gib - heap) * 2**30 / vector_bytes(dims) / (1 + replicas)
    by_disk = disk_gib * 2**30 * DISK_WATERMARK / figures["disk_bytes"] / (1 + replicas)
    return {"heap_gib": heap, "by_vectors": by_vectors, "by_disk": by_disk, "memories": min(by_vectors, by_disk)}


def scaling_tables(results: dict, *, dims: int) -> list[Table]:
    """docs/scaling.md's sizing, from a `run_nodes` result: memories and users per node size."""
    name, cluster = list(results["clusters"].items())[-1]
    figures = per_memory(cluster)
    rows = []
    for ram, disk in NODE_SIZES:
        cap = node_capacity(ram, disk, figures=figures, dims=dims, replicas=cluster["replicas"])
        rows.append({"node RAM / disk (GiB)": f"{ram} / {disk}", "heap (GiB)": f"{cap['heap_gib']:.0f}",
                     "memories (vectors in RAM)": f"{cap['by_vectors']:,.0f}",
                     "memories (disk)": f"{cap['by_disk']:,.0f}",
                     **{f"users of {per:,}": f"{cap['memories'] / per:,.0f}" for per in MEMORIES_PER_USER}})
    shards = [{"primary shard (GB)": gb, "memories": f"{gb * 1e9 / figures['disk_bytes']:,.0f}",
               **{f"users of {per:,}": f"{gb * 1e9 / figures['disk_bytes'] / per:,.0f}" for per in MEMORIES_PER_USER}}
              for gb in SHARD_GB]
    return [table(rows, title=f"One node, with {cluster['replicas']} replica(s) of everything ({name} measured)",
                  numeric=tuple(k for k in rows[0] if k != "node RAM / disk (GiB)")),
            table(shards, title="One primary shard of a memory index", numeric=tuple(shards[0]))]


QUALITY_METRICS = ("r@10", "mrr")


def shards_quality_table(report: Mapping[str, Any], *, shards: int, expected: Mapping | None = None) -> Table:
    """Persona recall per mode on `shards` routed shards (`report`, an `atlas eval persona` run on the cluster)
    beside the recorded one-shard run (results/expected.json)."""
    recorded = (expected or load_expected())["runs"]["persona"]["numbers"]
    rows = [{"mode": mode, **{f"{metric}, {label}": f"{value:.3f}" for metric in QUALITY_METRICS
                              for label, value in (("1 shard", recorded[f"by_mode.{mode}.{metric}"]["value"]),
                                                   (f"{shards} shards", lookup(report, f"by_mode.{mode}.{metric}")))}}
            for mode in C.RECALL_MODES]
    return table(rows, title=f"Persona set: one shard (recorded) and {shards} shards routed by user",
                 numeric=tuple(k for k in rows[0] if k != "mode"))


def render_scaling_markdown(results: dict, *, dims: int, persona: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The generated blocks of docs/scaling.md ("nodes" and "sizing"), from a `run_nodes` result and, when given,
    an `atlas eval persona` report of the cluster."""
    meta, clusters = results["meta"], results["clusters"]
    load = {name: c["machine"]["loadavg_start"][0] for name, c in clusters.items()}
    head = (f"Reproduce with `atlas bench-nodes --scale {meta['plan']['scale']}` (recorded {meta['recorded']}, plan "
            f"`{meta['plan']['name']}` at {meta['plan']['scale']:,} memories, {meta['duration_s'] / 60:.0f} min; "
            f"{meta['plan']['recall_reps']} recalls per variant, {meta['plan']['write_reps']} writes per policy; "
            "load average at the start of each cluster's part: "
            + ", ".join(f"{name} {value:.1f}" for name, value in load.items()) + ").")
    tables = nodes_tables(results)
    if persona is not None:
        shards = next(c["shards"] for c in clusters.values() if c["nodes"] > 1)
        tables.append(shards_quality_table(persona, shards=shards))
    return {"nodes": "\n\n".join([head, *(t.to_markdown() for t in tables)]),
            "sizing": "\n\n".join(t.to_markdown() for t in scaling_tables(results, dims=dims))}
