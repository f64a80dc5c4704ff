"""POST /v1/embeddings: unit-norm embeddings of one or several inputs (texts or token ids),
batched through the engine (engine/embedding.py), as float lists or base64 (little-endian
float32, OpenAI's encoding). `dimensions` other than the model's width is refused: a decoder's
hidden state cannot be truncated meaningfully (only Matryoshka-trained models allow it)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from edge_infer.errors import EdgeInferError
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.errors import APIError, from_engine_error
from edge_infer.server.protocol import EmbeddingRequest

ENCODINGS = ("float", "base64")


async def create_embeddings(req: EmbeddingRequest, engine: AsyncEngine, model: str) -> dict[str, Any]:
    fmt = req.encoding_format or "float"
    if fmt not in ENCODINGS:
        raise APIError(400, f"encoding_format must be float or base64, got {fmt!r}", param="encoding_format",
                       code="invalid_value")
    items = req.inputs()
    worker = engine.worker
    if worker is None or worker.engine is None:
        raise APIError(503, "the engine is not running", code="shutting_down")
    eng = worker.engine
    width = eng.model_config.d_model
    if req.dimensions is not None and req.dimensions != width:
        raise APIError(400, f"dimensions: this model's embeddings have {width} dimensions and cannot be "
                       f"shortened to {req.dimensions}", param="dimensions", code="invalid_value")
    try:
        ids = await engine.run(lambda: [eng.embed_ids(x) for x in items])  # tokenized off the engine thread
        vectors: np.ndarray = await engine.call(lambda e: e.embed(ids))
    except EdgeInferError as e:
        raise from_engine_error(e) from None
    data = []
    for i, v in enumerate(vectors):
        emb: Any = base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else [float(x) for x in v]
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = sum(len(t) for t in ids)
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": n, "total_tokens": n}}
