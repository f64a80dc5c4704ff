"""smollm3 architecture (SmolLM3): llama's block, with no RoPE on every fourth layer (layers
3, 7, 11, ...: NoPE), as llama.cpp hard-codes it (the GGUF carries no key for it)."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "smollm3"
NO_ROPE_STEP = 4


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    n_layers = MetadataReader(f, ARCH).get("block_count")
    nope = tuple((i + 1) % NO_ROPE_STEP == 0 for i in range(n_layers))
    return llama.config_from_gguf(f, ARCH, nope_layers=nope)
