"""Compact vectors, measured (docs/benchmarks.md "Compact vectors"): size, vector memory and recall per vector format.

    .venv/bin/python scripts/vector_formats.py [--locomo dev|ci] [--formats v3,int8_hnsw,bbq_hnsw]
                                               [--sets persona,locomo]

One run loads persona and LoCoMo (the dev split, or `--locomo ci`: the first 2 conversations; `--sets` picks) into
a fresh prefix per format, asks every question in every recall mode, and measures each prefix: primary bytes on
disk (`atlas.research.bench.index_size`) and the vector files of `_stats/dense_vector` (`off_heap`: the HNSW graph
`vex`, raw floats `vec`, int8 `veq`, bbq `veb`). What a kNN search keeps in the page cache is the graph and the
vectors it scores: `vec` for `hnsw`, `veq` for `int8_hnsw`, `veb` for `bbq_hnsw` (whose rescoring reads a few raw
floats per query). Writes `outputs/vector_formats-<sets>-<locomo>-<formats>.json` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence

from atlas import constants as C
from atlas.config import load_settings
from atlas.core.schemas import drop_indices
from atlas.research.bench import index_size
from atlas.research.datasets import PERSONA_NOW
from atlas.research.evaluate import evaluate_locomo, evaluate_persona
from atlas.research.locomo import load_conversations
from atlas.security.connection import connect
from atlas.stack import open_store

#: Format name -> (index type of the kNN fields, vectors kept in `_source`); "v3" is schema v3, the before.
FORMATS: dict[str, tuple[C.VectorIndex, bool]] = {
    "v3": ("hnsw", True), "hnsw": ("hnsw", False), "int8_hnsw": ("int8_hnsw", False), "bbq_hnsw": ("bbq_hnsw", False)}
def measure(name: str, run: str, conversations: Sequence | None) -> dict:
    vector_index, source_vectors = FORMATS[name]
    prefix = f"vf-{name.replace('_', '-')}-{run}"
    settings = load_settings(vector_index=vector_index, source_vectors=source_vectors)
    drop_indices(connect(settings), prefix)
    started = time.perf_counter()
    if conversations is None:
        store = open_store(prefix, settings=settings, now=lambda: PERSONA_NOW)
        report = evaluate_persona(store, progress=False)
    else:
        store = open_store(prefix, settings=settings)
        report = evaluate_locomo(store, conversations, progress=False)
    size = index_size(store.es, prefix)
    store.drop()
    memories = size["docs"]
    return {"format": name, "run": run, "vector_index": vector_index, "source_vectors": source_vectors,
            "memories": memories, "disk_bytes_per_memory": size["bytes"] / memories,
            "vector_files": size["vector_files"], "search_memory_bytes_per_memory": size["knn_bytes"] / memories,
            "r@10": {mode: (m if run == "persona" else m["main"])["r@10"] for mode, m in report["by_mode"].items()},
            "p50_ms": {mode: m["latency_ms"]["latency"]["p50"] for mode, m in report["by_mode"].items()},
            "seconds": time.perf_counter() - started, "loadavg": os.getloadavg()}


def table(rows: Sequence[dict]) -> str:
    modes = list(rows[0]["r@10"])
    head = ["set", "format", "disk B/memory", "kNN memory B/memory", *[f"R@10 {m}" for m in modes],
            f"p50 ms {C.DEFAULT_RECALL_MODE}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["run"], r["format"], f"{r['disk_bytes_per_memory']:,.0f}",
                                        f"{r['search_memory_bytes_per_memory']:,.0f}",
                                        *[f"{r['r@10'][m]:.4f}" for m in modes],
                                        f"{r['p50_ms'][C.DEFAULT_RECALL_MODE]:.0f}"]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locomo", choices=("dev", "ci"), default="dev")
    parser.add_argument("--formats", default="v3,int8_hnsw,bbq_hnsw", help=f"of {', '.join(FORMATS)}")
    parser.add_argument("--sets", default="persona,locomo", help="of persona, locomo")
    args = parser.parse_args()
    conversations = load_conversations()[:2 if args.locomo == "ci" else None]
    sets = args.sets.split(",")
    out = load_settings().outputs_dir / f"vector_formats-{'-'.join(sets)}-{args.locomo}-{args.formats}.json"
    results: dict = {"command": f"scripts/vector_formats.py --locomo {args.locomo} --formats {args.formats} "
                                f"--sets {args.sets}", "loadavg_start": os.getloadavg(), "rows": []}
    runs = {"persona": ("persona", None), "locomo": (f"locomo-{args.locomo}", conversations)}
    for run, data in (runs[name] for name in sets):
        for name in args.formats.split(","):
            results["rows"].append(measure(name, run, data))
            out.write_text(json.dumps(results, indent=1))
            print(table(results["rows"][-1:]), flush=True)
    results["loadavg_end"] = os.getloadavg()
    out.write_text(json.dumps(results, indent=1))
    print(table(results["rows"]))


if __name__ == "__main__":
    main()
