"""qwen35 architecture (Qwen3.5 dense: 0.8B, 2B, 4B, 9B, 27B): three Gated DeltaNet blocks to
every gated full-attention layer. A DeltaNet block projects q, k, v (attn_qkv), runs a causal
convolution with silu over them, then the gated delta rule per value head (q and k
l2-normalised, key heads repeated across value heads, a per-head decay exp(softplus(alpha +
dt_bias) * a) and write strength sigmoid(beta)), an RMSNorm per head times silu(z) (attn_gate),
and ssm_out. The attention layers' Q projection holds [q | gate] per head: QK RMSNorm per head,
RoPE on the first rope.dimension_count dims (interleaved M-RoPE, which for text is NEOX order
with every section at the token's position; a pair left to the 4th section stays unrotated),
attention times sigmoid(gate). Every layer's FFN (SwiGLU) is pre-normed by
post_attention_norm. Which layers recur: `attention.recurrent_layers`, else every layer but each
`full_attention_interval`-th (4). Multi-token-prediction layers (`nextn_predict_layers`) are
not run, as llama.cpp's main pass does not. llama.cpp: src/models/qwen35.cpp, delta-net-base.cpp."""

from __future__ import annotations

import math

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "qwen35"


def recurrent_layers(f: GGUFFile, md: MetadataReader, n_layers: int) -> tuple[bool, ...]:
    flags = f.metadata.get(f"{md.arch}.attention.recurrent_layers")
    if isinstance(flags, list):
        if len(flags) < n_layers:
            raise UnsupportedModelError(f"{f.path}: {md.arch}.attention.recurrent_layers has {len(flags)} entries for "
                                        f"{n_layers} layers")
        return tuple(bool(x) for x in flags[:n_layers])
    interval = md.get("full_attention_interval", 4)
    if interval < 1:
        raise UnsupportedModelError(f"{f.path}: {md.arch}.full_attention_interval must be positive, got {interval}")
    return tuple((i + 1) % interval != 0 for i in range(n_layers))


def unrotated_pairs(sections: list[int], n_pairs: int) -> tuple[float, ...]:
    """Interleaved M-RoPE's pairs: rotated (divisor 1) when their sector belongs to the t, h or w
    section (all at the token's position for text), unrotated (divisor inf: llama.cpp gives the
    4th section position 0) otherwise; () when every pair rotates."""
    t, h, w = sections[0], sections[1], sections[2]
    period = max(1, sum(sections[:4]))  # ggml's sector: the pair's index modulo the sections' sum
    out = []
    for pair in range(n_pairs):
        sector = pair % period
        kept = (sector % 3 == 1 and sector < 3 * h) or (sector % 3 == 2 and sector < 3 * w) or \
            (sector % 3 == 0 and sector < 3 * t)
        out.append(1.0 if kept else math.inf)
    return () if all(x == 1.0 for x in out) else tuple(out)


def config_from_gguf(f: GGUFFile, arch: str = ARCH, **overrides: object) -> ModelConfig:
    """qwen35's reader; qwen35moe passes its experts as overrides."""
    md = MetadataReader(f, arch)
    n_layers = md.get("block_count") - md.get("nextn_predict_layers", 0)
    if n_layers < 1:
        raise UnsupportedModelError(f"{f.path}: {arch} has no layers besides its multi-token-prediction ones")
    d_model, n_heads = md.get("embedding_length"), md.get("attention.head_count")
    head_dim = md.get("attention.key_length", d_model // n_heads)
    n_rot = md.get("rope.dimension_count", head_dim)
    sections = f.metadata.get(f"{arch}.rope.dimension_sections")  # qwen3next: none, NEOX order
    if arch != "qwen3next" and (not isinstance(sections, list) or len(sections) < 3):
        raise UnsupportedModelError(f"{f.path}: {arch}.rope.dimension_sections must hold 4 integers, got {sections!r}")
    state, v_heads = md.get("ssm.state_size"), md.get("ssm.time_step_rank")
    inner = md.get("ssm.inner_size")
    if inner != state * v_heads:
        raise UnsupportedModelError(f"{f.path}: {arch}.ssm.inner_size {inner} must be ssm.time_step_rank {v_heads} "
                                    f"value heads of ssm.state_size {state}")
    return llama.config_from_gguf(
        f,
        arch,
        rope_neox=True,
        qk_norm=True,
        rope_freqs=unrotated_pairs(sections, n_rot // 2) if sections is not None else (),
        attn_output_gate=True,
        ffn_norm_tensor="post_attention_norm",
        delta_layers=recurrent_layers(f, md, n_layers),
        ssm_conv_kernel=md.get("ssm.conv_kernel"),
        ssm_inner=inner,
        ssm_state=state,
        ssm_heads=v_heads,
        ssm_groups=md.get("ssm.group_count"),
        n_layers=n_layers,
        swa_layers=(False,) * n_layers,
        ignored_tensors=tuple(f"blk.{i}.*" for i in range(n_layers, md.get("block_count"))),
        **overrides,
    )
