"""The backend seam: what the model layer needs from a compute backend. kernels_cpu.backend's
CpuBackend is the first; a CUDA backend implements the same methods over device arrays.
Nothing above this seam reads weights, KV or scratch as host arrays: they are the backend's.
Shapes and semantics of each method are those of the kernels in kernels_cpu/__init__.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.qmatrix import QMatrix

Array = Any  # a backend's array type (numpy on the CPU)


class Backend(Protocol):
    name: str

    @property
    def matrix_types(self) -> tuple[int, ...]:
        """GGML types its matmuls compute with (read only: a backend's class constant)."""
        ...

    @property
    def n_threads(self) -> int:
        """The threads its kernels run with."""
        ...

    def prepare_weights(self, f: GGUFFile, matrices: Sequence[tuple[str, QMatrix]]) -> list[QMatrix]:
        """Each (role "layer" | "output", matrix) in the backend's form (repacked, uploaded)."""
        ...

    def make_workspace(self, capacity: int, d_model: int, q_dim: int, kv_dim: int, ffn_dim: int,
                       experts: tuple[int, int, int] | None = None,
                       recurrent: tuple[int, ...] = (0, 0, 0, 0, 0), gated_attention: bool = False,
                       per_layer: int = 0, altup: tuple[int, int] = (0, 0)) -> Any:
        """The forward's scratch for steps of up to `capacity` tokens (kernels_cpu.workspace);
        experts: (E, k, Fe) of a mixture-of-experts model; recurrent: a hybrid model's
        ModelConfig.recurrent_widths; per_layer: ModelConfig.per_layer_input; altup: gemma3n's
        (streams, LAuReL rank)."""
        ...

    def kv_block_bytes(self, n_layers: int, n_kv_heads: int, head_dim: int, block_size: int, kv_dtype: str,
                       kv_dtype_v: str | None = None) -> int:
        """Bytes of one KV block across all layers (K of kv_dtype, V of kv_dtype_v or the same)."""
        ...

    def make_kv_pool(self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                     kv_dtype: str, kv_dtype_v: str | None = None) -> list[Any]:
        ...

    def copy_blocks(self, kv: list[Any], copies: list[tuple[int, int]]) -> None: ...

    def shift_kv(self, layer: Any, moves: Array, head_dim: int, n_rot: int, inv_freq: Array, neox: bool) -> None:
        """A context shift's K/V row moves (int64 [m, 3]: src slot, dst slot, position delta) in
        one layer's pool, keys re-rotated by RoPE for their new positions."""
        ...

    def make_state_pool(self, shapes: Sequence[Sequence[tuple[int, ...]]], num_slots: int) -> list[Any]:
        """Per recurrent layer, a tuple of float32 [num_slots, *shape], one per shape of the
        layer's states (ModelConfig.state_shapes): each sequence's state in its slot."""
        ...

    def copy_states(self, states: list[Any], copies: list[tuple[int, int]]) -> None:
        """State slot copies (src, dst) in every recurrent layer (a forked sample's state)."""
        ...

    def short_conv(self, bcx: Array, w: Array, state: Array, seq_slot: Array, token_seq: Array, positions: Array,
                   snap_rows: Array, snap_slots: Array, out: Array) -> None:
        """LFM2's gated short convolution (kernels_cpu.recurrent.short_conv_kernel)."""
        ...

    def conv_silu(self, src: Array, off: int, w: Array, bias: Array, state: Array, seq_slot: Array, token_seq: Array,
                  positions: Array, snap_rows: Array, snap_slots: Array, out: Array) -> None:
        """Mamba2's convolution of x, B, C (kernels_cpu.recurrent.conv_silu_kernel)."""
        ...

    def ssm_scan(self, xbc: Array, zxdt: Array, dt_off: int, dt_bias: Array, a: Array, d_skip: Array, state: Array,
                 seq_slot: Array, token_seq: Array, positions: Array, snap_rows: Array, snap_slots: Array,
                 y: Array) -> None:
        """Mamba2's selective scan (kernels_cpu.recurrent.ssm_scan_kernel)."""
        ...

    def gated_group_rmsnorm(self, y: Array, z: Array, w: Array, groups: int, eps: Any, out: Array) -> None: ...

    def delta_rule(self, qkv: Array, beta: Array, alpha: Array, dt_bias: Array, a: Array, state: Array,
                   seq_slot: Array, token_seq: Array, positions: Array, snap_rows: Array, snap_slots: Array,
                   k_head_of: Array, eps: Any, y: Array) -> None:
        """The gated delta rule (kernels_cpu.recurrent.delta_rule_kernel); k_head_of i32 [H]: each
        value head's key head."""
        ...

    def head_rmsnorm_gate(self, y: Array, z: Array, w: Array, eps: Any, out: Array) -> None: ...

    def split_gated_q(self, qg: Array, head_dim: int, q: Array, gate: Array) -> None: ...

    def sigmoid_mul(self, x: Array, gate: Array) -> None: ...

    def memory_available(self) -> int:
        """Bytes the KV pool may be sized from (host memory available, or free device memory)."""
        ...

    def run_step(self, inp: Any, launch: Callable[[Any], Array], replayable: bool) -> Array:
        """launch(StepInputs where the kernels read them) -> the step's result. The CPU calls it
        as it is; CUDA uploads the inputs in one copy, and may pad a replayable step (every
        token's logits wanted) and replay a recorded forward instead (its result then has the
        padded row count: the caller slices)."""
        ...

    def read_logits(self, logits: Array, whole: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """A step's logits [M, V] for the sampler: (host rows, where, greedy). The CPU: (all the
        rows, None, None). CUDA: only the rows where `whole` [M] bool is set cross to the host,
        where [M] gives each row's index among them (-1: not copied) and greedy int32 [M] every
        row's argmax, computed on the device."""
        ...

    def output_buffer(self, rows: int, cols: int) -> Array:
        """A new float32 [rows, cols] array for a result handed to the caller (the logits)."""
        ...

    def to_host(self, x: Array, scratch: bool) -> Any:
        """x as a host numpy array; scratch: x is workspace memory, so the result must be a copy."""
        ...

    def matmuls(self, x: Array, ws: Sequence[QMatrix], outs: Sequence[Array], work: Any) -> None: ...

    def route_experts(self, router: QMatrix, x: Array, norm: bool, work: Any, gating: int = 0,
                      bias: Array = ..., logits: Array | None = None) -> None:
        """Router logits x @ router.T [N, E] -> each token's k experts and weights (gating 0
        softmax, 1 sigmoid, 2 softmax over the chosen logits; chosen by probability + bias [E]
        when given), pairs grouped by
        expert, x gathered per pair into work.moe.xg; logits [N, E] given: the router's output
        already (smallthinker routes the layer's input)."""
        ...

    def expert_matmuls(self, x: Array, ws: Sequence[QMatrix], outs: Sequence[Array], work: Any) -> None:
        """Per pair p of expert e: outs[m][p] = x[p] @ ws[m][e].T, reading only chosen experts."""
        ...

    def combine_experts(self, y: Array, out: Array, work: Any) -> None: ...

    def gated_add(self, x: Array, g: Array, y: Array, out: Array) -> None: ...

    def embed(self, tokens: Array, emb: QMatrix, scale: Any, out: Array) -> None: ...

    def qkv_finish(self, q: Array, k: Array, v: Array, bq: Array, bk: Array, bv: Array, q_norm: Array,
                   k_norm: Array, n_rot: int, positions: Array, inv_freq: Array, mscale: float, neox: bool,
                   eps: Any, slot_mapping: Array, kv: Any) -> None: ...

    def attention(self, q: Array, kv: Any, block_tables: Array, token_seq: Array, positions: Array, scale: Any,
                  window: int, softcap: Any, out: Array, sinks: Array = ...) -> None: ...

    def rmsnorm(self, x: Array, w: Array, eps: Any, out: Array) -> None: ...

    def add_rmsnorm(self, h: Array, delta: Array, w: Array, eps: Any, out: Array) -> None: ...

    def silu_mul(self, gate: Array, up: Array, out: Array) -> None: ...

    def gelu_mul(self, gate: Array, up: Array, out: Array) -> None: ...

    def relu_sqr(self, x: Array, out: Array) -> None: ...

    def relu_mul(self, gate: Array, up: Array, out: Array) -> None: ...

    def swiglu_oai(self, gate: Array, up: Array, out: Array) -> None: ...

    def expert_bias(self, y: Array, bias: Array, work: Any) -> None:
        """y[p] += bias[e] for each pair p of expert e (route_experts' grouping): gpt-oss's
        experts' biases."""
        ...

    def expert_scale(self, n: int, scale: Array, work: Any) -> None:
        """The first n tokens' expert weights (route_experts') times their expert's scale [E]."""
        ...

    def altup_predict(self, streams: Array, r: Array, coef: Array, pred: Array, active: Array) -> None:
        """gemma3n: each AltUp stream predicted from all [A, T, D] (kernels_cpu.altup)."""
        ...

    def altup_correct(self, pred: Array, y: Array, r: Array, coef: Array, streams: Array) -> None: ...

    def match_norm(self, ref: Array, x: Array) -> None: ...

    def unembed_mean(self, active: Array, unembedded: Array, out: Array) -> None: ...

    def gaussian_topk(self, x: Array, std_mul: Any) -> None: ...

    def mul_rows(self, x: Array, w: Array, out: Array) -> None: ...

    def xielu(self, x: Array, alpha_n: Any, alpha_p: Any, beta: Any, eps: Any, out: Array) -> None: ...

    def take_rows(self, x: Array, rows: Array, out: Array) -> None: ...

    def softcap(self, x: Array, cap: Any) -> None: ...

    def scale(self, x: Array, factor: Any) -> None: ...

    def add(self, h: Array, delta: Array) -> None: ...


class EncoderBackend(Backend, Protocol):
    """A backend that also runs bidirectional encoders (models/encoder.py): the CPU's."""

    def layernorm(self, x: Array, w: Array, b: Array, eps: Any, out: Array) -> None:
        """out = LayerNorm(x) * w + b per row (kernels_cpu.encoder)."""
        ...

    def add_layernorm(self, x: Array, bias: Array, res: Array, w: Array, b: Array, eps: Any, out: Array) -> None:
        """x += bias + res, then out = LayerNorm(x) * w + b: an encoder's post-norm residual."""
        ...

    def input_layernorm(self, x: Array, type_row: Array, pos_table: Array, positions: Array, w: Array, b: Array,
                        eps: Any, out: Array) -> None:
        """An encoder's input: token embeddings + token type + learned positions, LayerNorm'd."""
        ...

    def bias_gelu(self, x: Array, bias: Array, out: Array) -> None: ...

    def softmax_rows(self, x: Array, inv: Array) -> None:
        """x [T, N] in place: exp(x - each row's max); inv [T]: 1 / each row's sum of them."""
        ...

    def widen_rows(self, qtype: int, w: Array, r0: int, r1: int, out: Array) -> None:
        """Rows r0 .. r1 - 1 of a float-type matrix's bytes w [rows, row bytes] as float32 into
        out [r1 - r0, cols], on the calling thread."""
        ...

    def kernel_threads(self, n: int) -> AbstractContextManager[None]:
        """The calling thread's kernels on n threads for a with-block, then as before."""
        ...

    def encoder_attention(self, q: Array, k: Array, v: Array, seq_start: Array, seq_end: Array, head_dim: int,
                          scale: Any, slopes: Array, window: int, out: Array) -> None:
        """Bidirectional attention within each input, within a symmetric window when window > 0
        (kernels_cpu.encoder.encoder_attention_kernel)."""
        ...


class LoraBackend(Protocol):
    """What LoRA adapters need besides Backend: only the CPU backend has it."""

    def lora_add(self, x: Array, row_ptr: Array, ent_adapter: Array, ent_scale: Array, tab_off: Array,
                 tab_rank: Array, tab_alpha: Array, a: Array, bt: Array, out: Array, *, parallel: bool) -> None:
        """out[t] += scale * B (A x[t]) for each LoRA adapter of row t (kernels_cpu/lora.py's
        layout); only the CPU backend has it (models/lora_set.py refuses adapters elsewhere)."""
        ...
