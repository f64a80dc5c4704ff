"""MetadataReader: typed access to a GGUF file's `<arch>.<key>` metadata for the architecture
modules' config_from_gguf (errors name the file and the key)."""

from __future__ import annotations

from typing import Any

from edge_infer.errors import EdgeInferError, UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.quants import dequantize
from edge_infer.models.config import ROPE_SCALINGS

_SIZES = ("block_count", "embedding_length", "attention.head_count", "context_length")  # see _check_size
POOLINGS = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama.cpp's enum llama_pooling_type


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
        if key in _SIZES:
            self._check_size(full, key, v)
        return kind(v)

    def _check_size(self, full: str, key: str, v: int) -> None:
        # The reader capped these (formats/gguf_limits.py); here they must also be positive (a
        # division comes next) and agree with the tensors the file holds, so a config the file
        # cannot back is refused before anything is sized by it.
        if v <= 0:
            raise UnsupportedModelError(f"{self.f.path}: metadata {full!r} must be a positive integer, got {v}")
        emb = self.f.tensors.get("token_embd.weight")
        if key == "embedding_length" and emb is not None and emb.shape[0] != v:
            raise UnsupportedModelError(
                f"{self.f.path}: metadata {full!r} = {v}, but token_embd.weight has rows of {emb.shape[0]}"
            )
        if key == "block_count" and not any(name.startswith(f"blk.{v - 1}.") for name in self.f.tensors):
            raise UnsupportedModelError(
                f"{self.f.path}: metadata {full!r} = {v}, but the file has no tensors of layer {v - 1} (blk.{v - 1}.*)"
            )

    def rope_scaling(self) -> dict[str, Any]:
        """ModelConfig's rope fields from `rope.scaling.*` as llama.cpp reads them: no type means
        "linear" (with no factor, no scaling); other types are refused, naming the key."""
        key = f"{self.arch}.rope.scaling.type"
        kind = self.f.metadata.get(key, "linear")
        if kind not in ROPE_SCALINGS:
            raise UnsupportedModelError(
                f"{self.f.path}: {key} = {kind!r} is not supported (supported: {', '.join(ROPE_SCALINGS)})"
            )
        factor = self.get("rope.scaling.factor", self.get("rope.scale_linear", 0.0, float), float)
        scale = 1.0 / factor if factor > 0 and kind != "none" else 1.0
        return dict(
            rope_scaling=kind if scale != 1.0 else "none",
            rope_scale=scale,
            rope_orig_ctx=self.get("rope.scaling.original_context_length", self.get("context_length"), int),
            rope_attn_factor=self.get("rope.scaling.attn_factor", 1.0, float),
        )

    def factors(self, name: str) -> tuple[float, ...]:
        """A global rope-factor tensor (rope_freqs.weight, rope_factors_long.weight, ...) as
        floats, () when the file has none."""
        t = self.f.tensors.get(name)
        if t is None:
            return ()
        try:
            values = dequantize(t)
        except EdgeInferError as e:
            raise UnsupportedModelError(f"{self.f.path}: tensor {name!r} has unsupported type {t.type.name}") from e
        return tuple(float(x) for x in values.reshape(-1))

    def experts(self, norm: bool, shared: bool = False) -> dict[str, Any]:
        """ModelConfig's mixture-of-experts fields as llama.cpp reads them: expert_count and
        expert_used_count required; an expert's FFN width `expert_feed_forward_length`, else
        feed_forward_length / used (qwen's default); `expert_weights_norm` when the file says, else
        the architecture's `norm`; with a shared expert, its width
        `expert_shared_feed_forward_length`, else feed_forward_length."""
        n_ff = self.get("feed_forward_length")
        n_experts, used = self.get("expert_count"), self.get("expert_used_count")
        return dict(
            n_experts=n_experts,
            n_experts_used=used,
            expert_ffn_dim=self.get("expert_feed_forward_length", n_ff // max(used, 1)),
            expert_weights_norm=bool(self.f.metadata.get(f"{self.arch}.expert_weights_norm", norm)),
            shared_ffn_dim=self.get("expert_shared_feed_forward_length", n_ff) if shared else 0,
        )

    def swa_pattern(self, n_layers: int, period: int, dense_first: bool) -> tuple[bool, ...]:
        """Which layers use the sliding window, as llama.cpp's load_swa_pattern reads them:
        `attention.sliding_window_pattern` as per-layer flags, or a period n (default `period`;
        0: every layer) whose first layer is the full one (dense_first) or whose last is."""
        key = f"{self.arch}.attention.sliding_window_pattern"
        v: Any = self.f.metadata.get(key)
        if isinstance(v, list):
            if len(v) < n_layers:
                raise UnsupportedModelError(f"{self.f.path}: {key} has {len(v)} entries for {n_layers} layers")
            return tuple(bool(x) for x in v[:n_layers])
        n = self.get("attention.sliding_window_pattern", period)
        return tuple(n == 0 or (i % n != 0 if dense_first else i % n < n - 1) for i in range(n_layers))

    def refuse_mrope(self) -> None:
        """Refuse by name a vision variant's M-RoPE (`rope.dimension_sections` with t and h
        sections, as llama.cpp's use_mrope reads them): the text models rotate without it."""
        sections = self.f.metadata.get(f"{self.arch}.rope.dimension_sections")
        if isinstance(sections, list) and len(sections) >= 2 and sections[0] > 0 and sections[1] > 0:
            raise UnsupportedModelError(f"{self.f.path}: {self.arch} with M-RoPE sections (a vision variant) is not "
                                        "supported")

    def pooling(self) -> str:
        """`pooling_type` as ModelConfig.pooling names it; a decoder file without one: "last"."""
        return self.pooling_or("last")

    def pooling_or(self, default: str) -> str:
        """`pooling_type` by name (POOLINGS), `default` when the file has none."""
        kind = self.get("pooling_type", {v: k for k, v in POOLINGS.items()}[default])
        if kind not in POOLINGS:
            raise UnsupportedModelError(f"{self.f.path}: {self.arch}.pooling_type = {kind} is not a known pooling type")
        return POOLINGS[kind]

    def vocab_size(self) -> int:
        tokens = self.f.metadata.get("tokenizer.ggml.tokens")
        n = self.get("vocab_size", len(tokens) if isinstance(tokens, list) else ...)
        emb = self.f.tensors.get("token_embd.weight")
        if emb is not None and emb.shape[-1] != n:
            raise UnsupportedModelError(f"{self.f.path}: token_embd.weight has {emb.shape[-1]} rows, vocab size is {n}")
        return n
