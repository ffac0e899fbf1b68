"""Recall options as studies: the default mode with and without one, question by question.

`ask_arms` asks every question once per arm (`ask` with the arm's recall options: the session pass of `ARMS`,
hubness of `HUB_ARMS`); `paired` gives each category's mean in both arms and the paired gain with its bootstrap
interval; `found_by_pass` lists the questions whose evidence an arm brings into the top k, and `evidence_places`
shows one of them hit by hit. `scripts/session_study.py` runs the session pass on LoCoMo dev and the persona set
(docs/evaluation.md, "The session pass"); notebook 12 places one question's evidence with and without hubness.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from atlas import constants as C
from atlas.core.recall import Tuning
from atlas.core.store import Store
from atlas.reporting import Table, table, truncate
from atlas.research.evaluate import EvalQuestion, ask, ask_one, session_scores, warm_query_vectors
from atlas.research.metrics import bootstrap_ci, percentiles

#: The arms compared: the default mode as it is, and with the session pass over the sessions of the first 10 hits
#: (SESSION_PASS_TURNS turns of each after the first SESSION_PASS_KEEP hits). 10 sessions, 2 turns and 7 kept
#: were chosen on one conversation (conv-26) by an offline replay, before the other six were run.
ARMS: dict[str, dict[str, Any]] = {"off": {}, "session pass": {"sessions": 10}}
#: The default mode without the hubness penalty and as it is (`atlas.core.hubness`, docs/evaluation.md).
HUB_ARMS: dict[str, dict[str, Any]] = {"off": {"tuning": Tuning(hub_penalty=0.0)}, "hubness": {}}


def ask_arms(store: Store, questions: Sequence[EvalQuestion], ks: Sequence[int], *,
             arms: Mapping[str, Mapping[str, Any]] = ARMS, sessions: bool = False,
             progress: bool = False) -> dict[str, list[dict]]:
    """{arm: rows of `ask`} in the default mode, each arm's options passed to `recall`; with `sessions`
    (LoCoMo), a row with evidence also gets its session metrics (`session_<metric>`). Each question is asked in
    every arm before the next, so both arms' latencies see the same load."""
    warm_query_vectors(store, [q.query for q in questions])
    out: dict[str, list[dict]] = {name: [] for name in arms}
    for question in tqdm(questions, desc="recall", unit="q", disable=not progress):
        for name, options in arms.items():
            row = ask(store, question, C.DEFAULT_RECALL_MODE, ks, options=options)
            if sessions and question.relevant:
                row |= {f"session_{m}": v for m, v in session_scores(question, row["ranked"]).items()}
            out[name].append(row)
    return out


def paired(base: Sequence[dict], arm: Sequence[dict], *, metric: str = "r@10", groups: Sequence[str] | None = None,
           seed: int = 0) -> list[dict]:
    """Per group (and "all" over those groups): n, the metric in both arms and the arm's paired gain over the base
    with its bootstrap 95% interval. Questions without the metric (no evidence) and groups without questions are
    left out."""
    by_qid = {row["qid"]: row for row in arm}
    scored = [(row, by_qid[row["qid"]]) for row in base if metric in row]
    names = list(groups) if groups is not None else list(dict.fromkeys(row["group"] for row, _ in scored))
    out = []
    for name in [*names, "all"]:
        pairs = [(b[metric], a[metric]) for b, a in scored if b["group"] in names and name in ("all", b["group"])]
        if not pairs:
            continue
        gain = [a - b for b, a in pairs]
        low, high = bootstrap_ci(gain, seed=seed)
        out.append({"group": name, "n": len(pairs), "off": float(np.mean([b for b, _ in pairs])),
                    "on": float(np.mean([a for _, a in pairs])),
                    "gain [95% CI]": f"{np.mean(gain):+.3f} [{low:+.3f}, {high:+.3f}]"})
    return out


def latency(rows: Sequence[dict]) -> dict[str, float]:
    """p50 and p95 of the recall latency (ms) of an arm's rows."""
    return percentiles([row["latency_ms"] for row in rows], ps=(50, 95))


def paired_table(base: Sequence[dict], arm: Sequence[dict], *, title: str, **options: Any) -> Table:
    """`paired` as a table."""
    return table(paired(base, arm, **options), title=title, numeric={"n", "off", "on"})


def found_by_pass(base: Sequence[dict], arm: Sequence[dict], *, group: str = "multi-hop", k: int = 10) -> list[str]:
    """Qids of `group` whose evidence recall at k the arm raises, the largest gain first."""
    by_qid = {row["qid"]: row for row in arm}
    gains = {row["qid"]: by_qid[row["qid"]][f"r@{k}"] - row[f"r@{k}"] for row in base
             if row["group"] == group and f"r@{k}" in row}
    return sorted((qid for qid, gain in gains.items() if gain > 0), key=lambda qid: -gains[qid])


def evidence_places(store: Store, question: EvalQuestion, *, arms: Mapping[str, Mapping[str, Any]] = ARMS,
                    depth: int = 50) -> Table:
    """Each evidence turn of `question`: its session, its place in each arm's ranking (within the first `depth`),
    and its text."""
    results = {name: ask_one(store, question, C.DEFAULT_RECALL_MODE, depth, **options)
               for name, options in arms.items()}
    rows = []
    for key in question.relevant:
        places, text, session = {}, "", ""
        for name, result in results.items():
            keys = [hit.source.get("source_key") for hit in result.hits]
            places[f"place, {name}"] = keys.index(key) + 1 if key in keys else None
            hit = next((h for h in result.hits if h.source.get("source_key") == key), None)
            if hit is not None:
                text, session = hit.text, hit.source.get("session_id") or ""
        rows.append({"evidence": key, "session": session, **places, "text": truncate(text, 70)})
    return table(rows, title=f"{question.query} ({question.group})", numeric={f"place, {name}" for name in arms})
