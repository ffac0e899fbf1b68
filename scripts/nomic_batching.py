"""Two int8 builds of nomic side by side: quantized per batch (onnxruntime's dynamic quantization, the default
until 2026-12-02) and per token (`atlas.models.nomic.quantize_per_token`, the default since).

    .venv/bin/python scripts/nomic_batching.py

The per-batch model is rebuilt from the fp32 graph into a temporary folder; nothing in the model folder changes.
On every 10th persona memory (the texts of scripts/nomic_reference.py) it measures each build's cosine with the
fp32 graph (texts embedded alone) and between a text embedded alone and in one batch of all of them, then the
passages per second over 384 persona memories at several batch sizes (no cache). Prints a table and writes
`outputs/nomic_batching.json`; docs/benchmarks.md, "Batched ingest", quotes it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from onnxruntime.quantization import QuantType, quantize_dynamic

from atlas.config import load_settings
from atlas.models.embed import Nomic, OnnxEmbedder
from atlas.models.nomic import PASSAGE_PREFIX, model_dir
from atlas.research.datasets import read_persona_corpus

BATCH_SIZES = (1, 4, 8, 16, 32)


def per_batch_model(folder: Path, into: Path) -> OnnxEmbedder:
    """onnxruntime's dynamic quantization of the fp32 graph, as `atlas model build` made it until 2026-12-02."""
    target = into / "model.int8-batch.onnx"
    quantize_dynamic(folder / "model.onnx", target, weight_type=QuantType.QInt8, per_channel=True,
                     op_types_to_quantize=["MatMul"])
    # OnnxEmbedder sees its per-batch quantization and embeds one text at a time, as Atlas had to.
    return OnnxEmbedder(target, folder / "tokenizer.json", "nomic-int8-per-batch", passage_prefix=PASSAGE_PREFIX)


def quality(model: OnnxEmbedder, texts: list[str], reference: np.ndarray) -> dict:
    """Cosine with fp32 (each text alone), and between each text alone and in one batch of all of them."""
    size = model.batch_size
    model.batch_size = 1
    alone = model.embed_passages(texts)
    model.batch_size = len(texts)
    together = model.embed_passages(texts)
    model.batch_size = size
    to_fp32, to_batch = np.sum(alone * reference, axis=1), np.sum(alone * together, axis=1)
    return {"fp32_min": float(to_fp32.min()), "fp32_mean": float(to_fp32.mean()),
            "alone_vs_batch_min": float(to_batch.min())}


def speed(model: OnnxEmbedder, texts: list[str]) -> dict[str, float]:
    """Passages per second at each batch size (a short warm-up first)."""
    size, rates = model.batch_size, {}
    for batch in BATCH_SIZES:
        model.batch_size = batch
        model.embed_passages(texts[:16])
        started = time.perf_counter()
        model.embed_passages(texts)
        rates[str(batch)] = len(texts) / (time.perf_counter() - started)
    model.batch_size = size
    return rates


def main() -> None:
    corpus = [doc["text"] for doc in read_persona_corpus()]
    compared, timed = corpus[::10], corpus[:384]
    reference = Nomic(precision="fp32").embed_passages(compared)
    report: dict = {"texts": len(compared), "timed_texts": len(timed), "loadavg_start": os.getloadavg(), "builds": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for name, model in (("per token (default)", Nomic()), ("per batch", per_batch_model(model_dir(load_settings()),
                                                                                               Path(scratch)))):
            report["builds"][name] = quality(model, compared, reference) | {"passages_per_s": speed(model, timed)}
    report["loadavg_end"] = os.getloadavg()
    print(f"{'int8 build':<20} {'cos fp32 min':>12} {'mean':>7} {'alone/batch min':>16}  "
          + "  ".join(f"b{b:<3} /s" for b in BATCH_SIZES))
    for name, row in report["builds"].items():
        print(f"{name:<20} {row['fp32_min']:>12.5f} {row['fp32_mean']:>7.5f} {row['alone_vs_batch_min']:>16.6f}  "
              + "  ".join(f"{rate:>7.1f}" for rate in row["passages_per_s"].values()))
    path = load_settings().outputs_dir / "nomic_batching.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"load average {report['loadavg_start'][0]:.1f} -> {report['loadavg_end'][0]:.1f}; wrote {path}")


if __name__ == "__main__":
    main()
