"""Recall's first stage, timed on the benchmark's synthetic corpora (docs/benchmarks.md, "A BM25 path that can
skip"): the BM25 path's default (every matching memory scored with the multipliers) against a plain top N rescored
(`Tuning(rescore=N)`), and the kNN path with fewer and more candidates, the same recalls in each arm, in one run.

    .venv/bin/python scripts/bm25_skip_bench.py [--scale 10000 --scale 100000 --scale 1000000] [--reps 150] [--record]

For each scale: the corpus of `atlas bench` loaded on its own prefix, the merges waited out, then each mode of
`ARMS` asked `--reps` times (after 5 warm-up recalls) in each of its arms: latency p50/p95/p99, each path's server time,
and the share of recalls whose top 10 is the default's. Writes outputs/bench/bm25_skip.json (and, with `--record`,
results/bench/bm25_skip.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from atlas.config import load_settings
from atlas.core.recall import Tuning
from atlas.core.schemas import all_indices
from atlas.models.embed import load_embedder
from atlas.reporting import table
from atlas.research.bench import (
    BENCH_NOW,
    RECORDED_DIR,
    ClauseVectors,
    bench_store,
    clause_pool,
    label,
    load_corpus,
    machine,
    measure_arms,
    provision_users,
    questions,
    settle_merges,
    synthetic_corpus,
    vector_specs,
)
from atlas.security.connection import connect

#: Each mode's arms, the default first: the BM25 path's first phase, and the kNN path's candidates.
RESCORED = {"default": Tuning(), "rescore 160": Tuning(rescore=160), "rescore 400": Tuning(rescore=400)}
ARMS = {"bm25": RESCORED, "hybrid+rerank": RESCORED,
        "dense": {"default": Tuning(), "100 candidates": Tuning(num_candidates=100),
                  "400 candidates": Tuning(num_candidates=400)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, action="append")
    parser.add_argument("--reps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep each corpus's prefix, and reuse one already loaded")
    parser.add_argument("--merge-wait", type=float, default=3600.0, help="wait at most this long (s) for merges")
    args = parser.parse_args()
    settings = load_settings()
    es = connect(settings)
    rng = random.Random(args.seed)
    pool, asked = clause_pool(rng), questions(rng)
    arms_of = {mode: {arm: {"rescore": t.rescore, "num_candidates": t.num_candidates} for arm, t in arms.items()}
               for mode, arms in ARMS.items()}
    results: dict = {"meta": {"machine": machine(es), "reps": args.reps, "seed": args.seed, "arms": arms_of},
                     "scales": {}}
    started = time.perf_counter()
    clauses = None
    for scale in args.scale or [10_000, 100_000, 1_000_000]:
        prefix = f"bm25skip-{label(scale)}"
        loaded = args.keep and es.indices.exists(index=f"{prefix}-episodic") and es.count(
            index=",".join(all_indices(prefix, archive=False)), ignore_unavailable=True)["count"] >= scale
        store = bench_store(prefix, settings, es, fresh=not loaded)
        try:
            clauses = clauses or ClauseVectors(pool, {field: load_embedder(spec, cache_dir=settings.embedding_cache_dir)
                                                      for field, spec in vector_specs(store, settings).items()})
            corpus = synthetic_corpus(scale, clauses, rng, BENCH_NOW)
            if not loaded:
                provision_users(store, corpus.users)
                load_corpus(store, corpus, clauses, args.seed)
            merges = settle_merges(es, store.prefix, limit_s=args.merge_wait)
            results["scales"][str(scale)] = {"merges": merges, "modes": {
                mode: measure_arms(corpus, asked, mode, {arm: (store, tuning) for arm, tuning in arms.items()},
                                   args.reps, 5, rng, BENCH_NOW)
                for mode, arms in ARMS.items()},
                "loadavg_end": os.getloadavg()}
        finally:
            if not args.keep:
                store.drop()
    results["meta"]["duration_s"] = time.perf_counter() - started
    rows = [{"memories": f"{int(scale):,}", "mode": mode, "arm": arm,
             **{name: round(m[f"{name}_ms"]) for name in ("p50", "p95", "p99")},
             "bm25 took": round(m["took_ms"]["took_bm25"]), "kNN took": round(m["took_ms"]["took_dense"]),
             "same top 10": round(m["same_top_k"], 3),
             "load": f"{r['merges']['loadavg'][0]:.1f}-{r['loadavg_end'][0]:.1f}"}
            for scale, r in results["scales"].items() for mode, arms in r["modes"].items() for arm, m in arms.items()]
    print(table(rows, title="The first stage's arms, ms").to_markdown())
    text = json.dumps(results, indent=1)
    for folder in [settings.outputs_dir] + ([RECORDED_DIR] if args.record else []):
        (folder / "bench").mkdir(parents=True, exist_ok=True)
        (folder / "bench" / "bm25_skip.json").write_text(text)


if __name__ == "__main__":
    main()
