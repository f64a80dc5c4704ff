"""EncoderConfig: the hyper-parameters of a bidirectional encoder (BERT and its kin) read from
GGUF metadata, as llama.cpp's src/models/bert.cpp, nomic-bert.cpp and jina-bert-v2.cpp read them.

Three variants of one post-norm block (encoder.py computes them):
- `bert`: learned positions, GELU FFN (up, GELU, down, with biases);
- `nomic-bert`: RoPE (NEOX order) instead of learned positions, a SwiGLU FFN without biases;
- `jina-bert-v2`: ALiBi instead of positions, a GELU-gated FFN (or GeGLU from one fused up
  matrix), optional LayerNorms of Q and K and a second norm after attention.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models.metadata import MetadataReader

ENCODER_ARCHS = ("bert", "nomic-bert", "jina-bert-v2")
POSITIONS = {"bert": "learned", "nomic-bert": "rope", "jina-bert-v2": "alibi"}
FFNS = {"bert": "gelu", "nomic-bert": "swiglu", "jina-bert-v2": "gelu_gated"}
JINA_ALIBI_MAX_BIAS = 8.0  # llama.cpp sets it for jina-bert-v2 whatever the file says


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """One encoder's shapes and switches. positions: "learned" | "rope" | "alibi"; ffn: "gelu"
    (bert), "swiglu" (nomic-bert), "gelu_gated" (jina-bert-v2); pooling: llama.cpp's
    pooling_type name ("none", "mean", "cls", "last", "rank"); n_cls_out: the rank head's
    outputs (classifier labels)."""

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

    def __post_init__(self) -> None:
        if self.positions not in ("learned", "rope", "alibi"):
            raise UnsupportedModelError(f"{self.arch}: unknown position kind {self.positions!r}")
        if self.n_heads % self.n_kv_heads or self.d_model != self.n_heads * self.head_dim:
            raise UnsupportedModelError(f"{self.arch}: {self.n_heads} heads of {self.head_dim} do not make a width of "
                                        f"{self.d_model} with {self.n_kv_heads} KV heads")
        if self.positions == "rope" and not 0 < self.n_rot <= self.head_dim:
            raise UnsupportedModelError(f"{self.arch}: rope dimension count {self.n_rot} outside 1..{self.head_dim}")

    @property
    def encoder(self) -> bool:
        """Always True: what tells an encoder's config from a decoder's ModelConfig."""
        return True

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


def is_encoder(f: GGUFFile) -> bool:
    return f.architecture in ENCODER_ARCHS


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
    if d % n_heads:
        raise UnsupportedModelError(f"{f.path}: {arch}.embedding_length {d} is not a multiple of head_count {n_heads}")
    head_dim = d // n_heads
    n_types = r.get("tokenizer.ggml.token_type_count", 0)
    if n_types == 0 and arch != "jina-bert-v2":
        raise UnsupportedModelError(f"{f.path}: an {arch} model needs tokenizer.ggml.token_type_count (llama.cpp "
                                    "refuses it too)")
    labels = f.metadata.get(f"{arch}.classifier.output_labels")
    rope = arch == "nomic-bert"
    return EncoderConfig(
        arch=arch, n_layers=r.get("block_count"), d_model=d, n_heads=n_heads,
        n_kv_heads=r.get("attention.head_count_kv", n_heads), head_dim=head_dim,
        ffn_dim=r.get("feed_forward_length"), vocab_size=r.vocab_size(), context_length=r.get("context_length"),
        norm_eps=r.get("attention.layer_norm_epsilon", kind=float), positions=POSITIONS[arch], ffn=FFNS[arch],
        n_token_types=n_types, pooling=r.pooling_or("none"),
        n_cls_out=len(labels) if isinstance(labels, list) and labels else 1,
        rope_base=r.get("rope.freq_base", 10000.0, kind=float) if rope else 10000.0,
        n_rot=r.get("rope.dimension_count", head_dim) if rope else 0,
        alibi_max_bias=JINA_ALIBI_MAX_BIAS if arch == "jina-bert-v2" else 0.0,
    )
