"""Model architectures: one module per architecture, each with `config_from_gguf(file)`; the
shared decoder block in transformer.py; the backend seam in backend.py."""

from __future__ import annotations

from types import ModuleType

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import (
    apertus,
    ernie4_5,
    ernie4_5_moe,
    exaone4,
    falcon_h1,
    gemma2,
    gemma3,
    gemma3n,
    gemma4,
    glm4,
    gpt_oss,
    granite,
    granitehybrid,
    granitemoe,
    hunyuan_dense,
    lfm2,
    lfm2moe,
    llama,
    nemotron_h,
    olmo2,
    olmoe,
    phi3,
    qwen2,
    qwen2moe,
    qwen2vl,
    qwen3,
    qwen3moe,
    qwen3next,
    qwen35,
    qwen35moe,
    seed_oss,
    smallthinker,
    smollm3,
)
from edge_infer.models.config import ModelConfig
from edge_infer.models.encoder_config import encoder_refusal

ARCHITECTURES: dict[str, ModuleType] = {
    m.ARCH: m
    for m in (llama, qwen2, qwen3, phi3, gemma2, gemma3, olmo2, granite, smollm3, qwen2moe, qwen3moe, olmoe, lfm2,
              lfm2moe, granitehybrid, nemotron_h, falcon_h1, qwen35, qwen35moe,
              qwen3next, granitemoe, ernie4_5, ernie4_5_moe, exaone4, glm4, seed_oss,
              hunyuan_dense, apertus, smallthinker, gpt_oss, gemma4, gemma3n, qwen2vl)
}


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    """The config of a model of any supported architecture; UnsupportedModelError otherwise."""
    arch = f.architecture
    why = encoder_refusal(f)
    if why is not None:
        raise UnsupportedModelError(why)
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{f.path}: architecture {arch!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return ARCHITECTURES[arch].config_from_gguf(f)
