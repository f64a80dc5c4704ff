"""gemma3n architecture (Gemma 3n E2B, E4B: text), as llama.cpp runs it: gemma3's block with an
attention scale of 1 and V RMS-normed per head (no weight), sliding windows on 4 of every 5
layers (or `attention.sliding_window_pattern`'s flags) with their own rope base, and
- AltUp: 4 residual streams, the layer running on a routed prediction of stream 0 and the
  streams corrected by its output (models/altup.py);
- LAuReL: a rank-64 path beside attention, averaged with its residual output;
- a 256-wide per-layer embedding input, added to AltUp's streams 1-3 (models/per_layer_input.py);
- activation sparsity on the first 10 layers: the FFN gate keeps only what exceeds its mean by
  1.645 standard deviations;
- from layer 20 on, no K/V of their own: layers attend over layer 18's (sliding) or 19's (full);
- the logits soft-capped at 30.
llama.cpp hard-codes these sizes (llama-hparams.h, src/models/gemma3n.cpp) and ignores the
metadata keys the converter writes for them; so does edge-infer. Norm weights are stored as they
are used (no +1). Vision and audio towers are other files (mmproj)."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.gemma4 import gemma_block
from edge_infer.models.hybrid_metadata import per_layer
from edge_infer.models.metadata import MetadataReader

ARCH = "gemma3n"
SWA_PERIOD = 5  # layer i slides unless i % 5 == 4
ALTUP_STREAMS, LAUREL_RANK, PER_LAYER_INPUT = 4, 64, 256
KV_LAYERS = 20  # layers from this one on reuse an earlier layer's K/V
SPARSE_LAYERS, SPARSITY_STD = 10, 1.6448533535003662  # the normal distribution's 95th percentile
SOFTCAP = 30.0


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    # llama.cpp sizes every layer's FFN by layer 0's width
    ffn = per_layer(f, ARCH, "feed_forward_length", n_layers)[0]
    return llama.config_from_gguf(
        f,
        ARCH,
        ffn_dim=ffn,
        **gemma_block(md, md.swa_pattern(n_layers, SWA_PERIOD, dense_first=False)),
        final_logit_softcap=SOFTCAP,
        norm_eps=md.get("attention.layer_norm_rms_epsilon", kind=float),
        kv_shared_from=KV_LAYERS if n_layers > KV_LAYERS else 0,
        per_layer_input=PER_LAYER_INPUT,
        altup_streams=ALTUP_STREAMS,
        laurel_rank=LAUREL_RANK,
        sparsity=tuple(SPARSITY_STD if i < SPARSE_LAYERS else 0.0 for i in range(n_layers)),
    )
