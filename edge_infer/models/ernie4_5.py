"""ernie4_5 architecture (Baidu ERNIE 4.5 dense: 0.3B): llama's block with RoPE in the normal pair
order and no rope-factor tensor; the attention output bias the converter may write is loaded by
llama.cpp and never applied, so it is ignored here too. PaddleOCR-VL's M-RoPE variant
(`rope.dimension_sections`) is refused by name. llama.cpp: src/models/ernie4-5.cpp."""

from __future__ import annotations

from typing import Any

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig

ARCH = "ernie4_5"


def config_from_gguf(f: GGUFFile, arch: str = ARCH, **overrides: Any) -> ModelConfig:
    """ernie4_5's reader; ernie4_5-moe passes its experts."""
    if f"{arch}.rope.dimension_sections" in f.metadata:
        raise UnsupportedModelError(f"{f.path}: {arch} with rope.dimension_sections (PaddleOCR-VL's M-RoPE) is not "
                                    "supported")
    return llama.config_from_gguf(f, arch, rope_freqs=(), ignored_tensors=("blk.*.attn_output.bias",), **overrides)
