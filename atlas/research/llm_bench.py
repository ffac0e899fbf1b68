"""How fast each local model answers the guided turn's questions, and the memory its server holds: `atlas bench-llm`.

Each model of `atlas.ops.llm_server.LOCAL_MODELS` is served in turn (`llm_server.up`) and asked, for the first user
message of each agent scenario (data/agent), the guided turn's fact question (`questions.extract_facts`, a JSON schema
held by a grammar) and a reply in words (`guided.answer`). Measured per model: the wall seconds of each question as
the agent waits for it, prompt and generation tokens per second as llama.cpp itself reports them in the server's
log, and the server's peak resident memory. The model that was served before the run is served again after it.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tqdm.auto import tqdm

from atlas.config import Settings, load_settings, local_llm_url
from atlas.core.recall import RecallResult
from atlas.models.llm import LLMError, llm_client
from atlas.models.questions import Model, extract_facts
from atlas.ops import llm_server
from atlas.reporting import Table
from atlas.research.agent_eval import SCENARIOS_PATH
from atlas.research.bench import machine_info, proc_memory
from atlas.serve.guided import answer

#: llama.cpp's own timing lines: `prompt eval time = 531.47 ms / 71 tokens`, `eval time = 208.07 ms / 10 runs`.
PERF = re.compile(r"^llama_perf_context_print:\s+(prompt eval|eval) time =\s+([\d.]+) ms /\s+(\d+) (?:tokens|runs)",
                  re.MULTILINE)


def bench_messages(count: int) -> list[str]:
    """The first user message of the first `count` agent scenarios."""
    scenarios = json.loads(SCENARIOS_PATH.read_text())["scenarios"]
    return [scenario["sessions"][0][0] for scenario in scenarios[:count]]


def llama_speed(log: str) -> dict[str, float]:
    """Prompt and generation tokens per second over every request in a stretch of the server's log."""
    totals = {"prompt eval": [0.0, 0], "eval": [0.0, 0]}
    for phase, ms, tokens in PERF.findall(log):
        totals[phase][0] += float(ms)
        totals[phase][1] += int(tokens)
    return {f"{key}_tokens_per_s": tokens / (ms / 1000) if ms else 0.0
            for key, (ms, tokens) in (("prompt", totals["prompt eval"]), ("generation", totals["eval"]))}


def bench_model(settings: Settings, name: str, messages: Sequence[str], *, progress: bool) -> dict:
    """Serve `name`, ask both questions of every message, and measure."""
    state = llm_server.up(settings, name=name)
    served = replace(settings, llm_model=name)
    client = llm_client(served)
    if client is None:
        raise LLMError("the local endpoint is not configured")
    model = Model(client, name, served)
    log = llm_server.server_dir(settings) / "llm.log"
    start = log.stat().st_size
    seconds: dict[str, list[float]] = {"extract_facts": [], "answer": []}
    nothing = RecallResult("sarah", "", "hybrid", [], None, None, {}, [])  # the reply as to a new user
    for message in tqdm(messages, desc=name, disable=not progress):
        began = time.perf_counter()
        extract_facts(model, "extract_facts", message, "sarah")
        seconds["extract_facts"].append(time.perf_counter() - began)
        began = time.perf_counter()
        answer(model, [], message, nothing, user_id="sarah")
        seconds["answer"].append(time.perf_counter() - began)
    with open(log, encoding="utf-8", errors="replace") as text:
        text.seek(start)
        speed = llama_speed(text.read())
    peak = proc_memory(state["pid"]).get("VmHWM", 0)
    return {"about": llm_server.local_model(name).about, "questions": len(messages), **speed,
            "peak_rss_mb": peak / 2**20, "gguf_mb": llm_server.model_path(settings, name).stat().st_size / 2**20,
            **{f"{task}_median_s": statistics.median(values) for task, values in seconds.items()}}


def run(*, models: Sequence[str], count: int, progress: bool = True) -> dict:
    """Every model in `models`, on the first message of `count` scenarios; restores the model served before."""
    settings = load_settings()
    if settings.llm_base_url != local_llm_url():
        raise LLMError(f"bench-llm measures the local server; OPENAI_BASE_URL points at {settings.llm_base_url}")
    before = llm_server.status(settings)["serves"]
    messages = bench_messages(count)
    try:
        results = {name: bench_model(settings, name, messages, progress=progress) for name in models}
    finally:
        if before:
            llm_server.up(settings, name=before)
        else:
            llm_server.down(settings)
    return {"machine": machine_info(), "models": results}


def results_path(out_dir: Path) -> Path:
    return out_dir / "bench" / "llm.json"


def write_json(results: dict, out_dir: Path) -> Path:
    path = results_path(out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path


def speed_table(results: dict) -> Table:
    rows = [[name, f"{r['gguf_mb']:.0f}", f"{r['peak_rss_mb']:.0f}", f"{r['prompt_tokens_per_s']:.0f}",
             f"{r['generation_tokens_per_s']:.1f}", f"{r['extract_facts_median_s']:.1f}", f"{r['answer_median_s']:.1f}"]
            for name, r in results["models"].items()]
    machine = results["machine"]
    return Table(["model", "GGUF MB", "server peak RSS MB", "prompt tok/s", "generation tok/s",
                  "fact question s (median)", "reply s (median)"], rows,
                 title=f"Local models on {machine['cores']} cores of {machine['cpu']}, "
                       f"{next(iter(results['models'].values()))['questions']} messages each")


def runtime_table(results: dict) -> Table:
    """`scripts/llm_runtimes.py`'s comparison: each runtime on each local model, or why it cannot load the model."""
    rows = [[name, runtime, f"{r['load_s']:.1f}", r["tokens"], f"{r['generation_tokens_per_s']:.1f}",
             f"{r['reply_s_median']:.2f}", ""] if r["loads"] else [name, runtime, "", "", "", "", r["error"]]
            for name, runtimes in results["results"].items() for runtime, r in runtimes.items()]
    machine = results["machine"]
    return Table(["model", "runtime", "load s", "tokens", "generation tok/s", "reply s (median)", "error"], rows,
                 title=f"Runtimes on {machine['cores']} cores of {machine['cpu']}, {results['messages']} messages, "
                       f"replies of at most {results['max_tokens']} tokens")
