"""Sane maxima for the counts a GGUF file's metadata declares, checked while the file is read.

A count in the metadata sizes what is built from it (a tuple per layer, a vocabulary's lists
and dicts), so a hostile 400-byte file claiming 2e8 layers, or 4 million empty token texts,
would cost gigabytes before any tensor is looked at. The reader refuses such a file first:
an array of the tokenizer's is refused by its declared length before any element is read,
and an architecture's hyper-parameters are checked against these maxima once the metadata is
in, each failure a GGUFError naming the key. The maxima are far above any real model (llama.cpp
refuses more than LLAMA_MAX_LAYERS = 512 layers; the largest vocabularies have 262144 tokens);
what the tensors must match is checked where the model is built (models/config.py, weights.py).
"""

from __future__ import annotations

from typing import Any

from edge_infer.errors import GGUFError

MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS
MAX_HEADS = 1024  # real models: up to 128
MAX_HEAD_DIM = 4096  # real models: 64..576
MAX_WIDTH = 1 << 20  # embedding and FFN widths; real models: up to ~53k
MAX_EXPERTS = 1024  # real models: up to 512 (llama.cpp's LLAMA_MAX_EXPERTS)
MAX_VOCAB = 1 << 20  # tokens; real vocabularies: up to 262144
MAX_MERGES = 1 << 20  # BPE merges; real vocabularies: up to ~450k

# Arrays whose length sizes the vocabulary: refused by their declared length, before reading.
ARRAY_MAX: dict[str, int] = {
    "tokenizer.ggml.tokens": MAX_VOCAB,
    "tokenizer.ggml.token_type": MAX_VOCAB,
    "tokenizer.ggml.scores": MAX_VOCAB,
    "tokenizer.ggml.merges": MAX_MERGES,
}

# `<arch>.<key>` -> the largest value a model may declare (per layer, where the value is an array).
HPARAM_MAX: dict[str, int] = {
    "block_count": MAX_LAYERS,
    "embedding_length": MAX_WIDTH,
    "feed_forward_length": MAX_WIDTH,
    "expert_feed_forward_length": MAX_WIDTH,
    "expert_shared_feed_forward_length": MAX_WIDTH,
    "attention.head_count": MAX_HEADS,
    "attention.head_count_kv": MAX_HEADS,
    "attention.key_length": MAX_HEAD_DIM,
    "attention.value_length": MAX_HEAD_DIM,
    "rope.dimension_count": MAX_HEAD_DIM,
    "expert_count": MAX_EXPERTS,
    "expert_used_count": MAX_EXPERTS,
    "vocab_size": MAX_VOCAB,
}


def array_limit(key: str) -> int | None:
    """The most elements the metadata array `key` may declare, None for no limit but the file's size."""
    return ARRAY_MAX.get(key)


def check_hparams(metadata: dict[str, Any], path: str) -> None:
    """Refuse an architecture hyper-parameter outside 0..its maximum (or a per-layer array of
    more than MAX_LAYERS values), naming the key; values of other types are left to the
    model's reader, which names what it expected."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return
    for name, top in HPARAM_MAX.items():
        key = f"{arch}.{name}"
        v = metadata.get(key)
        if isinstance(v, list) and len(v) > MAX_LAYERS:
            raise GGUFError(f"{path}: metadata {key!r} has {len(v)} per-layer values, more than {MAX_LAYERS} layers")
        for x in v if isinstance(v, list) else (v,):
            if isinstance(x, int) and not isinstance(x, bool) and not 0 <= x <= top:
                raise GGUFError(f"{path}: metadata {key!r} = {x} is outside 0..{top}: not a model edge-infer can load")
