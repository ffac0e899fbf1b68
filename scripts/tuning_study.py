"""Recall's BM25 path with other `Tuning`s, in one run of every mode (docs/evaluation.md):

- `--study statistics` ("Tenant-local BM25"): each word weighed by its IDF among the user's own documents (the
  default) against every word weighing 1 (`Tuning(idf=False)`, no statistics search);
- `--study bm25` ("A BM25 path that can skip"): the default against a first phase rescored on its top N
  (`Tuning(rescore=N)`);
- `--study stopwords` ("Stop words in text.exact"): a query's stop words searched in `text.exact`, as before issue 35,
  against left out (the default since).

    .venv/bin/python scripts/tuning_study.py --study bm25 [--conversations 2] [--prefix-persona eval-persona] [--record]

Asks every question of the persona set and of LoCoMo's first `--conversations` conversations (0: all) in every mode
and arm, on the prefixes `atlas eval` keeps (loading them if needed; LoCoMo's prefix is `eval-locomo-ci` for the first
two, `eval-locomo` for all), writes outputs/eval/<study>_study.json (with `--record`, its summary also to
results/studies/<study>.json, which docs/evaluation.md quotes) and prints R@5, R@10 (LoCoMo: its main set), the share
of questions whose top 10 is the first arm's, and the latency (p50/p95 ms) per dataset, mode and arm. Each question
is asked in every arm before the next, so all see one load; the first arm also pays for the term statistics' search,
which the shard request cache then answers for the others, so the latency favours the later arms.
"""

from __future__ import annotations

import argparse
import os

from atlas import constants as C
from atlas.config import REPO_ROOT
from atlas.core.recall import Tuning
from atlas.reporting import table
from atlas.research.datasets import PERSONA_NOW
from atlas.research.evaluate import LOCOMO_KS, PERSONA_KS, ask, prepare_locomo, prepare_persona, write_report
from atlas.research.locomo import CATEGORY_NAMES, MAIN_CATEGORIES, load_conversations
from atlas.research.metrics import percentiles
from atlas.research.results import STUDIES_DIR
from atlas.stack import open_store

#: Each study's arms, the one the others are compared with first.
STUDIES = {
    "statistics": {"tenant IDF": Tuning(), "no IDF": Tuning(idf=False)},
    "bm25": {"default": Tuning(), "rescore 160": Tuning(rescore=160), "rescore 400": Tuning(rescore=400)},
    "stopwords": {"stop words in text.exact": Tuning(exact_stop_words=True),
                  "no stop words in text.exact": Tuning(exact_stop_words=False)},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=sorted(STUDIES), required=True)
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--prefix-persona", default="eval-persona")
    parser.add_argument("--record", action="store_true", help="also write the summary to results/studies/<study>.json")
    args = parser.parse_args()
    arms = STUDIES[args.study]
    persona_store = open_store(args.prefix_persona, now=lambda: PERSONA_NOW)
    persona, _ = prepare_persona(persona_store, progress=False)
    conversations = load_conversations()[:args.conversations or None]
    locomo_store = open_store("eval-locomo-ci" if args.conversations == 2 else "eval-locomo")
    locomo, _ = prepare_locomo(locomo_store, conversations, progress=False)
    rows: list[dict] = []
    load = {}
    for name, store, questions, ks in (("persona", persona_store, persona, PERSONA_KS),
                                       ("locomo", locomo_store, locomo, LOCOMO_KS)):
        for mode in C.RECALL_MODES:
            for question in questions:
                for arm, tuning in arms.items():
                    row = ask(store, question, mode, ks, options={"tuning": tuning})
                    rows.append(row | {"dataset": name, "arm": arm})
        load[name] = os.getloadavg()
    first = next(iter(arms))
    top10 = {(r["dataset"], r["mode"], r["qid"]): r["ranked"][:10] for r in rows if r["arm"] == first}
    summary = []
    main = {CATEGORY_NAMES[c] for c in MAIN_CATEGORIES}  # LoCoMo's R@K: the main set, as `atlas eval locomo` reports
    for name in ("persona", "locomo"):
        for mode in C.RECALL_MODES:
            for arm in arms:
                mine = [r for r in rows if (r["dataset"], r["mode"], r["arm"]) == (name, mode, arm)]
                scored = [r for r in mine if "r@10" in r and (name == "persona" or r["group"] in main)]
                latency = percentiles([r["latency_ms"] for r in mine], ps=(50, 95))
                summary.append({"dataset": name, "mode": mode, "arm": arm, "n": len(scored),
                                "r@5": sum(r["r@5"] for r in scored) / len(scored),
                                "r@10": sum(r["r@10"] for r in scored) / len(scored),
                                "same top 10": sum(r["ranked"][:10] == top10[name, mode, r["qid"]]
                                                   for r in mine) / len(mine),
                                "p50 ms": round(latency["p50"]), "p95 ms": round(latency["p95"])})
    report = {"conversations": len(conversations), "summary": summary, "load_average": load}
    write_report(report | {"rows": rows}, REPO_ROOT / "outputs" / "eval", f"{args.study}_study")
    if args.record:  # what docs/evaluation.md quotes (`study_table`), without the per-question rows
        write_report(report, STUDIES_DIR, args.study)
    print(table(summary, title=f"{args.study} study: {', '.join(arms)}",
                numeric={"n", "r@5", "r@10", "same top 10"}).to_markdown())
    print("load average", load)


if __name__ == "__main__":
    main()
