"""ModelConfig: every hyper-parameter of a decoder-only transformer, read from GGUF metadata.

The per-architecture modules (llama.py, qwen2.py, gemma3.py) turn metadata into a ModelConfig;
`edge_infer.models.config_from_gguf(file)` dispatches on `general.architecture`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and switches of one model. Head dims are per head; `swa_layers[i]` says whether
    layer i uses sliding-window attention (window `sliding_window` tokens, rope base
    `rope_base_swa`); rope_neox: rotate pairs (i, i + n_rot/2) instead of (2i, 2i + 1)."""

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
    rope_base: float
    rope_scale: float = 1.0  # positions are multiplied by this (linear rope scaling: 1 / factor)
    n_rot: int = 0
    rope_neox: bool = False
    rope_base_swa: float = 10000.0
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False  # gemma: norms after attention and after the FFN
    activation: str = "silu"  # "silu" (SwiGLU) | "gelu" (GeGLU, tanh approximation)
    embed_scale: float = 1.0
    attn_scale: float = 0.0  # softmax scale; 0 means 1/sqrt(head_dim)
    final_logit_softcap: float = 0.0
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size", "context_length"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise UnsupportedModelError(f"{self.arch}: {name} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise UnsupportedModelError(f"{self.arch}: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.n_rot % 2 or not 0 < self.n_rot <= self.head_dim:
            raise UnsupportedModelError(f"{self.arch}: rope dimension {self.n_rot} must be even and at most head_dim {self.head_dim}")
        if self.activation not in ("silu", "gelu"):
            raise UnsupportedModelError(f"{self.arch}: unknown activation {self.activation!r}")
        if len(self.swa_layers) != self.n_layers:
            raise UnsupportedModelError(f"{self.arch}: swa_layers has {len(self.swa_layers)} entries for {self.n_layers} layers")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def softmax_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def layer_window(self, layer: int) -> int:
        """Sliding window of `layer` in tokens, 0 for full attention."""
        return self.sliding_window if self.swa_layers[layer] else 0

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_swa if self.swa_layers[layer] else self.rope_base


class MetadataReader:
    """Typed access to `<arch>.<key>` metadata with errors that name the missing key."""

    def __init__(self, f: GGUFFile, arch: str) -> None:
        self.f, self.arch = f, arch

    def get(self, key: str, default: Any = ..., kind: type = int) -> Any:
        full = key if key.startswith(("general.", "tokenizer.")) else f"{self.arch}.{key}"
        if full not in self.f.metadata:
            if default is ...:
                raise UnsupportedModelError(f"{self.f.path}: missing metadata key {full!r}")
            return default
        v = self.f.metadata[full]
        if kind is int and isinstance(v, bool) or kind is int and not isinstance(v, int):
            raise UnsupportedModelError(f"{self.f.path}: metadata {full!r} must be an integer, got {v!r}")
        if kind is float and not isinstance(v, (int, float)):
            raise UnsupportedModelError(f"{self.f.path}: metadata {full!r} must be a number, got {v!r}")
        return kind(v)

    def rope_scale(self) -> float:
        """Position multiplier for linear rope scaling; other scaling types are refused."""
        kind = self.f.metadata.get(f"{self.arch}.rope.scaling.type", "none")
        if kind in ("none", ""):
            return 1.0
        if kind == "linear":
            factor = self.get("rope.scaling.factor", 1.0, float)
            return 1.0 / factor if factor > 0 else 1.0
        raise UnsupportedModelError(f"{self.f.path}: rope scaling type {kind!r} is not supported (none, linear)")

    def vocab_size(self) -> int:
        tokens = self.f.metadata.get("tokenizer.ggml.tokens")
        n = self.get("vocab_size", len(tokens) if isinstance(tokens, list) else ...)
        emb = self.f.tensors.get("token_embd.weight")
        if emb is not None and emb.shape[-1] != n:
            raise UnsupportedModelError(f"{self.f.path}: token_embd.weight has {emb.shape[-1]} rows, vocab size is {n}")
        return n
