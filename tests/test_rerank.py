"""The second-stage back ends (issue 3): how each one's scores enter the final order.

The HTTP stage talks to a real local server; the cross-encoder stage gets a stand-in for the
optional sentence-transformers package, which the project does not install.
"""

from __future__ import annotations

import json
import sys
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from atlas.errors import EmbeddingError
from atlas.rerank import CrossEncoderStage, HttpRerankStage, combine, load_second_stage

TEXTS = ["hub reset steps", "router reboot", "nursery quiet hours"]


def test_combine_weighs_any_scale_alike():
    rrf = np.array([1 / 31, 1 / 32, 1 / 33])
    logits = np.array([-4.0, 9.0, 2.5])
    assert np.allclose(combine(rrf, logits, 1.0), combine(rrf, logits / 100 + 0.5, 1.0))
    assert np.argmax(combine(rrf, logits, 1.0)) == 1, "a decisive second stage reorders the pool"
    assert np.argmax(combine(rrf, logits, 10.0)) == 0, "a heavy fusion weight keeps the fused order"


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[dict]]]:
    """A rerank server that scores documents by length and records what it was sent."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            if self.path.endswith("/broken"):
                self.send_response(500)
                self.end_headers()
                return
            documents = body.get("documents") or body.get("input")
            scored = [{"index": i, "relevance_score": len(doc) / 100} for i, doc in enumerate(documents)]
            key = "rerank" if self.path.startswith("/_inference") else "results"
            payload = json.dumps({key: scored[:2] if self.path.endswith("/top2") else scored}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", received
    server.shutdown()


def test_http_stage_cohere_style(endpoint):
    base, received = endpoint
    stage = HttpRerankStage(f"{base}/v1/rerank", model="rerank-test", api_key="secret")
    scores = stage.scores("reset", TEXTS, None)
    assert scores.tolist() == pytest.approx([len(t) / 100 for t in TEXTS])
    assert received[0]["body"] == {"query": "reset", "documents": TEXTS, "model": "rerank-test"}
    assert received[0]["auth"] == "Bearer secret"


def test_http_stage_elasticsearch_inference_body(endpoint):
    base, received = endpoint
    scores = HttpRerankStage(f"{base}/_inference/rerank/my-model").scores("reset", TEXTS, None)
    assert received[0]["body"] == {"query": "reset", "input": TEXTS}
    assert scores.tolist() == pytest.approx([len(t) / 100 for t in TEXTS])


def test_http_stage_gives_left_out_documents_the_lowest_score(endpoint):
    base, _ = endpoint
    scores = HttpRerankStage(f"{base}/v1/rerank/top2").scores("reset", TEXTS, None)
    assert scores[2] == min(scores[:2]) and np.isfinite(scores).all()


def test_http_stage_failure_is_a_clear_error(endpoint):
    base, _ = endpoint
    with pytest.raises(EmbeddingError, match="rerank endpoint .*/broken failed"):
        HttpRerankStage(f"{base}/v1/broken").scores("reset", TEXTS, None)


def test_cross_encoder_is_loaded_once(monkeypatch):
    loads: list[str] = []

    class CrossEncoder:
        def __init__(self, path: str, local_files_only: bool) -> None:
            assert local_files_only, "weights must never be fetched at run time"
            loads.append(path)

        def predict(self, pairs):
            return [len(text) for _, text in pairs]

    monkeypatch.setitem(sys.modules, "sentence_transformers", types.SimpleNamespace(CrossEncoder=CrossEncoder))
    stage = load_second_stage("cross-encoder:/models/ce")
    assert isinstance(stage, CrossEncoderStage) and stage.name == "cross-encoder:/models/ce"
    for _ in range(3):
        assert stage.scores("q", TEXTS, None).tolist() == [len(t) for t in TEXTS]
    assert loads == ["/models/ce"]


def test_cross_encoder_without_the_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(EmbeddingError, match="pip install sentence-transformers"):
        load_second_stage("cross-encoder:/models/ce").scores("q", TEXTS, None)


def test_second_stage_specs():
    assert load_second_stage(None) is None and load_second_stage("none") is None
    stage = load_second_stage("https://rerank.example/v1/rerank#rerank-v3")
    assert isinstance(stage, HttpRerankStage) and (stage.url, stage.model) == ("https://rerank.example/v1/rerank",
                                                                                "rerank-v3")
