"""The two llama.cpp runtimes that install from PyPI here, on the same GGUF files: llama-cpp-python (what Atlas serves)
and GPT4All's Python bindings (prebuilt wheels with an older llama.cpp, no compiler needed).

    pip install --target /tmp/gpt4all --no-deps gpt4all==2.8.2
    PYTHONPATH=/tmp/gpt4all:. .venv/bin/python scripts/llm_runtimes.py [--record]

Each local model (`atlas.ops.llm_server.LOCAL_MODELS`) is loaded by each runtime in a process of its own (each bundles
its own libllama) on 2 threads, and asked for a reply of at most `MAX_TOKENS` tokens, at temperature 0, to the first
user message of each of `MESSAGES` agent scenarios. Recorded per pair: whether the model loads (else the runtime's own
error line), the load seconds, the median seconds per reply and the generated tokens per second (generated tokens
over the replies' wall time, prompt processing included). Prints the table and writes `outputs/bench/llm_runtimes.json`
(`--record`: `results/bench/llm_runtimes.json`, which docs/llm.md quotes), with the machine and its load average. Run
it on an idle machine: both runtimes share the two cores with anything else.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from atlas import constants as C
from atlas.config import load_settings
from atlas.ops import llm_server
from atlas.research.bench import machine_info
from atlas.research.llm_bench import bench_messages, runtime_table

MAX_TOKENS = 64
MESSAGES = 12
RUNTIMES = ("llama-cpp-python", "gpt4all")


def replies_llama_cpp(path: Path, messages: list[str]) -> tuple[float, list[tuple[float, int]]]:
    from llama_cpp import Llama

    started = time.perf_counter()
    llm = Llama(model_path=str(path), n_ctx=C.LLM_CONTEXT, n_threads=2, verbose=False)
    loaded = time.perf_counter() - started
    timed = []
    for message in messages:
        started = time.perf_counter()
        out = llm.create_chat_completion(messages=[{"role": "user", "content": message}], max_tokens=MAX_TOKENS,
                                         temperature=0)
        assert isinstance(out, dict)  # not streamed
        timed.append((time.perf_counter() - started, int(out["usage"]["completion_tokens"])))
    return loaded, timed


def replies_gpt4all(path: Path, messages: list[str]) -> tuple[float, list[tuple[float, int]]]:
    from gpt4all import GPT4All  # not a dependency of Atlas: installed apart, as the docstring says

    started = time.perf_counter()
    model = GPT4All(path.name, model_path=str(path.parent), allow_download=False, device="cpu", n_ctx=C.LLM_CONTEXT,
                    n_threads=2)  # raises "Model not loaded" when the runtime cannot read the file
    loaded = time.perf_counter() - started
    timed = []
    for message in messages:
        tokens = 0

        def count(token_id: int, piece: str) -> bool:
            nonlocal tokens
            tokens += 1
            return True

        with model.chat_session():
            started = time.perf_counter()
            model.generate(message, max_tokens=MAX_TOKENS, temp=0, callback=count)
        timed.append((time.perf_counter() - started, tokens))
    return loaded, timed


def child(runtime: str, path: Path) -> None:
    """One runtime on one model, in this process: its numbers as one JSON line on stdout."""
    run = replies_llama_cpp if runtime == "llama-cpp-python" else replies_gpt4all
    loaded, timed = run(path, bench_messages(MESSAGES))
    print(json.dumps({"loads": True, "load_s": round(loaded, 2),
                      "reply_s_median": round(statistics.median(s for s, _ in timed), 2),
                      "generation_tokens_per_s": round(sum(n for _, n in timed) / sum(s for s, _ in timed), 1),
                      "tokens": sum(n for _, n in timed)}))


def measure(runtime: str, path: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, runtime, str(path)], capture_output=True, text=True)
    if done.returncode == 0:
        return json.loads(done.stdout.strip().splitlines()[-1])
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower() and "cuda" not in line.lower()]
    return {"loads": False, "error": errors[0].strip() if errors else done.stderr.strip()[-300:]}


def main(*, record: bool) -> None:
    settings = load_settings()
    results = {name: {runtime: measure(runtime, llm_server.fetch_model(settings, name)) for runtime in RUNTIMES}
               for name in llm_server.LOCAL_MODELS}
    report = {"machine": machine_info(), "load_average": os.getloadavg()[0], "messages": MESSAGES,
              "max_tokens": MAX_TOKENS, "results": results}
    target = Path("results" if record else "outputs") / "bench" / "llm_runtimes.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2) + "\n")
    print(runtime_table(report).to_markdown(), f"\nwritten: {target}", sep="\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in RUNTIMES:
        child(sys.argv[1], Path(sys.argv[2]))
    else:
        main(record=sys.argv[1:] == ["--record"])
