"""smallthinker architecture (PowerInfer's SmallThinker 4B-A0.6B, 21B-A3B, built for local devices):
llama's pre-norms and GQA with RoPE in NEOX order, and a mixture of experts in every layer whose
router reads the layer's input (the residual stream before attn_norm, so routing can start
before attention): softmax or sigmoid probabilities (`expert_gating_func` 1 or 2, required),
top k, always normalised; the experts are ReGLU, down(relu(gate x) * up x). With a sliding window
in the metadata llama.cpp sets the window to 4096 tokens on every layer but the first of each
`attention.sliding_window_pattern` (default 4), those with the base `rope.freq_base_swa`, and
every 4th layer runs without RoPE (unless the model has exactly 4 layers, llama.cpp's quirk);
without one, every layer attends fully with RoPE. llama.cpp:
src/models/smallthinker.cpp."""

from __future__ import annotations

from typing import Any

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.lfm2moe import GATING
from edge_infer.models.metadata import MetadataReader

ARCH = "smallthinker"
WINDOW = 4096  # llama.cpp's, whatever the file says
NO_ROPE_STEP = 4  # with sliding windows, layers 0, 4, 8, ... have no RoPE


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    gating = md.get("expert_gating_func", 0)
    if gating not in GATING:
        raise UnsupportedModelError(f"{f.path}: {ARCH}.expert_gating_func = {gating} is not supported (1: softmax, "
                                    "2: sigmoid; llama.cpp aborts without one)")
    experts = dict(md.experts(norm=True), expert_weights_norm=True, expert_gating=GATING[gating],
                   expert_activation="relu", router_on_input=True)
    window: dict[str, Any] = {}
    if md.get("attention.sliding_window", 0) > 0:
        window = dict(sliding_window=WINDOW, swa_layers=md.swa_pattern(n_layers, 4, dense_first=True),
                      # llama.cpp: every layer rotates when the step equals the layer count
                      nope_layers=tuple(n_layers != NO_ROPE_STEP and i % NO_ROPE_STEP == 0 for i in range(n_layers)),
                      rope_base_swa=md.get("rope.freq_base_swa", md.get("rope.freq_base", 10000.0, float), float))
    return llama.config_from_gguf(f, ARCH, rope_neox=True, **experts, **window)
