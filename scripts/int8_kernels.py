"""Why the int8 nomic is slow on a processor without VNNI: onnxruntime's exact mode, or the processor itself?

    .venv/bin/python scripts/int8_kernels.py [--record]   # about a minute; needs `make setup` (the built nomic)

On x86-64 without VNNI, onnxruntime's uint8 x int8 kernel (AVX2's `vpmaddubsw`) adds two products in a saturating
16-bit lane, so Atlas turns on the exact mode there (`atlas.models.embed.needs_exact_int8`). This script times one
text of 12, 30 and 60 tokens through four graphs, in turn, with Atlas's session options (`session_options`):
fp32; Atlas's int8 with the exact mode on; the same int8 with it off (fast, and wrong where products saturate);
and the int8 graph rebuilt with 7-bit weights (`quantize_per_token(weight_bits=7)`), whose two products always fit
16 bits, so the fast kernel is exact with it. The vectors of the committed persona texts (every 10th memory)
are compared with fp32's. Then it times Atlas's own nomic (`Nomic.embed_queries`) on the benchmark's questions in
batches of 1, 4 and 16: what batching the query embeddings of concurrent recalls would save per query. Prints two
tables and writes `outputs/bench/int8_kernels.json` (with `--record`, `results/bench/int8_kernels.json` too, which
docs/benchmarks.md quotes).
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from tokenizers import Tokenizer

from atlas.config import REPO_ROOT, load_settings
from atlas.models import nomic
from atlas.models.embed import Nomic, needs_exact_int8, session_options
from atlas.research.bench import machine_info, questions
from atlas.research.datasets import read_persona_corpus

TOKENS = (12, 30, 60)
RUNS = 25
BATCHES = (1, 4, 16)


def session(path: Path, *, exact: bool) -> ort.InferenceSession:
    """`path` with Atlas's options, the exact mode set as asked."""
    options = session_options()
    options.add_session_config_entry("session.x64quantprecision", "1" if exact else "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def vectors(model: ort.InferenceSession, tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    """Mean-pooled, L2-normalised vectors, one text at a time."""
    rows = []
    for text in texts:
        ids = np.array([tokenizer.encode(nomic.PASSAGE_PREFIX + text).ids], dtype=np.int64)
        hidden = model.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0].mean(axis=0)
        rows.append(hidden / np.linalg.norm(hidden))
    return np.asarray(rows)


def per_query_ms(runs: int) -> dict[int, float]:
    """{batch size: median ms per query} of Atlas's nomic over the benchmark's questions (no cache)."""
    model, rng = Nomic(), random.Random(7)
    asked = questions(rng, 64)
    out = {}
    for size in BATCHES:
        samples = []
        for _ in range(runs + 2):
            batch = rng.sample(asked, size)
            started = time.perf_counter()
            model.embed_queries(batch)
            samples.append((time.perf_counter() - started) * 1000 / size)
        out[size] = statistics.median(samples[2:])
    return out


def main() -> None:
    folder = nomic.model_dir(load_settings())
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    with tempfile.TemporaryDirectory() as tmp:
        seven = Path(tmp) / "model.w7-token.onnx"
        onnx.save(nomic.quantize_per_token(onnx.load(folder / nomic.VARIANTS["fp32"][0]), weight_bits=7), seven)
        int8 = folder / nomic.VARIANTS["int8"][0]
        graphs = {"fp32": session(folder / nomic.VARIANTS["fp32"][0], exact=False),
                  "int8, exact mode": session(int8, exact=True), "int8, fast kernel": session(int8, exact=False),
                  "7-bit weights, fast kernel": session(seven, exact=False)}
        texts = [doc["text"] for doc in read_persona_corpus()[::10]]
        reference = vectors(graphs["fp32"], tokenizer, texts)
        cosines = {name: (vectors(model, tokenizer, texts) * reference).sum(axis=1) for name, model in graphs.items()}
        filler = tokenizer.encode(" ".join(texts)).ids[1:-1]
        latency: dict[str, dict[int, float]] = {name: {} for name in graphs}
        for length in TOKENS:
            ids = np.array([[*filler[:length], tokenizer.token_to_id("[SEP]")]], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            samples: dict[str, list[float]] = {name: [] for name in graphs}
            for _ in range(RUNS + 3):  # the graphs in turn, so that the machine's load falls on all alike
                for name, model in graphs.items():
                    started = time.perf_counter()
                    model.run(None, feed)
                    samples[name].append((time.perf_counter() - started) * 1000)
            for name, ms in samples.items():
                latency[name][length] = statistics.median(ms[3:])
    exact = needs_exact_int8(platform.machine(), Path("/proc/cpuinfo").read_text())
    result = {"machine": machine_info() | {"machine": platform.machine(), "needs_exact_int8": exact},
              "texts": len(texts), "runs": RUNS, "query_ms_by_batch": per_query_ms(RUNS),
              "graphs": {name: {"ms_by_tokens": latency[name], "cosine_to_fp32": {
                  "min": float(cosines[name].min()), "mean": float(cosines[name].mean())}} for name in graphs}}
    targets = [load_settings().outputs_dir, *([REPO_ROOT / "results"] if "--record" in sys.argv[1:] else [])]
    for folder in targets:
        (folder / "bench").mkdir(parents=True, exist_ok=True)
        (folder / "bench" / "int8_kernels.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['machine']['cpu']}, exact int8 mode {'needed (no VNNI)' if exact else 'not needed'}; "
          f"one text, median of {RUNS} runs (ms); cosine to fp32 over {len(texts)} persona texts\n")
    print("| graph | " + " | ".join(f"{n} tokens" for n in TOKENS) + " | cosine to fp32, least / mean |")
    print("|---|" + "---:|" * (len(TOKENS) + 1))
    for name, graph in result["graphs"].items():
        c = graph["cosine_to_fp32"]
        print(f"| {name} | " + " | ".join(f"{graph['ms_by_tokens'][n]:.1f}" for n in TOKENS)
              + f" | {c['min']:.4f} / {c['mean']:.4f} |")
    print("\n| queries per batch | " + " | ".join(str(n) for n in BATCHES) + " |\n|---|" + "---:|" * len(BATCHES))
    print("| ms per query | " + " | ".join(f"{ms:.1f}" for ms in result["query_ms_by_batch"].values()) + " |")
    print(f"\nwrote int8_kernels.json in {', '.join(str(folder / 'bench') for folder in targets)}")


if __name__ == "__main__":
    main()
