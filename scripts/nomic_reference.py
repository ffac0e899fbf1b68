"""The hand-built nomic graph against an independent runtime: GPT4All's llama.cpp, on the same GGUF file.

    pip install --target /tmp/gpt4all --no-deps gpt4all==2.8.2
    PYTHONPATH=/tmp/gpt4all:. .venv/bin/python scripts/nomic_reference.py

`atlas.models.nomic` reads the GGUF's tensors and writes its own ONNX graph; its unit test compares that graph
with a numpy forward pass written alongside it, so a misreading shared by both would pass. GPT4All (MIT) ships
llama.cpp's BERT/nomic-bert implementation in its wheel (`Embed4All`), which reads the same file by its own
code. The texts are committed: every 10th persona memory as a passage, every 20th persona question as a query,
each with nomic's task prefix. Prints and writes `outputs/nomic_reference.json`: per precision of Atlas's graph
(fp32, int8), the least and mean cosine with GPT4All's vectors.
"""

from __future__ import annotations

import json
import os

import numpy as np
from gpt4all import Embed4All  # not a dependency of Atlas: installed apart, as the docstring says

from atlas.config import load_settings
from atlas.models.embed import Nomic
from atlas.models.nomic import MEMBER, model_dir
from atlas.research.datasets import read_persona_corpus
from atlas.research.evaluate import persona_questions


def texts() -> dict[str, list[str]]:
    """The committed texts compared: passages and queries."""
    return {"passage": [doc["text"] for doc in read_persona_corpus()[::10]],
            "query": [q.query for q in persona_questions()[::20]]}


def reference(kind_texts: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """GPT4All's vectors, L2-normalised, with nomic's task prefixes (`search_document`, `search_query`)."""
    folder = model_dir(load_settings())
    with Embed4All(MEMBER.rsplit("/", 1)[1], model_path=str(folder), allow_download=False, device="cpu") as model:
        out = {}
        for kind, items in kind_texts.items():
            prefix = "search_document" if kind == "passage" else "search_query"
            rows = np.asarray(model.embed(items, prefix=prefix, long_text_mode="truncate"), dtype=np.float32)
            out[kind] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        return out


def main() -> None:
    compared = texts()
    expected = reference(compared)
    report: dict = {"texts": {kind: len(items) for kind, items in compared.items()}, "runtime": "gpt4all 2.8.2",
                    "loadavg": os.getloadavg(), "cosine": {}}
    for precision in ("fp32", "int8"):
        model = Nomic(precision=precision)
        ours = {"passage": model.embed_passages(compared["passage"]), "query": model.embed_queries(compared["query"])}
        cosines = np.concatenate([np.sum(ours[kind] * expected[kind], axis=1) for kind in compared])
        report["cosine"][precision] = {"min": float(cosines.min()), "mean": float(cosines.mean())}
        print(f"{precision}: {len(cosines)} texts, cosine with GPT4All min {cosines.min():.5f} "
              f"mean {cosines.mean():.5f}")
    path = load_settings().outputs_dir / "nomic_reference.json"
    path.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
