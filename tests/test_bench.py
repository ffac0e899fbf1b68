"""atlas.research.bench's measurements that are not timings (timings are reported, never asserted)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from atlas import constants as C
from atlas.core.memory import write_episode
from atlas.core.recall import Tuning
from atlas.research.bench import (
    PEERS,
    REFRESH_POLICIES,
    WRITE_PARTS,
    Corpus,
    bench_store,
    index_size,
    measure_arms,
    measure_ingest_with_embedding,
    measure_throughput,
    measure_token_check,
    measure_writes,
)
from atlas.security.credentials import credentials_name
from atlas.security.tenancy import live_prefix_keys_query

pytestmark = pytest.mark.cluster


def test_index_size_sees_documents_written_just_before(store) -> None:
    """`_stats` caches the store size for 10 s; a size taken right after loading must not read the old one."""
    empty = index_size(store.es, store.prefix)
    for i in range(20):
        write_episode(store, "sizer", f"The hallway sensor number {i} went offline after the update.")
    loaded = index_size(store.es, store.prefix)
    assert (empty["docs"], loaded["docs"]) == (0, 20)
    assert loaded["bytes"] > empty["bytes"] + 20 * 768 * 4  # at least the raw nomic vectors
    assert loaded["bytes_per_1k"] == pytest.approx(loaded["bytes"] / 20 * 1000)
    files = loaded["vector_files"]  # schema v4: bbq_hnsw searches 1-bit vectors, the floats stay on disk beside them
    assert files["vectors"] >= 20 and 0 < files["veb"] < files["vec"]
    assert loaded["knn_bytes"] == files["vex"] + files["veb"]


def test_knn_memory_is_the_graph_and_the_vectors_searched():
    from atlas.research.bench import knn_memory

    assert knn_memory({"vex": 10, "veb": 5, "vec": 100}) == 15  # bbq_hnsw
    assert knn_memory({"vex": 10, "veq": 40, "vec": 100}) == 50  # int8_hnsw
    assert knn_memory({"vex": 10, "vec": 100}) == 110 and knn_memory({}) == 0  # hnsw; an empty index


def test_a_bench_store_drops_what_an_interrupted_run_left(store) -> None:
    """Indices and read keys of the prefix go, so the next run measures key creation again."""
    write_episode(store, "leftover", "The porch light stays on all night.")
    query = live_prefix_keys_query(store.prefix)
    assert store.es.security.query_api_keys(query=query)["api_keys"]
    fresh = bench_store(store.prefix, store.settings, store.es)
    assert not store.es.security.query_api_keys(query=query)["api_keys"]
    assert not store.es.indices.exists(index=credentials_name(store.prefix))
    assert index_size(fresh.es, fresh.prefix)["docs"] == 0


def test_ingest_reports_each_models_stage(store) -> None:
    """Both models' embedding is counted inside the load (every text once) and takes part of its wall time."""
    measured = measure_ingest_with_embedding(store, random.Random(3), 24, store.now())
    assert measured["docs"] == 24 and measured["per_s"] == pytest.approx(24 / measured["seconds"])
    assert set(measured["stages"]) == {model.name for model in store.passage_embedders.values()}
    assert all(stage["texts_per_s"] > 0 and 0 < stage["share"] <= 1 for stage in measured["stages"].values())
    assert sum(stage["share"] for stage in measured["stages"].values()) <= 1


def test_a_write_is_split_into_its_steps(tstore) -> None:
    """Every refresh policy times each step of a write; the steps happen one after another inside the write, so
    their means add up to at most the write's own mean, and the objects they were timed on are left as they were."""
    users = ["wes", "wren"]
    for user in users:
        write_episode(tstore, user, f"{user}'s porch sensor went offline after the update.")
    out = measure_writes(tstore, users, 3, random.Random(0), progress=False)
    assert list(out) == list(REFRESH_POLICIES)
    for stats in out.values():
        assert list(stats["parts_ms"]) == list(WRITE_PARTS) and all(ms > 0 for ms in stats["parts_ms"].values())
        assert sum(stats["parts_ms"].values()) <= stats["mean_ms"]
    assert out["true"]["turn"]["n"] == 3, "the turn: each write with its pre_recall"
    assert "index" not in vars(tstore.es) and tstore.provision == tstore.reader.provision
    assert tstore.refresh == C.WRITE_REFRESH
    assert all("embed_passages" not in vars(model) for model in tstore.passage_embedders.values())


def test_throughput(store) -> None:
    """One entry per client count, each a positive rate over every request and ordered percentiles. The wall
    time is never compared with a threshold, only with the latencies it contains: at most `clients` overlap."""
    users = ["u0000", "u0001"]
    for user in users:
        write_episode(store, user, f"{user}'s porch sensor went offline after the update.")
    corpus = Corpus(docs=[], heads=[], details=[], users=users)
    clients, requests = [1, 2], 4
    out = measure_throughput(store, corpus, ["porch sensor offline"], clients, requests, random.Random(0), store.now(),
                             progress=False)
    assert list(out) == [str(n) for n in clients]
    for n, stats in zip(clients, out.values(), strict=True):
        assert stats["n"] == requests and stats["recalls_per_s"] > 0
        assert 0 < stats["p50_ms"] <= stats["p95_ms"] <= stats["p99_ms"] and stats["mean_ms"] > 0
        wall_ms = requests / stats["recalls_per_s"] * 1000
        assert stats["p99_ms"] <= wall_ms and requests * stats["mean_ms"] <= n * wall_ms


def test_token_check_is_measured_with_and_without_the_cache(tstore) -> None:
    """Both settings time `checks` verifications of live tokens; without tenancy there is nothing to check."""
    users = ["tina", "theo"]
    for user in users:
        tstore.provision(user)
    out = measure_token_check(tstore, users, 40, random.Random(0))
    assert out is not None and out["tokens"] == 2 and out["revocation_bound_s"] == C.TOKEN_CACHE_SECONDS
    for name in ("cached", "no cache"):
        assert out[name]["n"] == 40 and 0 < out[name]["p50_ms"] <= out[name]["p95_ms"] <= out[name]["p99_ms"]
    assert measure_token_check(replace(tstore, provision=None), users, 40, random.Random(0)) is None


def _cluster_result(*, p50: float, write: float, ingest: float, replicas: int, heap_mb: float) -> dict:
    return {"nodes": 1 + 2 * replicas, "shards": 1 + 2 * replicas, "replicas": replicas, "ingest_per_s": ingest,
            "recall": {"bm25": {"p50_ms": p50, "p95_ms": 2 * p50}},
            "write": {"true": {"p50_ms": write, "p95_ms": 2 * write}},
            "index_size": {"docs": 1000, "bytes": 4_000_000, "bytes_all_copies": 4_000_000 * (1 + replicas)},
            "memory": {"es": {"n1": {"heap_used_mb": heap_mb}}}}


def test_nodes_comparison_ratios_and_sizing() -> None:
    """Ratios are cluster / single node; a node's capacity is the smaller of what its RAM and disk hold."""
    from atlas.research.cluster_bench import node_capacity, per_memory, ratios, scaling_tables, vector_bytes

    results = {"clusters": {"1 node": _cluster_result(p50=10, write=50, ingest=1000, replicas=0, heap_mb=100),
                            "3 nodes": _cluster_result(p50=25, write=60, ingest=500, replicas=1, heap_mb=300)}}
    got = ratios(results)
    assert got["recall bm25 p50"] == 2.5 and got["write p95"] == pytest.approx(1.2) and got["ingest rate"] == 0.5
    figures = per_memory(results["clusters"]["3 nodes"])
    assert figures == {"disk_bytes": 4000, "disk_bytes_all_copies": 8000, "heap_bytes": 300 * 2**20 / 1000}
    # Elasticsearch's rules: the scored vectors (bbq: dims / 8 + 14, floats: 4 x dims) and the graph (4 x m)
    assert vector_bytes(768) == 768 / 8 + 14 + 64 == 174 and vector_bytes(768, "hnsw") == 4 * 768 + 64
    small = node_capacity(8, 200, figures=figures, dims=768, replicas=1)
    assert small["heap_gib"] == 4 and small["by_vectors"] == pytest.approx(4 * 2**30 / 174 / 2)
    assert small["by_disk"] == pytest.approx(200 * 2**30 * 0.85 / 4000 / 2)
    assert small["memories"] == min(small["by_vectors"], small["by_disk"])
    assert node_capacity(128, 100, figures=figures, dims=768, replicas=1)["heap_gib"] == 31
    nodes, shards = scaling_tables(results, dims=768)
    assert len(nodes.rows) == 4 and len(shards.rows) == 3


def test_the_recorded_nodes_run_is_what_scaling_quotes():
    """Issue 20: the three-node tables and the sizing in docs/scaling.md are rendered from the committed run
    (`atlas bench-nodes --record`), so each number there can be traced to it."""
    from atlas.config import REPO_ROOT
    from atlas.research.bench import RECORDED_DIR, load_results
    from atlas.research.cluster_bench import NODES, render_scaling_markdown

    recorded = load_results(RECORDED_DIR, plans=["nodes"])
    assert recorded is not None and recorded["meta"]["plan"]["scale"] == NODES.scale
    blocks = render_scaling_markdown(recorded, dims=768)
    text = (REPO_ROOT / "docs" / "scaling.md").read_text()
    for name, block in blocks.items():
        start, end = text.index(f"<!-- {name}:start -->"), text.index(f"<!-- {name}:end -->")
        assert block in text[start:end], f"docs/scaling.md's {name} block is not the recorded run's"


def _partition_run(docs: list[int], heavy: list[int], shards_asked: int) -> dict:
    timing = {"p50_ms": 100.0, "p95_ms": 200.0}
    return {"docs_per_shard": {"episodic": docs, "semantic": [10, 10, 10], "procedural": [5, 5, 5]},
            "heaviest": {"user": "u0000", "docs_per_shard": {"episodic": heavy, "semantic": [3, 0, 0],
                                                             "procedural": [0, 0, 0]}},
            "shards_per_recall": shards_asked, "recall": {"heaviest user": timing, "users by activity": timing}}


def test_the_hot_shard_table_reads_the_skew_and_the_heaviest_users_share():
    """Issue 37: the largest shard against the mean of its index (worst index), the heaviest user's share of all
    user documents, and where its episodes sit."""
    from atlas.research.cluster_bench import shards_table

    results = {"meta": {"plan": {"scale": 1000}, "nodes": 3},
               "partitions": {"1": _partition_run([60, 20, 10], [0, 0, 30], 4),
                              "2": _partition_run([35, 30, 25], [15, 0, 15], 7)}}
    shown = shards_table(results)
    one, two = (dict(zip(shown.columns, row, strict=True)) for row in shown.rows)
    assert one["largest shard / mean"] == "2.00" and two["largest shard / mean"] == "1.17"
    assert one["heaviest user's share"] == "24.4%"  # 30 + 3 of the 90 + 30 + 15 user documents
    assert one["its episodic shards"] == "0 / 0 / 30" and two["shards a recall asks"] == 7


def test_the_recorded_shards_run_is_what_scaling_quotes():
    """Issue 37: docs/scaling.md's hot-shard block is rendered from the committed run (`atlas bench-nodes
    --study shards --record`)."""
    from atlas.config import REPO_ROOT
    from atlas.research.bench import RECORDED_DIR, load_results
    from atlas.research.cluster_bench import SHARDS, render_shards_markdown

    recorded = load_results(RECORDED_DIR, plans=["shards"])
    assert recorded is not None and recorded["meta"]["plan"]["scale"] == SHARDS.scale
    text = (REPO_ROOT / "docs" / "scaling.md").read_text()
    start, end = text.index("<!-- shards:start -->"), text.index("<!-- shards:end -->")
    assert render_shards_markdown(recorded) in text[start:end]


@pytest.mark.parametrize("name", ["quick", "quick-no-vnni"])
def test_the_recorded_quick_runs_are_what_benchmarks_quotes(name):
    """Issue 37: docs/benchmarks.md's blocks are the committed `atlas bench --quick --record` runs (the one before the
    last kept beside it), which record each level's CPU per recall (this process and the node) beside the processor,
    and since the last, whether it has VNNI and the turn (a write and its recall)."""
    import json

    from atlas.config import REPO_ROOT
    from atlas.research.bench import RECORDED_DIR, render_markdown

    recorded = json.loads((RECORDED_DIR / "bench" / f"bench-{name}.json").read_text())
    assert recorded["meta"]["machine"]["cpu"]
    assert all("cpu_ms_per_recall" in level for level in recorded["throughput"]["clients"].values())
    if name == "quick":
        assert isinstance(recorded["meta"]["machine"]["vnni"], bool) and recorded["write"]["true"]["turn"]["n"]
    text = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    start, end = text.index(f"<!-- bench:{name} -->"), text.index(f"<!-- /bench:{name} -->")
    assert render_markdown(recorded) in text[start:end]


def test_latency_figure_has_a_line_per_mode_and_percentile_on_log_axes(tmp_path):
    """Issue 21: every corpus size on a log axis, p50 and p95 of each mode and each peer named in the legend."""
    from atlas.notebook.plots import bench_latency

    recall = {str(n): {mode: {"p50_ms": n / 10, "p95_ms": n / 5} for mode in ("bm25", "hybrid")}
              for n in (250, 1000, 4000)}
    ax = bench_latency({"recall": recall, "peers": PEERS}, out_dir=tmp_path).axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    labels = ax.get_legend_handles_labels()[1]
    assert labels[:4] == ["bm25 p50", "bm25 p95", "hybrid p50", "hybrid p95"] and len(labels) == 7
    assert all(len(line.get_xdata()) == 3 for line in ax.get_lines()[:4])
    highest = max(max(line.get_ydata()) for line in ax.get_lines())
    assert max(ax.get_yticks()) >= highest, "a labelled tick above every point (issue 35: none above 200 ms)"
    assert (tmp_path / "figures" / "bench_recall_latency.png").is_file()


def test_write_figure_has_a_bar_per_policy_and_one_for_the_turn(tmp_path):
    """Issue 37: the write panel shows each refresh policy and, where the run measured it, the turn (a write and its
    pre_recall); an older run without the turn draws the policies alone."""
    from atlas.notebook.plots import bench_writes_throughput

    write = {policy: {"p50_ms": 50.0, "p95_ms": 80.0} for policy in REFRESH_POLICIES}
    results = {"write": write, "peers": PEERS,
               "throughput": {"mode": "hybrid+rerank", "scale": 1000, "clients": {"1": {"recalls_per_s": 9.0}}}}
    ticks = [t.get_text() for t in bench_writes_throughput(results, out_dir=tmp_path).axes[0].get_xticklabels()]
    assert ticks == list(REFRESH_POLICIES)
    write["true"]["turn"] = {"p50_ms": 150.0, "p95_ms": 190.0}
    left = bench_writes_throughput(results, out_dir=tmp_path).axes[0]
    assert [t.get_text() for t in left.get_xticklabels()] == [*REFRESH_POLICIES, "turn"]
    assert [bar.get_height() for bar in left.patches] == [50.0] * 3 + [150.0]


def _ingest_results() -> dict:
    stages = {"a": {"texts_per_s": 60.0, "share": 0.3}, "b": {"texts_per_s": 30.0, "share": 0.6}}
    return {"ingest": {"without_embedding": {"1000": 600.0, "1000000": 800.0},
                       "with_embedding": {"docs": 128, "per_s": 19.0, "seconds": 6.7, "stages": stages}},
            "embedding": {name: {"passages_per_s": rate, "query": {"p50_ms": 20.0}}
                          for name, rate in (("a", 90.0), ("b", 45.0))}}


def test_ingest_figure_sets_the_load_beside_the_models_ceiling(tmp_path):
    """Issue 19: the load with both models beside the most the models allow (a text of each per memory:
    1 / (1/90 + 1/45) = 30/s), and each model inside the load beside alone."""
    from atlas.notebook.plots import bench_ingest

    left, right = bench_ingest(_ingest_results(), out_dir=tmp_path).axes
    assert [line.get_ydata()[0] for line in left.get_lines()] == [600, 800, 19, pytest.approx(30.0)]
    assert left.get_yscale() == "log" and left.get_ylim()[0] == 1 and not left.patches, "points, not bars, on log"
    assert [p.get_height() for p in right.patches] == [60, 30, 90, 45]
    assert right.get_legend_handles_labels()[1] == ["inside bulk_load", "alone, batched, no cache"]
    assert (tmp_path / "figures" / "bench_ingest.png").is_file()


def test_tables_give_load_minutes_and_the_parts_inside_the_parts():
    """The load's minutes follow from its rate; the detail table appears only for runs that measured it."""
    from atlas.research.bench import tables

    recall = {"hybrid": {"p50_ms": 50.0, "p95_ms": 90.0, "p99_ms": 99.0, "parts_ms": {"es": 40.0, "other": 10.0},
                         "detail_ms": {"took_bm25": 12.0, "took_dense": 20.0, "settle": 0.0, "mget": 0.0}}}
    results = {**_ingest_results(), "corpus": {}, "recall": {"1000000": recall}, "index_size": {}, "memory": {}}
    got = {t.title: t for t in tables(results)}
    ingest = [dict(zip(got["Bulk ingest"].columns, row, strict=True)) for row in got["Bulk ingest"].rows]
    assert ingest[1]["memories/s"] == "800" and ingest[1]["minutes"] == f"{1_000_000 / 800 / 60:.1f}"
    detail = next(t for title, t in got.items() if title.startswith("Inside the parts"))
    assert detail.columns == ["memories", "mode", "took_bm25", "took_dense", "settle", "mget"]
    assert detail.rows == [["1,000,000", "hybrid", "12.0", "20.0", "0.0", "0.0"]]
    del recall["hybrid"]["detail_ms"]
    assert not any(t.title.startswith("Inside the parts") for t in tables(results))


def test_a_saved_run_is_loaded_by_plan_and_plans_are_named(tmp_path):
    from atlas.research.bench import MILLION, PLANS, load_results, write_json

    assert load_results(tmp_path) is None
    for name in ("smoke", "million", "quick"):
        write_json({"meta": {"plan": {"name": name}}}, tmp_path)
    assert load_results(tmp_path) == {"meta": {"plan": {"name": "quick"}}}
    assert load_results(tmp_path, plans=("million",)) == {"meta": {"plan": {"name": "million"}}}
    assert list(PLANS) == ["smoke", "quick", "full", "million"] and MILLION.scales == (10_000, 100_000, 1_000_000)


def test_arms_ask_the_same_recalls_and_compare_each_top_with_the_first_arms(store) -> None:
    """Every arm times every recall; an arm that ranks as the first does (a rescore window holding every match)
    agrees on each top, and the server time of each path is read."""
    users = ["u0000", "u0001"]
    for user in users:
        for days in (1, 30, 400):
            write_episode(store, user, f"{user}'s porch sensor went offline {days} days ago.")
    corpus = Corpus(docs=[], heads=[], details=[], users=users)
    arms = {"default": (store, Tuning()), "rescore 400": (store, Tuning(rescore=400))}
    out = measure_arms(corpus, ["porch sensor offline"], "bm25", arms, 4, 1, random.Random(0), store.now())
    assert list(out) == list(arms)
    for stats in out.values():
        assert stats["n"] == 4 and stats["same_top_k"] == 1.0 and stats["took_ms"]["took_bm25"] > 0


def test_the_recorded_first_stage_arms_are_what_the_docs_quote():
    """Issue 37: docs/benchmarks.md's table of the BM25 and kNN arms is the committed run of
    scripts/bm25_skip_bench.py, row for row."""
    import json

    from atlas.config import REPO_ROOT
    from atlas.research.bench import RECORDED_DIR

    run = json.loads((RECORDED_DIR / "bench" / "bm25_skip.json").read_text())
    docs = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    for scale, measured in run["scales"].items():
        for mode, arms in measured["modes"].items():
            for arm, m in arms.items():
                assert (f"| {int(scale):,} | `{mode}` | {arm} | {m['p50_ms']:.0f} / {m['p95_ms']:.0f} / "
                        f"{m['p99_ms']:.0f} | {m['took_ms']['took_bm25']:.0f} | {m['took_ms']['took_dense']:.0f} | "
                        f"{100 * m['same_top_k']:.0f}% |") in docs, (scale, mode, arm)


def test_the_recorded_int8_kernels_are_what_the_docs_quote():
    """Issue 37: docs/benchmarks.md's table of nomic's int8 kernels, and the ratios and per-query times its prose
    states, are the committed run of scripts/int8_kernels.py."""
    import json

    from atlas.config import REPO_ROOT
    from atlas.research.bench import RECORDED_DIR

    run = json.loads((RECORDED_DIR / "bench" / "int8_kernels.json").read_text())
    docs = " ".join((REPO_ROOT / "docs" / "benchmarks.md").read_text().split())
    graphs = run["graphs"]
    for name, graph in graphs.items():
        cosine = graph["cosine_to_fp32"]
        assert (f"| {name} | " + " | ".join(f"{ms:.1f}" for ms in graph["ms_by_tokens"].values())
                + f" | {cosine['min']:.4f} / {cosine['mean']:.4f} |") in docs, name

    def slower(a: str, b: str) -> str:
        ratios = [graphs[a]["ms_by_tokens"][n] / graphs[b]["ms_by_tokens"][n] - 1 for n in graphs[a]["ms_by_tokens"]]
        return f"{min(ratios):.0%} to {max(ratios):.0%}"

    assert f"The exact mode costs {slower('int8, exact mode', 'int8, fast kernel')} over the fast kernel" in docs
    assert f"int8 itself is only {slower('fp32', 'int8, exact mode')} faster than fp32" in docs
    batched = [f"{ms:.0f}" for ms in run["query_ms_by_batch"].values()]
    assert f"at {batched[0]}, {batched[1]} and {batched[2]} ms per query for 1, 4 and 16" in docs


def test_what_benchmarks_says_of_the_quick_runs_is_their_numbers():
    """Issue 37: the sentences of docs/benchmarks.md on the quick runs (where a write's time goes without VNNI, what a
    recall costs in CPU and the ceiling that sets; the write and the turn with VNNI) are computed from their JSON."""
    import json

    from atlas.config import REPO_ROOT
    from atlas.research.bench import RECORDED_DIR, load_results

    recorded = json.loads((RECORDED_DIR / "bench" / "bench-quick-no-vnni.json").read_text())
    docs = " ".join((REPO_ROOT / "docs" / "benchmarks.md").read_text().split())
    write = recorded["write"]["true"]
    parts, total = write["parts_ms"], sum(write["parts_ms"].values())
    share = {step: f"{100 * ms / total:.0f}%" for step, ms in parts.items()}
    assert (f"({write['p95_ms']:.0f} ms in the run above, p50 {write['p50_ms']:.0f})" in docs
            and write["p95_ms"] > 100)
    assert (f"the first model's passage embedding is {share['first model']} of a write, the second model's "
            f"{share['second model']}, the index request with its refresh {share['index']} and the neighbours' "
            f"search {share['neighbours']}") in docs
    assert f"off the write ({parts['second model'] + parts['neighbours']:.0f} ms of it)" in docs
    levels = recorded["throughput"]["clients"]
    one, most = levels["1"]["cpu_ms_per_recall"], levels["16"]["cpu_ms_per_recall"]
    busiest = most["python"] + most["elasticsearch"]
    assert (f"One default recall costs {one['python']:.0f} ms of Python CPU and {one['elasticsearch']:.0f} of the "
            f"node's with one client") in docs
    assert (f"costs {busiest:.0f} ms of it at 16 clients, so about {2000 / busiest:.0f} recalls/s is the ceiling, "
            f"which the run reaches at 4 clients ({levels['4']['recalls_per_s']:.1f}/s) and 16 "
            f"({levels['16']['recalls_per_s']:.1f}/s)") in docs
    vnni = load_results(RECORDED_DIR, plans=["quick"])
    assert vnni is not None and vnni["meta"]["machine"]["vnni"]
    fast, turn = vnni["write"]["true"], vnni["write"]["true"]["turn"]
    assert (f"Here a write meets the design's 100 ms** ({fast['p95_ms']:.0f} ms p95, p50 {fast['p50_ms']:.0f}), with "
            f"no change to Atlas: the first model's passage embedding takes {fast['parts_ms']['first model']:.0f} ms "
            f"of it against {parts['first model']:.0f} on the processor without VNNI. The turn, the write and its "
            f"recall, takes {turn['p50_ms']:.0f} ms p50 and {turn['p95_ms']:.0f} ms p95.") in docs
    assert fast["p95_ms"] < 100
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert (f"A `write_episode` took {fast['p50_ms']:.0f} ms p50 and {fast['p95_ms']:.0f} ms p95, a turn (the write "
            f"and its recall) {turn['p50_ms']:.0f} and {turn['p95_ms']:.0f}, with VNNI (`atlas bench --quick "
            f"--record`; without, {write['p95_ms']:.0f} ms p95)") in readme


@pytest.mark.parametrize("before, after", [("3109051", "73efc2b"), ("a3e4ebc", "6333bcc")])
def test_the_before_and_after_table_is_the_committed_runs(before, after):
    """Issue 37: each before/after table of docs/benchmarks.md is the range, over two runs each, of the `atlas bench
    --quick` JSONs committed in results/bench/before-after (a checkout of the commit before and one of the change,
    in turn)."""
    import json

    from atlas.config import REPO_ROOT
    from atlas.research.bench import RECORDED_DIR

    runs = {commit: [json.loads((RECORDED_DIR / "bench" / "before-after" / f"quick-{commit}-{n}.json").read_text())
                     for n in (1, 2)] for commit in (before, after)}
    docs = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    assert f"| `atlas bench --quick`, two runs each (range) | {before} | {after} |" in docs

    def spread(values: list[float], digits: int = 0) -> str:
        low, high = (f"{v:.{digits}f}" for v in (min(values), max(values)))
        return low if low == high else f"{low}-{high}"

    def row(label: str, value, digits: int = 0) -> str:
        return f"| {label} | " + " | ".join(spread([value(run) for run in runs[c]], digits) for c in runs) + " |"

    default = C.DEFAULT_RECALL_MODE
    rows = [row("write, `refresh=true`, p50 (ms)", lambda r: r["write"]["true"]["p50_ms"]),
            row("write, `refresh=true`, p95 (ms)", lambda r: r["write"]["true"]["p95_ms"])]
    if all("parts_ms" in run["write"]["true"] for both in runs.values() for run in both):  # measured since 73efc2b
        rows.append(row("write, the neighbours' search (ms, mean)",
                        lambda r: r["write"]["true"]["parts_ms"]["neighbours"]))
    for scale in ("1000", "10000"):
        rows += [row(f"default recall at {int(scale):,} memories, {p} (ms)",
                     lambda r, p=p, scale=scale: r["recall"][scale][default][f"{p}_ms"]) for p in ("p50", "p95")]
    rows.append(row("default recall at 10,000, second stage (ms, mean)",
                    lambda r: r["recall"]["10000"][default]["parts_ms"]["second"]))
    rows += [row(f"recalls/s at {n} client{'s' if n != '1' else ''}",
                 lambda r, n=n: r["throughput"]["clients"][n]["recalls_per_s"], 1) for n in ("1", "4", "16")]
    rows.append(row("load average at the start", lambda r: r["meta"]["machine"]["loadavg_start"][0], 1))
    for line in rows:
        assert line in docs, line


def test_the_recorded_million_run_is_what_the_docs_quote():
    """Issue 19: the growth figures in docs/benchmarks.md and the README come from the committed run that notebook
    13 plots (`atlas bench --plan million --record`)."""
    from atlas.config import REPO_ROOT
    from atlas.research.bench import MILLION, RECORDED_DIR, load_results

    recorded = load_results(RECORDED_DIR, plans=["million"])
    assert recorded is not None and recorded["meta"]["plan"]["scales"] == list(MILLION.scales)
    small, large = (recorded["recall"][str(n)][C.DEFAULT_RECALL_MODE]["p95_ms"] for n in (10_000, 1_000_000))
    docs, readme = ((REPO_ROOT / name).read_text() for name in ("docs/benchmarks.md", "README.md"))
    assert f"p95 is {large:.0f} ms at 1M against {small:.0f} ms at 10k: {large / small:.2f}x" in docs
    for scale, modes in recorded["recall"].items():
        r = {mode: (m["p50_ms"], m["p95_ms"], m["p99_ms"]) for mode, m in modes.items()}
        first = " | ".join(f"{r[mode][0]:.0f} / {r[mode][1]:.0f}" for mode in C.RECALL_MODES[:3])
        row = f"| {int(scale):,} | {first} | " + "{:.0f} / {:.0f} / {:.0f} |".format(*r[C.DEFAULT_RECALL_MODE])
        assert row in docs, row
    assert f"p95 {small:.0f} ms at 10k, {large:.0f} ms at 1M ({large / small:.2f}x)" in " ".join(readme.split())
    size = recorded["index_size"]["1000000"]
    assert f"| {size['bytes'] / 1e9:.1f} GB | {size['bytes_per_1k'] / 1000 / 1000:.1f} KB |" in docs
