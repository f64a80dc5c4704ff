"""ernie4_5-moe architecture (Baidu ERNIE 4.5 MoE: 21B-A3B, 300B-A47B): ernie4_5's attention
(models/ernie4_5.py) and, after `leading_dense_block_count` dense layers, a mixture of experts in
every layer: softmax over the router, experts chosen by probability + the selection bias
`exp_probs_b` when the file has it, weighted by the unbiased probability, normalised, plus an
ungated shared expert of `expert_shared_feed_forward_length`. llama.cpp builds MoE layers only
every `interleave_moe_layer_step`-th layer but loads experts for all, so a step other than 1 is
refused by name, as are experts without a gate stack. llama.cpp: src/models/ernie4-5-moe.cpp."""

from __future__ import annotations

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import ernie4_5
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "ernie4_5-moe"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    step, lead = md.get("interleave_moe_layer_step"), md.get("leading_dense_block_count", 0)
    if step != 1:
        raise UnsupportedModelError(f"{f.path}: {ARCH}.interleave_moe_layer_step = {step} is not supported (1: every "
                                    "layer after the leading dense ones is a mixture of experts)")
    first = f"blk.{lead}."
    if first + "ffn_gate_exps.weight" not in f.tensors:
        raise UnsupportedModelError(f"{f.path}: {ARCH} experts without a gate stack ({first}ffn_gate_exps.weight) are "
                                    "not supported")
    shared = md.get("expert_shared_feed_forward_length", 0) > 0
    experts = dict(md.experts(norm=True, shared=shared), expert_weights_norm=True)  # llama.cpp: always normalised
    return ernie4_5.config_from_gguf(f, ARCH, **experts, shared_expert_gated=False, dense_lead=lead,
                                     expert_select_bias=first + "exp_probs_b.bias" in f.tensors)
