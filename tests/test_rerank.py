"""The second-stage back ends (issue 3): how each one's scores enter the final order.

The HTTP stage talks to a real local server (pytest-httpserver); the cross-encoder stage gets a stand-in for the
optional sentence-transformers package, which the project does not install.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from pytest_httpserver import HTTPServer

from atlas.core.errors import EmbeddingError
from atlas.core.fusion import combine
from atlas.models.rerank import CrossEncoderStage, HttpRerankStage, load_second_stage

TEXTS = ["hub reset steps", "router reboot", "nursery quiet hours"]
#: An answer in relevance order, as rerank servers give it: the third text best.
RANKED = [{"index": 2, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.5},
          {"index": 1, "relevance_score": 0.1}]


def test_combine_weighs_any_scale_alike():
    rrf = np.array([1 / 31, 1 / 32, 1 / 33])
    logits = np.array([-4.0, 9.0, 2.5])
    assert np.allclose(combine(rrf, logits, rrf_weight=1.0), combine(rrf, logits / 100 + 0.5, rrf_weight=1.0))
    assert np.argmax(combine(rrf, logits, rrf_weight=1.0)) == 1, "a decisive second stage reorders the pool"
    assert np.argmax(combine(rrf, logits, rrf_weight=10.0)) == 0, "a heavy fusion weight keeps the fused order"


def test_http_stage_cohere_style(httpserver: HTTPServer):
    httpserver.expect_request("/v1/rerank", method="POST", headers={"Authorization": "Bearer secret"},
                              json={"query": "reset", "documents": TEXTS, "model": "rerank-test"},
                              ).respond_with_json({"results": RANKED})
    stage = HttpRerankStage(httpserver.url_for("/v1/rerank"), model="rerank-test", api_key="secret")
    assert stage.scores("reset", TEXTS, None).tolist() == pytest.approx([0.5, 0.1, 0.9])


def test_http_stage_elasticsearch_inference_body(httpserver: HTTPServer):
    httpserver.expect_request("/_inference/rerank/my-model", method="POST",
                              json={"query": "reset", "input": TEXTS}).respond_with_json({"rerank": RANKED})
    scores = HttpRerankStage(httpserver.url_for("/_inference/rerank/my-model")).scores("reset", TEXTS, None)
    assert scores.tolist() == pytest.approx([0.5, 0.1, 0.9])


def test_http_stage_gives_left_out_documents_the_lowest_score(httpserver: HTTPServer):
    httpserver.expect_request("/v1/rerank").respond_with_json({"results": RANKED[:2]})  # a top_n cut
    scores = HttpRerankStage(httpserver.url_for("/v1/rerank")).scores("reset", TEXTS, None)
    assert scores.tolist() == pytest.approx([0.5, 0.5, 0.9])


def test_http_stage_failure_is_a_clear_error(httpserver: HTTPServer):
    httpserver.expect_request("/v1/broken").respond_with_data("model exploded", status=500)
    with pytest.raises(EmbeddingError, match="rerank endpoint .*/broken failed"):
        HttpRerankStage(httpserver.url_for("/v1/broken")).scores("reset", TEXTS, None)


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
