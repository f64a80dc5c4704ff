"""qwen2vl architecture (the text models of Qwen2-VL and Qwen2.5-VL): qwen2's block (Q, K and V
biases, NEOX RoPE) with M-RoPE: `rope.dimension_sections` splits the rotated pairs into t, h, w
(and e) sections, each rotated by its own component of the token's position. A text token's
components are all its position, so text alone rotates exactly as qwen2; an image of a
qwen2.5vl projector gives its tokens (t, row, column) positions and advances the text position
by max(rows, columns) (engine/mrope.py, models/rope.py's MRope). llama.cpp:
src/models/qwen2vl.cpp."""

from __future__ import annotations

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig

ARCH = "qwen2vl"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    sections = f.metadata.get(f"{ARCH}.rope.dimension_sections")
    if not isinstance(sections, list) or not 3 <= len(sections) <= 4 or \
            not all(isinstance(s, int) and not isinstance(s, bool) for s in sections):
        raise UnsupportedModelError(f"{f.path}: {ARCH}.rope.dimension_sections must hold 4 integers, got {sections!r}")
    return llama.config_from_gguf(f, ARCH, rope_neox=True, qkv_bias=True,
                                  rope_sections=tuple(sections) + (0,) * (4 - len(sections)))
