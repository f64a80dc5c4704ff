"""ModelConfig: every hyper-parameter of a decoder-only transformer, read from GGUF metadata.

The per-architecture modules (llama.py, qwen2.py, gemma3.py) turn metadata into a ModelConfig;
`edge_infer.models.config_from_gguf(file)` dispatches on `general.architecture`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_infer.errors import UnsupportedModelError


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and switches of one model. Head dims are per head; `swa_layers[i]` says whether
    layer i uses sliding-window attention (window `sliding_window` tokens, rope base
    `rope_base_swa`, no rope scaling); rope_neox: rotate pairs (i, i + n_rot/2) instead of
    (2i, 2i + 1). RoPE follows ggml's rope (models/rope.py): `rope_scaling` "none" | "linear" |
    "yarn" with `rope_scale` = 1 / factor and `rope_orig_ctx` (YaRN's original context; for
    longrope the context above which the long factors apply), per-pair frequency divisors
    (`rope_freqs`: Llama 3's rope_freqs.weight; `rope_factors_long` / `_short`: Phi-3's), and
    `rope_attn_factor` multiplying cos and sin. Multipliers far from 1 are granite's."""

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
    rope_scaling: str = "none"
    rope_orig_ctx: int = 0
    rope_attn_factor: float = 1.0
    rope_freqs: tuple[float, ...] = ()
    rope_factors_long: tuple[float, ...] = ()
    rope_factors_short: tuple[float, ...] = ()
    nope_layers: tuple[bool, ...] = ()  # layers without RoPE (smollm3: every 4th); () = none
    rope_sections: tuple[int, ...] = ()  # M-RoPE (qwen2vl): rotated pairs per position component t, h, w, e
    n_rot: int = 0
    rope_neox: bool = False
    rope_base_swa: float = 10000.0
    swa_rope_unscaled: bool = False  # gemma3, olmo2: sliding-window layers rotate without scaling
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    qkv_bias: bool = False
    qk_norm: bool = False  # RMSNorm of each head of Q and K (gemma, qwen3)
    qk_norm_full: bool = False  # RMSNorm of the whole Q and K rows (olmo2)
    qk_norm_after_rope: bool = False  # hunyuan-dense: the per-head QK norm follows RoPE
    pre_norms: bool = True  # norms before attention and the FFN (olmo2 has none)
    post_norms: bool = False  # gemma, olmo2: norms after attention and after the FFN
    fused_qkv: bool = False  # phi3: one attn_qkv matrix, rows [Q | K | V]
    fused_gate_up: bool = False  # phi3: one ffn_up matrix, rows [gate | up]
    activation: str = "silu"  # "silu" (SwiGLU) | "gelu" (GeGLU, tanh) | "relu2", "xielu" (ungated: up, down)
    xielu: tuple[tuple[float, float, float, float], ...] = ()  # apertus: per layer (alpha_n, alpha_p, beta, eps)
    attn_out_bias: bool = False  # apertus: attn_output.bias, when the file has it
    embed_scale: float = 1.0
    attn_scale: float = 0.0  # softmax scale; 0 means 1/sqrt(head_dim)
    attn_softcap: float = 0.0  # gemma2: scores = cap * tanh(scores / cap)
    final_logit_softcap: float = 0.0
    residual_scale: float = 1.0  # granite: each block output is multiplied by this before the add
    logit_scale: float = 1.0  # granite: the logits are divided by this
    tied_embeddings: bool = False
    # mixture of experts: every layer's FFN routes each token to n_experts_used of n_experts
    # experts of width expert_ffn_dim; their weights divided by their sum when expert_weights_norm;
    # shared_ffn_dim > 0: a gated shared expert beside them (qwen2moe)
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn_dim: int = 0
    expert_weights_norm: bool = False
    shared_ffn_dim: int = 0
    shared_expert_gated: bool = True  # qwen2moe's shared expert has a sigmoid gate; granite's is added as it is
    expert_gating: str = "softmax"  # "softmax" | "sigmoid" (lfm2moe) | "softmax_weight" (gpt-oss: over the chosen)
    expert_biases: bool = False  # gpt-oss: the router and every expert's gate, up and down have biases
    attn_sinks: bool = False  # gpt-oss: a learned sink logit per head in the attention softmax
    expert_select_bias: bool = False  # lfm2moe: exp_probs_b added to the probabilities for the choice only
    dense_lead: int = 0  # lfm2moe: the first layers keep a dense FFN (leading_dense_block_count)
    # nemotron_h: a layer is one block, its mixer (attention or Mamba2) or its FFN, after attn_norm
    router_on_input: bool = False  # smallthinker: the router reads the layer's input (before attn_norm)
    expert_activation: str = "silu"  # "silu" (SwiGLU) | "relu" (ReGLU: smallthinker) | "swiglu_oai" (gpt-oss) | "gelu"
    # gemma4 (26B-A4B): the dense MLP runs beside the experts, each with its own norms; the router
    # reads the unweighted RMS norm of the FFN's input scaled per channel, each expert's output a scalar
    moe_beside_dense: bool = False
    ffn_only_layers: tuple[bool, ...] = ()
    mixer_only_layers: tuple[bool, ...] = ()
    parallel_ssm: bool = False  # falcon-h1: every layer's attention and Mamba2 read one input, summed
    # hybrid recurrent models (lfm2): conv_layers[i] says layer i is a gated short convolution
    # (no attention, no KV; a per-sequence state of its last conv_kernel - 1 inputs instead)
    conv_layers: tuple[bool, ...] = ()
    conv_kernel: int = 0  # the convolution's width in tokens (GGUF shortconv.l_cache)
    # Mamba2 blocks (granitehybrid): ssm_layers[i] says layer i is one; d_inner = ssm_inner split
    # into ssm_heads heads, B and C of ssm_state values in ssm_groups groups, a causal
    # convolution of ssm_conv_kernel tokens over [x | B | C]
    ssm_layers: tuple[bool, ...] = ()
    # Gated DeltaNet blocks (qwen35), with the ssm_* fields: ssm_inner the value width, split into
    # ssm_heads value heads of ssm_state; ssm_groups key heads of ssm_state
    delta_layers: tuple[bool, ...] = ()
    delta_grouped: bool = False  # qwen3next: value head h reads key head h // (H / Hk) (qwen35: h % Hk)
    attn_output_gate: bool = False  # qwen35: Q's projection holds [q | gate] per head; attention * sigmoid(gate)
    ffn_norm_tensor: str = "ffn_norm"  # qwen35 names the FFN's pre-norm post_attention_norm
    ssm_conv_kernel: int = 0
    ssm_inner: int = 0
    ssm_state: int = 0
    ssm_heads: int = 0
    ssm_groups: int = 0
    output_norm_tensor: str = "output_norm.weight"  # lfm2 names it token_embd_norm.weight
    pooling: str = "last"  # embeddings: "mean" | "cls" | "last" | "none" | "rank" (GGUF pooling_type; decoders: last)
    ignored_tensors: tuple[str, ...] = ()  # fnmatch patterns of tensors the architecture may carry unused
    # gemma4: sliding-window layers have their own head size, rotated dims and KV heads (0: as
    # the full layers'); per-layer FFN widths (the KV-shared layers' double-wide MLP)
    head_dim_swa: int = 0
    n_rot_swa: int = 0
    n_kv_heads_swa: int = 0
    layer_ffn_dims: tuple[int, ...] = ()
    kv_shared_from: int = 0  # layers from this one on attend over an earlier layer's K/V (0: none)
    v_norm: bool = False  # gemma3n, gemma4: V is RMS-normed per head (no weight)
    k_eq_v: bool = False  # gemma4: a layer without attn_v uses K's projection as V
    per_layer_input: int = 0  # gemma3n, gemma4: width of each layer's per-layer embedding input
    layer_output_scale: bool = False  # gemma4: a scalar multiplies each layer's output
    # gemma3n: AltUp's residual streams (0: none), LAuReL's rank, and per layer the standard
    # deviations above the mean that the FFN gate's activation sparsity keeps (0: none; () all none)
    altup_streams: int = 0
    laurel_rank: int = 0
    sparsity: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size", "context_length"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise UnsupportedModelError(f"{self.arch}: {name} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise UnsupportedModelError(f"{self.arch}: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.n_rot % 2 or not 0 < self.n_rot <= self.head_dim:
            raise UnsupportedModelError(f"{self.arch}: rope dimension {self.n_rot} must be even and at most head_dim {self.head_dim}")
        if self.activation not in ("silu", "gelu", "relu2", "xielu") or (self.activation == "xielu") != bool(self.xielu):
            raise UnsupportedModelError(f"{self.arch}: unknown activation {self.activation!r} (xielu takes its parameters)")
        if len(self.swa_layers) != self.n_layers:
            raise UnsupportedModelError(f"{self.arch}: swa_layers has {len(self.swa_layers)} entries for {self.n_layers} layers")
        if self.nope_layers and len(self.nope_layers) != self.n_layers:
            raise UnsupportedModelError(f"{self.arch}: nope_layers has {len(self.nope_layers)} entries for {self.n_layers} layers")
        if self.rope_scaling not in ROPE_SCALINGS:
            raise UnsupportedModelError(f"{self.arch}: rope scaling {self.rope_scaling!r} (supported: {', '.join(ROPE_SCALINGS)})")
        if self.rope_scaling == "yarn" and self.rope_orig_ctx <= 0:
            raise UnsupportedModelError(f"{self.arch}: yarn rope scaling needs rope.scaling.original_context_length")
        for name in ("rope_freqs", "rope_factors_long", "rope_factors_short"):
            v = getattr(self, name)
            if v and (len(v) != self.n_rot // 2 or min(v) <= 0):
                raise UnsupportedModelError(f"{self.arch}: {name} must hold {self.n_rot // 2} positive factors, got {len(v)}")
        if self.rope_sections and (len(self.rope_sections) != 4 or min(self.rope_sections) < 0
                                   or not 0 < sum(self.rope_sections) <= self.n_rot // 2):
            raise UnsupportedModelError(f"{self.arch}: rope.dimension_sections must be 4 counts of rotated pairs "
                                        f"summing to 1..{self.n_rot // 2}, got {self.rope_sections}")
        if bool(self.rope_factors_long) != bool(self.rope_factors_short):
            raise UnsupportedModelError(f"{self.arch}: rope_factors_long and rope_factors_short come together")
        if self.n_experts and not (0 < self.n_experts_used <= self.n_experts and self.expert_ffn_dim > 0):
            raise UnsupportedModelError(
                f"{self.arch}: {self.n_experts} experts need 1..{self.n_experts} used per token (got "
                f"{self.n_experts_used}) and a positive expert FFN width (got {self.expert_ffn_dim})"
            )
        if self.conv_layers and (len(self.conv_layers) != self.n_layers or self.conv_kernel < 2):
            raise UnsupportedModelError(
                f"{self.arch}: conv_layers has {len(self.conv_layers)} entries for {self.n_layers} layers and a "
                f"convolution width of {self.conv_kernel} (at least 2)"
            )
        if (self.expert_gating not in ("softmax", "sigmoid", "softmax_weight") or not 0 <= self.dense_lead <= self.n_layers
                or self.expert_activation not in ("silu", "relu", "swiglu_oai", "gelu")):
            raise UnsupportedModelError(f"{self.arch}: expert gating {self.expert_gating!r} (softmax or sigmoid), "
                                        f"activation {self.expert_activation!r} (silu or relu), "
                                        f"{self.dense_lead} leading dense layers of {self.n_layers}")
        for name in ("ffn_only_layers", "mixer_only_layers"):
            if getattr(self, name) and len(getattr(self, name)) != self.n_layers:
                raise UnsupportedModelError(f"{self.arch}: {name} has {len(getattr(self, name))} entries for "
                                            f"{self.n_layers} layers")
        if self.delta_layers and len(self.delta_layers) != self.n_layers:
            raise UnsupportedModelError(f"{self.arch}: {len(self.delta_layers)} delta-rule layer flags for {self.n_layers} layers")
        if self.ssm_layers or self.delta_layers:
            shape = (self.ssm_conv_kernel, self.ssm_inner, self.ssm_state, self.ssm_heads, self.ssm_groups)
            if ((self.ssm_layers and len(self.ssm_layers) != self.n_layers) or min(shape) < 1 or self.ssm_conv_kernel < 2
                    or self.ssm_inner % self.ssm_heads or self.ssm_heads % self.ssm_groups):
                raise UnsupportedModelError(
                    f"{self.arch}: Mamba2 layers need a convolution of >= 2 tokens and an inner size split evenly into "
                    f"heads and the heads into groups (conv {shape[0]}, inner {shape[1]}, state {shape[2]}, "
                    f"heads {shape[3]}, groups {shape[4]}; {len(self.ssm_layers)} layer flags for {self.n_layers})"
                )
        self._check_layer_shapes()
        for name in ("rope_scale", "rope_attn_factor", "residual_scale", "logit_scale"):
            if not getattr(self, name) > 0:
                raise UnsupportedModelError(f"{self.arch}: {name} must be positive, got {getattr(self, name)!r}")

    def _check_layer_shapes(self) -> None:
        hd, kv, rot = self.head_dim_swa or self.head_dim, self.n_kv_heads_swa or self.n_kv_heads, self.n_rot_swa
        if self.n_heads % kv or (rot and (rot % 2 or rot > hd)):
            raise UnsupportedModelError(f"{self.arch}: sliding-window layers' {kv} KV heads must divide the {self.n_heads} "
                                        f"heads and their rope dimension {rot} be even and at most their head size {hd}")
        if self.layer_ffn_dims and (len(self.layer_ffn_dims) != self.n_layers or min(self.layer_ffn_dims) <= 0):
            raise UnsupportedModelError(f"{self.arch}: {len(self.layer_ffn_dims)} per-layer FFN widths for "
                                        f"{self.n_layers} layers (each positive)")
        if self.sparsity and len(self.sparsity) != self.n_layers:
            raise UnsupportedModelError(f"{self.arch}: {len(self.sparsity)} sparsity entries for {self.n_layers} layers")
        if self.altup_streams and (self.altup_streams < 2 or self.laurel_rank < 1 or not self.per_layer_input):
            raise UnsupportedModelError(f"{self.arch}: AltUp needs 2 or more streams ({self.altup_streams}), a LAuReL "
                                        f"rank ({self.laurel_rank}) and a per-layer input")
        src = self.kv_shared_from
        if src and not (2 <= src < self.n_layers and not self.swa_layers[src - 1] and self.swa_layers[src - 2]):
            raise UnsupportedModelError(f"{self.arch}: KV sharing from layer {src} needs layer {src - 1} to be a full "
                                        f"attention layer and {src - 2} a sliding-window one ({self.n_layers} layers)")

    def layer_head_dim(self, layer: int) -> int:
        """Head size of `layer` (gemma4's sliding-window layers have their own)."""
        return self.head_dim_swa if self.head_dim_swa and self.swa_layers[layer] else self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        return self.n_kv_heads_swa if self.n_kv_heads_swa and self.swa_layers[layer] else self.n_kv_heads

    def layer_n_rot(self, layer: int) -> int:
        return self.n_rot_swa if self.n_rot_swa and self.swa_layers[layer] else self.n_rot

    def layer_ffn_dim(self, layer: int) -> int:
        return self.layer_ffn_dims[layer] if self.layer_ffn_dims else self.ffn_dim

    def kv_source(self, layer: int) -> int:
        """The layer whose K/V `layer` attends over: itself, or (gemma3n, gemma4 past
        kv_shared_from) the last earlier full or sliding-window layer with K/V of its own."""
        if not self.kv_shared_from or layer < self.kv_shared_from:
            return layer
        return self.kv_shared_from - (2 if self.swa_layers[layer] else 1)

    @property
    def q_dim(self) -> int:
        """Q's width: the widest layer's (the workspace's)."""
        return self.n_heads * max(self.head_dim, self.head_dim_swa)

    @property
    def kv_dim(self) -> int:
        return max(self.layer_kv_heads(i) * self.layer_head_dim(i) for i in range(self.n_layers))

    @property
    def dense_ffn_dim(self) -> int:
        """Width of the dense FFN buffers: the FFN's, or a MoE model's shared expert's (and its
        leading dense layers' FFN)."""
        dense_too = not self.n_experts or self.dense_lead or self.moe_beside_dense
        dense = max((self.ffn_dim, *self.layer_ffn_dims)) if dense_too else 1
        return max(dense, self.shared_ffn_dim)

    def is_moe(self, layer: int) -> bool:
        """Whether `layer`'s FFN is the mixture of experts (not a leading dense one)."""
        return self.n_experts > 0 and layer >= self.dense_lead

    def has_mixer(self, layer: int) -> bool:
        """Whether `layer` has attention or a recurrent block (nemotron_h's FFN layers do not)."""
        return not (self.ffn_only_layers and self.ffn_only_layers[layer])

    def has_ffn(self, layer: int) -> bool:
        """Whether `layer` ends with an FFN (nemotron_h's attention and Mamba2 layers do not)."""
        return not (self.mixer_only_layers and self.mixer_only_layers[layer])

    def has_attention(self, layer: int) -> bool:
        """Whether `layer` attends (and keeps K/V in the paged pool): a mixer that is not a
        recurrent block, or falcon-h1's beside its Mamba2."""
        return self.has_mixer(layer) and (self.parallel_ssm or not self.is_recurrent(layer))

    @property
    def softmax_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def is_conv(self, layer: int) -> bool:
        """Whether `layer` is a short-convolution block (a recurrent state, no KV)."""
        return bool(self.conv_layers) and self.conv_layers[layer]

    def is_ssm(self, layer: int) -> bool:
        """Whether `layer` is a Mamba2 block (a recurrent state, no KV)."""
        return bool(self.ssm_layers) and self.ssm_layers[layer]

    def is_delta(self, layer: int) -> bool:
        """Whether `layer` is a Gated DeltaNet block (a recurrent state, no KV)."""
        return bool(self.delta_layers) and self.delta_layers[layer]

    def is_recurrent(self, layer: int) -> bool:
        return self.is_conv(layer) or self.is_ssm(layer) or self.is_delta(layer)

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers with attention that keep K/V of their own in the paged pool."""
        return tuple(i for i in range(self.n_layers) if self.has_attention(i) and self.kv_source(i) == i)

    @property
    def delta_key_heads(self) -> tuple[int, ...]:
        """The key head each of a delta-rule block's value heads reads."""
        per = self.ssm_heads // max(self.ssm_groups, 1)
        return tuple(h // per if self.delta_grouped else h % self.ssm_groups for h in range(self.ssm_heads))

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the Mamba2 convolution (x, B and C) or the delta rule's (q, k, v)."""
        return self.ssm_inner + 2 * self.ssm_groups * self.ssm_state

    @property
    def state_shapes(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Per recurrent layer (in layer order), the shapes of one sequence's float32 states: a
        short convolution keeps its last conv_kernel - 1 inputs [L - 1, D]; a Mamba2 block its
        convolution's [L - 1, conv_dim] and the scan's [heads, head_dim, ssm_state]."""
        out: list[tuple[tuple[int, ...], ...]] = []
        for i in range(self.n_layers):
            if self.is_conv(i):
                out.append(((self.conv_kernel - 1, self.d_model),))
            elif self.is_ssm(i):
                heads = self.ssm_heads
                out.append(((self.ssm_conv_kernel - 1, self.ssm_conv_dim),
                            (heads, self.ssm_inner // heads, self.ssm_state)))
            elif self.is_delta(i):
                out.append(((self.ssm_conv_kernel - 1, self.ssm_conv_dim),
                            (self.ssm_heads, self.ssm_state, self.ssm_state)))
        return tuple(out)

    @property
    def recurrent_widths(self) -> tuple[int, int, int, int, int]:
        """The widths of a recurrent block's scratch (in_proj output, convolution output, the
        block's output before out_proj, the delta rule's z gate, its per-head beta and alpha),
        the widest over its layer kinds; zeros without."""
        widths = [(0, 0, 0, 0, 0)]
        if self.conv_layers and any(self.conv_layers):
            widths.append((3 * self.d_model, 0, self.d_model, 0, 0))
        if self.ssm_layers and any(self.ssm_layers):
            d_in = 2 * self.ssm_inner + 2 * self.ssm_groups * self.ssm_state + self.ssm_heads
            widths.append((d_in, self.ssm_conv_dim, self.ssm_inner, 0, 0))
        if self.delta_layers and any(self.delta_layers):
            widths.append((self.ssm_conv_dim, self.ssm_conv_dim, self.ssm_inner, self.ssm_inner, self.ssm_heads))
        return tuple(max(w[i] for w in widths) for i in range(5))  # type: ignore[return-value]

    @property
    def state_bytes(self) -> int:
        """Bytes of one sequence's recurrent state across the recurrent layers (float32)."""
        return 4 * sum(math.prod(shape) for layer in self.state_shapes for shape in layer)

    @property
    def recurrent(self) -> bool:
        """Whether the model has layers with a per-sequence state (beside or instead of KV)."""
        return bool(self.state_shapes)

    def layer_window(self, layer: int) -> int:
        """Sliding window of `layer` in tokens, 0 for full attention."""
        return self.sliding_window if self.swa_layers[layer] else 0

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_swa if self.swa_layers[layer] else self.rope_base


ROPE_SCALINGS = ("none", "linear", "yarn")
