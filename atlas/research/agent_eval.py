"""The agent evaluation: scripted multi-session conversations through `Agent.turn`, with checks on what is stored
and on the last reply (data/agent/scenarios.json; `atlas eval agent`).

Each scenario starts from the user's memory as its `setup` writes it (`write_memory`, as the tools write), then
runs its sessions, one `Agent` each, with the configured model. Checks, by scenario kind:

- state: every `current` word is in a current fact, no `retired` word is, no memory holds a `forgotten` word, the
  fact that retired one is marked `contradiction`, the playbook's `outcome` was counted;
- reply: the last reply holds every `reply_all` word, one of `reply_any` and none of `reply_none`
  (case-insensitive; a same-turn question needs the device known before and the one just named).

A scenario passes when every check it has holds. The same conversations also run without memory (no setup,
and the user's memory emptied before each session, so nothing is recalled from before), where only replies are
checked: how much of a reply memory explains. A bystander user's memories must come out unchanged (`leaks`: any
change is one); a `forget` scenario also checks that the fact its request did not name is still current.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import openai
from elasticsearch import helpers
from tqdm.auto import tqdm

from atlas.config import Settings
from atlas.core.memory import write_memory
from atlas.core.store import Store
from atlas.models.llm import LLMError, llm_client, not_configured_message
from atlas.research.datasets import REPO_ROOT
from atlas.research.evaluate import setup
from atlas.research.metrics import bootstrap_ci
from atlas.serve.agent import Agent

SCENARIOS_PATH = REPO_ROOT / "data" / "agent" / "scenarios.json"
#: With memory (the agent as users run it) and without (no setup, memory emptied before each session).
CONDITIONS = ("memory", "no-memory")


def check_served(settings: Settings) -> None:
    """Refuse to evaluate under a model name the endpoint does not serve: llama.cpp's server answers any name with
    its one model, and the report would credit the wrong model."""
    client = llm_client(settings)
    if client is None:
        raise LLMError(not_configured_message())
    try:
        served = [model.id for model in client.models.list()]
    except openai.APIError as exc:
        raise LLMError(f"the model endpoint {settings.llm_base_url} does not answer ({exc}): `atlas llm up`") from None
    if settings.llm_model not in served:
        raise LLMError(f"the endpoint serves {', '.join(served) or 'no model'}, not {settings.llm_model}: "
                       f"`atlas llm up --model {settings.llm_model}`, or set ATLAS_LLM_MODEL to what it serves")


def read_scenarios(path: Path = SCENARIOS_PATH, *, ci: bool = False) -> dict:
    """The scenarios file; with `ci`, only the first scenario of each kind (`atlas eval agent --ci`)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if ci:
        data["scenarios"] = list({s["kind"]: s for s in reversed(data["scenarios"])}.values())[::-1]
    return data


def memories(store: Store, user_id: str) -> list[dict]:
    """Every memory of the user, superseded ones included, in id order (service credential)."""
    store.es.indices.refresh(index=store.indices)
    hits = store.es.search(index=store.indices, query={"term": {"user_id": user_id}}, size=1000,
                           source_excludes=["embedding", "rerank_embedding", "sentences"])["hits"]["hits"]
    return sorted(({"_id": h["_id"], **h["_source"]} for h in hits), key=lambda m: m["_id"])


def clear(store: Store, user_id: str) -> None:
    """Delete the user's memories, keeping their read key (erasure, `atlas users erase`, would revoke it). One
    `_bulk` of deletes: this distribution has no `_delete_by_query`."""
    store.es.indices.refresh(index=store.indices)
    hits = store.es.search(index=store.indices, query={"term": {"user_id": user_id}}, size=1000, source=False)
    deletes = [{"_op_type": "delete", "_index": h["_index"], "_id": h["_id"], "routing": h.get("_routing")}
               for h in hits["hits"]["hits"]]
    helpers.bulk(store.es, deletes, refresh=True)


def holds(words: Sequence[str], texts: Sequence[str]) -> bool:
    return all(any(w.lower() in t.lower() for t in texts) for w in words)


def check_state(checks: Mapping, stored: Sequence[dict]) -> bool | None:
    """The stored-state checks of a scenario (None when it has none)."""
    facts = [m for m in stored if m["memory_type"] == "semantic"]
    current = [m["text"] for m in facts if not m.get("superseded_by")]
    results = []
    if "current" in checks:
        results.append(holds(checks["current"], current))
    if "retired" in checks:
        results.append(not any(w.lower() in t.lower() for w in checks["retired"] for t in current))
    if "forgotten" in checks:
        results.append(not any(w.lower() in m["text"].lower() for w in checks["forgotten"] for m in stored
                               if m["memory_type"] != "episodic"))
    if "contradiction" in checks:
        results.append(any(m.get("contradiction") == checks["contradiction"] and m.get("supersedes")
                           and not m.get("superseded_by") for m in facts))
    if "outcome" in checks:
        field = "success_count" if checks["outcome"] == "success" else "failure_count"
        results.append(any(m["memory_type"] == "procedural" and m.get(field) == 1 for m in stored))
    return all(results) if results else None


def check_reply(checks: Mapping, reply: str) -> bool | None:
    if not {"reply_all", "reply_any", "reply_none"} & set(checks):
        return None
    words = set(re.findall(r"[a-z0-9]+", reply.lower()))

    def said(word: str) -> bool:
        return word.lower() in words if word.isalnum() else word.lower() in reply.lower()

    return all(said(w) for w in checks.get("reply_all", [])) and \
        (any(said(w) for w in checks["reply_any"]) if "reply_any" in checks else True) and \
        not any(said(w) for w in checks.get("reply_none", []))


def run_scenario(store: Store, scenario: Mapping, *, user_id: str, memory: bool) -> dict:
    """One scenario in one condition: its turns' replies and decisions, and which checks held."""
    clear(store, user_id)
    if memory:
        for item in scenario["setup"]:
            fields = {k: v for k, v in item.items() if k not in ("text", "memory_type")}
            write_memory(store, user_id, item["text"], item["memory_type"], **fields)
    turns = []
    for number, session in enumerate(scenario["sessions"], 1):
        if not memory:
            clear(store, user_id)
        agent = Agent(store, user_id, session_id=f"{scenario['id']}-s{number}")
        for message in session:
            turn = agent.turn(message)
            turns.append({"message": message, "reply": turn.reply,
                          "decisions": [{"task": d.task, "answer": d.answer} for d in turn.decisions],
                          "calls": [{"name": c.name, "error": c.result.is_error} for c in turn.tool_calls]})
    checks = scenario["checks"]
    state = check_state(checks, memories(store, user_id)) if memory else None
    reply = check_reply(checks, turns[-1]["reply"])
    checked = [value for value in (state, reply) if value is not None]
    return {"id": scenario["id"], "kind": scenario["kind"], "state": state, "reply": reply,
            "pass": all(checked) if checked else None, "turns": turns}


def rate(values: Sequence[bool | None]) -> dict[str, Any]:
    """A pass rate over the scenarios that have the check, with its bootstrap interval."""
    scored = [float(v) for v in values if v is not None]
    if not scored:
        return {"n": 0}
    return {"n": len(scored), "rate": sum(scored) / len(scored), "rate_ci": list(bootstrap_ci(scored))}


def summarize(rows: Sequence[dict]) -> dict:
    kinds = sorted({row["kind"] for row in rows})
    return {check: rate([row[check] for row in rows]) for check in ("pass", "state", "reply")} | {
        "by_kind": {kind: rate([row["pass"] for row in rows if row["kind"] == kind]) for kind in kinds}}


def evaluate_agent(store: Store, *, ci: bool = False, path: Path = SCENARIOS_PATH, progress: bool = True) -> dict:
    """Every scenario in both conditions, with the configured model; the report `results.record` takes."""
    started = time.perf_counter()
    check_served(store.settings)
    data = read_scenarios(path, ci=ci)
    user, bystander = data["user"], data["bystander"]
    clear(store, bystander["user"])
    for text in bystander["facts"]:
        write_memory(store, bystander["user"], text, "semantic")
    before = memories(store, bystander["user"])
    rows: dict[str, list[dict]] = {condition: [] for condition in CONDITIONS}
    with tqdm(total=len(data["scenarios"]) * len(CONDITIONS), desc="agent scenarios", disable=not progress) as bar:
        for scenario in data["scenarios"]:
            for condition in CONDITIONS:
                rows[condition].append(run_scenario(store, scenario, user_id=user, memory=condition == "memory"))
                bar.update()
    leaks = int(memories(store, bystander["user"]) != before)
    settings = store.settings
    digest = hashlib.sha256(json.dumps(data["scenarios"], sort_keys=True).encode()).hexdigest()
    return {"dataset": "agent", "questions": len(data["scenarios"]), "conversations": None, "data_sha256": digest,
            "setup": setup(store, "the service credential") | {"model": settings.llm_model,
                                                                 "endpoint": settings.llm_base_url},
            "seconds": time.perf_counter() - started, "leaks": leaks,
            "by_mode": {condition: summarize(found) for condition, found in rows.items()},
            "scenarios": rows}
