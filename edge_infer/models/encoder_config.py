"""EncoderConfig: the hyper-parameters of a bidirectional encoder (BERT and its kin) read from
GGUF metadata, as llama.cpp's src/models/bert.cpp, nomic-bert.cpp, jina-bert-v2.cpp,
modern-bert.cpp and gemma-embedding.cpp read them.

Three variants of one post-norm block (encoder.py computes them):
- `bert`: learned positions, GELU FFN (up, GELU, down, with biases);
- `nomic-bert`: RoPE (NEOX order) instead of learned positions, a SwiGLU FFN without biases;
- `jina-bert-v2`: ALiBi instead of positions, a GELU-gated FFN (or GeGLU from one fused up
  matrix), optional LayerNorms of Q and K and a second norm after attention.
Two pre-norm blocks with RoPE and symmetric sliding windows on some layers (encoder_prenorm.py):
- `modern-bert`: LayerNorms without biases, fused QKV, GeGLU (or SwiGLU) from a fused up matrix,
  a final norm; its rank head pools by mean (classifier.pooling_type) with a GELU and a norm;
- `gemma-embedding` (EmbeddingGemma): gemma3's block (RMSNorms before and after attention and
  the FFN, per-head Q/K RMSNorms, GELU-gated FFN, embeddings scaled by sqrt(width)); optional
  sentence-transformers dense layers after pooling.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models.metadata import MetadataReader

log = logging.getLogger("edge_infer.models")

ENCODER_ARCHS = ("bert", "nomic-bert", "jina-bert-v2", "modern-bert", "gemma-embedding")
PRE_NORM = ("modern-bert", "gemma-embedding")
POSITIONS = {"bert": "learned", "nomic-bert": "rope", "jina-bert-v2": "alibi", "modern-bert": "rope",
             "gemma-embedding": "rope"}
FFNS = {"bert": "gelu", "nomic-bert": "swiglu", "jina-bert-v2": "gelu_gated", "modern-bert": "gelu_gated",
        "gemma-embedding": "gelu_gated"}
# llama.cpp's LLM_FFN_OP_TYPES_FROM_STRING; any other name falls back to GeGLU there, and here
MODERN_BERT_ACTS = {"gelu": "gelu_gated", "geglu": "gelu_gated", "silu": "swiglu", "swish": "swiglu",
                    "swiglu": "swiglu", "relu": "reglu", "reglu": "reglu"}
JINA_ALIBI_MAX_BIAS = 8.0  # llama.cpp sets it for jina-bert-v2 whatever the file says


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """One encoder's shapes and switches. positions: "learned" | "rope" | "alibi"; ffn: "gelu"
    (bert), "swiglu" (nomic-bert), "gelu_gated" (jina-bert-v2), "reglu" (a ReLU modern-bert); pooling: llama.cpp's
    pooling_type name ("none", "mean", "cls", "last", "rank"); n_cls_out: the rank head's
    outputs (classifier labels). Pre-norm blocks: `norm` "layer" | "rms"; `swa_layers[i]`:
    layer i attends within a symmetric window (|i - j| <= sliding_window // 2) and rotates with
    rope_base_swa; embed_scale multiplies the token embeddings; the rank head pools by
    cls_pooling and applies cls_act ("tanh" | "gelu")."""

    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    norm_eps: float
    positions: str
    ffn: str
    n_token_types: int
    pooling: str
    n_cls_out: int = 1
    rope_base: float = 10000.0
    n_rot: int = 0
    alibi_max_bias: float = 0.0
    block: str = "post_norm"
    norm: str = "layer"
    swa_layers: tuple[bool, ...] = ()
    sliding_window: int = 0
    rope_base_swa: float = 10000.0
    embed_scale: float = 1.0
    cls_pooling: str = "cls"
    cls_act: str = "tanh"

    def __post_init__(self) -> None:
        if self.positions not in ("learned", "rope", "alibi"):
            raise UnsupportedModelError(f"{self.arch}: unknown position kind {self.positions!r}")
        if self.n_heads % self.n_kv_heads or (self.block == "post_norm" and self.d_model != self.n_heads * self.head_dim):
            raise UnsupportedModelError(f"{self.arch}: {self.n_heads} heads of {self.head_dim} do not make a width of "
                                        f"{self.d_model} with {self.n_kv_heads} KV heads")
        if self.positions == "rope" and not 0 < self.n_rot <= self.head_dim:
            raise UnsupportedModelError(f"{self.arch}: rope dimension count {self.n_rot} outside 1..{self.head_dim}")

    def layer_window(self, i: int) -> int:
        """Layer i's symmetric window in tokens (0: the whole input)."""
        return self.sliding_window if self.swa_layers and self.swa_layers[i] else 0

    def layer_rope_base(self, i: int) -> float:
        return self.rope_base_swa if self.swa_layers and self.swa_layers[i] else self.rope_base

    @property
    def encoder(self) -> bool:
        """Always True: what tells an encoder's config from a decoder's ModelConfig."""
        return True

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


def is_encoder(f: GGUFFile) -> bool:
    return f.architecture in ENCODER_ARCHS


def encoder_refusal(f: GGUFFile) -> str | None:
    """What a generating path says to an encoder's file (None for any other model)."""
    if not is_encoder(f):
        return None
    return (f"{f.path}: {f.architecture} is an encoder: it computes embeddings and rerank scores (LLM.embed, "
            "LLM.rerank, /v1/embeddings, /v1/rerank; benchmarks/bench_embeddings.py times it), it does not "
            "generate text")


def encoder_config_from_gguf(f: GGUFFile) -> EncoderConfig:
    """The config of a bert, nomic-bert or jina-bert-v2 file (UnsupportedModelError naming the
    key otherwise)."""
    arch = f.architecture
    if arch not in ENCODER_ARCHS:
        raise UnsupportedModelError(f"{f.path}: architecture {arch!r} is not an encoder ({', '.join(ENCODER_ARCHS)})")
    r = MetadataReader(f, arch)
    if r.get("attention.causal", False, kind=bool):
        raise UnsupportedModelError(f"{f.path}: {arch}.attention.causal is true: a causal {arch} is not supported")
    d, n_heads = r.get("embedding_length"), r.get("attention.head_count")
    head_dim = r.get("attention.key_length", 0) if arch == "gemma-embedding" else 0
    if not head_dim and d % n_heads:
        raise UnsupportedModelError(f"{f.path}: {arch}.embedding_length {d} is not a multiple of head_count {n_heads}")
    head_dim = head_dim or d // n_heads
    n_types = r.get("tokenizer.ggml.token_type_count", 0)
    if n_types == 0 and arch in ("bert", "nomic-bert"):
        raise UnsupportedModelError(f"{f.path}: an {arch} model needs tokenizer.ggml.token_type_count (llama.cpp "
                                    "refuses it too)")
    labels = f.metadata.get(f"{arch}.classifier.output_labels")
    rope = POSITIONS[arch] == "rope"
    n_layers = r.get("block_count")
    common: dict[str, Any] = dict(
        arch=arch, n_layers=n_layers, d_model=d, n_heads=n_heads,
        n_kv_heads=r.get("attention.head_count_kv", n_heads), head_dim=head_dim,
        ffn_dim=r.get("feed_forward_length"), vocab_size=r.vocab_size(), context_length=r.get("context_length"),
        positions=POSITIONS[arch], ffn=FFNS[arch], n_token_types=n_types, pooling=r.pooling_or("none"),
        n_cls_out=len(labels) if isinstance(labels, list) and labels else 1,
        rope_base=r.get("rope.freq_base", 10000.0, kind=float) if rope else 10000.0,
        n_rot=r.get("rope.dimension_count", head_dim) if rope else 0,
        alibi_max_bias=JINA_ALIBI_MAX_BIAS if arch == "jina-bert-v2" else 0.0,
    )
    if arch not in PRE_NORM:
        return EncoderConfig(norm_eps=r.get("attention.layer_norm_epsilon", kind=float), **common)
    return _pre_norm(f, r, arch, n_layers, common)


def _pre_norm(f: GGUFFile, r: MetadataReader, arch: str, n_layers: int, common: dict[str, Any]) -> EncoderConfig:
    """modern-bert's and gemma-embedding's switches (their load_arch_hparams)."""
    gemma = arch == "gemma-embedding"
    window = r.get("attention.sliding_window", ... if gemma else 0)
    swa = r.swa_pattern(n_layers, 6, False) if gemma else r.swa_pattern(n_layers, 3, True) if window > 0 else ()
    ffn = FFNS[arch]
    act = f.metadata.get(f"{arch}.hidden_activation")
    if not gemma and isinstance(act, str):
        if act not in MODERN_BERT_ACTS:  # e.g. gelu_pytorch_tanh: GeGLU, as llama.cpp computes it
            log.warning("%s: %s.hidden_activation %r: computing GeGLU, as llama.cpp does", f.path, arch, act)
        ffn = MODERN_BERT_ACTS.get(act, "gelu_gated")
    cls_pool = r.get("classifier.pooling_type", 1)
    if cls_pool not in (1, 2):
        raise UnsupportedModelError(f"{f.path}: {arch}.classifier.pooling_type {cls_pool} is not mean (1) or cls (2)")
    d = int(common["d_model"])
    return EncoderConfig(
        **{**common, "ffn": ffn},
        norm_eps=r.get("attention.layer_norm_rms_epsilon" if gemma else "attention.layer_norm_epsilon", kind=float),
        block="pre_norm", norm="rms" if gemma else "layer", swa_layers=swa, sliding_window=window,
        rope_base_swa=r.get("rope.freq_base_swa", 10000.0, kind=float), embed_scale=d**0.5 if gemma else 1.0,
        cls_pooling="mean" if cls_pool == 1 else "cls", cls_act="tanh" if gemma else "gelu",
    )
