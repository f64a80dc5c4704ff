"""The CPU backend: what the model layer calls (models.backend.Backend), over the numba kernels
of this package and host numpy arrays. It decides which matrices the int8 kernel takes
(prepare_weights), owns the forward's scratch (make_workspace) and the KV pool's layout."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np

from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.formats.weight_types import TYPES

from . import (
    altup,
    attention,
    attention_tiles,
    encoder,
    kv_quant,
    kv_shift,
    lora,
    matmul,
    matmul_experts,
    matmul_i8,
    matmul_k,
    moe,
    ops,
    recurrent,
)
from .dequant import F32, KERNEL_TYPES, Q4_K
from .kv_quant import KV_BLOCK_TYPES, check_kv_type, rotation_size, row_bytes
from .repack_i8 import I8Weights, repack
from .repack_k import KWeights, repack_k
from .simd_i8 import GROUP
from .workspace import Workspace, i8_activation_buffers, i8_views, k_views, make_workspace

# int8 kernel (activations quantized per 32-block, integer dot products) for the types whose
# codes it takes as they are, in the roles their int8 form names (formats.weight_types): 4-, 5-
# and 8-bit layer matrices, a Q8_0 output matrix. Other types keep the float path (decoded
# blocks, float32 products).
I8_TYPES = {role: tuple(t.id for t in TYPES if t.i8 is not None and role in t.i8.roles)
            for role in ("layer", "output")}
# the K-quant int8 kernel (activations per 256 values, llama.cpp's Q8_K), any role; 256-wide rows
K_TYPES = tuple(t.id for t in TYPES if t.k is not None)
# f16 is stored as IEEE half bits; q8_0 as int8 with a float32 scale per (token, head)
KV_DTYPES = {"f16": np.uint16, "f32": np.float32}  # the float pools; the block types are kv_quant's
KVLayer = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # k_cache, k_scale, v_cache, v_scale

_NO_ROWS = np.empty((0, 1), np.uint8)  # an unused matrix slot of a three-matmul launch
_NO_I8 = (np.empty((0, 1, 256), np.uint8), np.empty((0, 1, 16), np.uint16), np.empty((0, 0, 0), np.uint16), 0, 4)
_NO_K = KWeights(np.empty((0, 1, 1), np.uint8), Q4_K).args  # zero groups: nothing is read
# an unused second matrix of an expert launch (zero groups or rows per expert)
_NO_EXPERT_K = KWeights(np.empty((1, 0, 1, 1), np.uint8), Q4_K).args
_NO_EXPERT_I8 = (np.empty((1, 0, 1, 256), np.uint8), np.empty((1, 0, 1, 16), np.uint16),
                 np.empty((1, 0, 0, 0), np.uint16), 0, 4)
_NO_EXPERT_ROWS = (np.empty((1, 0, 1), np.uint8), 0)
_NO_ROUTER = np.empty((0, 1), np.float32)  # logits given: the routing kernel multiplies nothing
_NO_BIAS = np.empty(0, np.float32)  # no selection bias


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [T, K] -> the int8 kernel's activations (see i8_activation_buffers)."""
    xq = i8_activation_buffers(*x.shape)
    matmul_i8.quantize_rows_q8(x, *xq)
    return xq


class CpuBackend:
    """Kernels run with n_threads threads: numba's thread count is set to it, capped by the
    threads numba started with (self.n_threads is what it got)."""

    name = "cpu"
    matrix_types = KERNEL_TYPES  # GGML types the matmuls compute with

    def __init__(self, n_threads: int) -> None:
        numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
        self.n_threads = numba.get_num_threads()

    # -- memory ------------------------------------------------------------------------------
    def prepare_weights(self, f: GGUFFile, matrices: Sequence[tuple[str, QMatrix]]) -> list[QMatrix]:
        """Each (role, matrix), role "layer" or "output", in the form the matmuls take: 4/5-bit
        layer matrices and a Q8_0 output matrix repacked for the int8 kernel, Q4_K / Q5_K / Q6_K
        matrices with 256-wide rows for the K-quant one; the copy then replaces the tensor's
        mmap'd pages (dropped here; a row lookup faults its page back). A stack of experts (data
        [E, R, row_bytes]) is repacked as one matrix of E * R rows when R is a multiple of the
        16-row groups, then viewed with a leading expert axis."""
        out = []
        for role, w in matrices:
            packed: I8Weights | KWeights | None = None
            n_exp = w.data.shape[0] if w.data.ndim == 3 else 0
            flat = w.data.reshape(-1, w.data.shape[-1])
            if n_exp and w.rows % GROUP:
                pass  # groups would straddle two experts: the float path
            elif w.qtype in I8_TYPES[role] and w.cols % 32 == 0:
                packed = repack(flat, w.qtype, flat.shape[0], w.cols)  # None: scales it cannot hold
            elif w.qtype in K_TYPES and w.cols % 256 == 0:
                packed = repack_k(flat, w.qtype, flat.shape[0], w.cols)
            if packed is not None and n_exp:
                packed = matmul_experts.stack_experts(packed, n_exp)
            if packed is not None:
                f.drop_pages(f.tensors[w.name])
                w = QMatrix(w.name, w.data, w.qtype, w.rows, w.cols, packed)
            out.append(w)
        return out

    def make_workspace(self, capacity: int, d_model: int, q_dim: int, kv_dim: int, ffn_dim: int,
                       experts: tuple[int, int, int] | None = None,
                       recurrent: tuple[int, ...] = (0, 0, 0, 0, 0), gated_attention: bool = False,
                       per_layer: int = 0, altup: tuple[int, int] = (0, 0)) -> Workspace:
        return make_workspace(capacity, d_model, q_dim, kv_dim, ffn_dim, experts, recurrent, gated_attention, per_layer,
                              altup)

    @staticmethod
    def kv_block_bytes(n_layers: int, n_kv_heads: int, head_dim: int, block_size: int, kv_dtype: str,
                       kv_dtype_v: str | None = None) -> int:
        """Bytes of K and V for one block across all layers (V of kv_dtype_v when given)."""
        per_head = sum(row_bytes(t, head_dim) for t in (kv_dtype, kv_dtype_v or kv_dtype))
        return n_layers * block_size * n_kv_heads * per_head

    def make_kv_pool(self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                     kv_dtype: str, kv_dtype_v: str | None = None) -> list[KVLayer]:
        """Per layer (k_cache, k_aux, v_cache, v_aux) in kernels_cpu.attention's layouts: for
        f16 / f32 v_cache [num_blocks, block_size, n_kv_heads, head_dim], k_cache [num_blocks,
        n_kv_heads, head_dim, block_size] (blocks transposed), aux empty float32; for a block
        type (kv_quant) uint8 [num_blocks, block_size, n_kv_heads, row bytes], aux int64 [2]
        its GGML type id and Hadamard rotation. V is of kv_dtype_v when given."""
        def part(t: str, key: bool) -> tuple[np.ndarray, np.ndarray]:
            if t in KV_BLOCK_TYPES:
                code, _ = KV_BLOCK_TYPES[t]
                return (np.zeros((num_blocks, block_size, n_kv_heads, row_bytes(t, head_dim)), np.uint8),
                        np.array([code, rotation_size(head_dim, key)], np.int64))
            shape = (num_blocks, n_kv_heads, head_dim, block_size) if key else (num_blocks, block_size, n_kv_heads,
                                                                                 head_dim)
            return np.zeros(shape, KV_DTYPES[t]), np.zeros((0, 0, 0), np.float32)

        for t in (kv_dtype, kv_dtype_v or kv_dtype):
            check_kv_type(t, head_dim)
        out = []
        for _ in range(n_layers):
            k, ka = part(kv_dtype, True)
            v, va = part(kv_dtype_v or kv_dtype, False)
            out.append((k, ka, v, va))
        return out

    def copy_blocks(self, kv: list[KVLayer], copies: list[tuple[int, int]]) -> None:
        """KV block copies (src, dst) in every layer (copy-on-write of a shared block)."""
        for src, dst in copies:
            for layer in kv:
                layer[0][dst] = layer[0][src]  # the aux arrays are per pool, not per block
                layer[2][dst] = layer[2][src]

    @staticmethod
    def shift_kv(layer: KVLayer, moves: np.ndarray, head_dim: int, n_rot: int, inv_freq: np.ndarray,
                 neox: bool) -> None:
        """A context shift's K/V row moves in one layer (kernels_cpu.kv_shift)."""
        kv_shift.shift_rows(layer, moves, head_dim, n_rot, inv_freq, neox)

    @staticmethod
    def make_state_pool(shapes: Sequence[Sequence[tuple[int, ...]]], num_slots: int) -> list[tuple[np.ndarray, ...]]:
        """Per recurrent layer a tuple of float32 [num_slots, *shape] (zeros: a sequence at
        position 0 starts from zero anyway)."""
        return [tuple(np.zeros((num_slots, *shape), np.float32) for shape in layer) for layer in shapes]

    @staticmethod
    def copy_states(states: list[tuple[np.ndarray, ...]], copies: list[tuple[int, int]]) -> None:
        """State slot copies (src, dst) in every recurrent layer."""
        for src, dst in copies:
            for layer in states:
                for a in layer:
                    a[dst] = a[src]

    short_conv = staticmethod(recurrent.short_conv_kernel)
    conv_silu = staticmethod(recurrent.conv_silu_kernel)
    ssm_scan = staticmethod(recurrent.ssm_scan_kernel)
    gated_group_rmsnorm = staticmethod(recurrent.gated_group_rmsnorm_kernel)
    delta_rule = staticmethod(recurrent.delta_rule_kernel)
    head_rmsnorm_gate = staticmethod(recurrent.head_rmsnorm_gate_kernel)
    split_gated_q = staticmethod(ops.split_gated_q_kernel)
    sigmoid_mul = staticmethod(ops.sigmoid_mul_kernel)

    # -- memory and the step's inputs and outputs (host arrays already) -----------------------
    @staticmethod
    def memory_available() -> int:
        import psutil

        return int(psutil.virtual_memory().available)

    @staticmethod
    def run_step(inp: Any, launch: Callable[[Any], np.ndarray], replayable: bool) -> np.ndarray:
        return launch(inp)

    @staticmethod
    def read_logits(logits: np.ndarray, whole: np.ndarray) -> tuple[np.ndarray, None, None]:
        return logits, None, None  # already on the host: every row, argmax left to the sampler

    @staticmethod
    def output_buffer(rows: int, cols: int) -> np.ndarray:
        return np.empty((rows, cols), np.float32)

    @staticmethod
    def to_host(x: np.ndarray, scratch: bool) -> np.ndarray:
        return np.array(x, dtype=np.float32) if scratch else x

    # -- compute -----------------------------------------------------------------------------
    def matmuls(self, x: np.ndarray, ws: Sequence[QMatrix], outs: Sequence[np.ndarray], work: Workspace) -> None:
        """outs[m] = x @ ws[m].T for one to three matrices of the same input: the int8 ones in
        one launch that also quantizes x (into the workspace), the K-quant ones in another
        (quantizing per 256), the float ones in a third."""
        n = x.shape[0]
        kq = [(w.packed, o) for w, o in zip(ws, outs) if isinstance(w.packed, KWeights)]
        if kq:
            args_k: list[object] = [x, *k_views(work, n, x.shape[1])]
            for kw, o in kq:
                args_k += [*kw.args, o]
            for _ in range(3 - len(kq)):
                args_k += [*_NO_K, work.no_out[:n]]
            matmul_k.matmul3_k_kernel(*args_k, self.n_threads)
        i8 = [(w.packed, o) for w, o in zip(ws, outs) if isinstance(w.packed, I8Weights)]
        if i8:
            args: list[object] = [x, *i8_views(work, n, x.shape[1])]
            for iw, o in i8:
                args += [*iw.args, o]
            for _ in range(3 - len(i8)):
                args += [*_NO_I8, work.no_out[:n]]
            matmul_i8.matmul3_i8_kernel(*args, self.n_threads)
        fl = [(w, o) for w, o in zip(ws, outs) if w.packed is None]
        if fl:
            args = []
            for w, o in fl:
                args += [w.data, w.qtype, o]
            for _ in range(3 - len(fl)):
                args += [_NO_ROWS, 0, work.no_out[:n]]
            matmul.matmul3_kernel(x, *args, self.n_threads)

    def lora_add(self, x: np.ndarray, *groups_tables: np.ndarray, parallel: bool) -> None:
        """kernels_cpu/lora.py's update of out (the last array) for each row's adapters, split over
        the threads when `parallel` (a launch costs more than a decode row's small update)."""
        if parallel:
            lora.lora_kernel(x, *groups_tables, self.n_threads)
        else:
            lora.lora_serial_kernel(x, *groups_tables)

    # -- mixture of experts (kernels_cpu.moe, matmul_experts) --------------------------------
    def route_experts(self, router: QMatrix, x: np.ndarray, norm: bool, work: Workspace, gating: int = moe.SOFTMAX,
                      bias: np.ndarray = _NO_BIAS, logits: np.ndarray | None = None) -> None:
        """Each token's experts and weights from its router logits x @ router.T [N, E] (an F32
        router inside the routing kernel, others by a matmul first, or given; gating: moe.SOFTMAX,
        SIGMOID or SOFTMAX_WEIGHT, ranked with a selection bias f32 [E] when given), the pairs
        grouped by expert and x [N, D] gathered into work.moe.xg [N * k, D]."""
        m = work.moe
        assert m is not None  # allocated for a model with experts
        n, k = x.shape[0], m.sel.shape[1]
        if logits is not None:  # computed by the caller (smallthinker: from the layer's input)
            r = _NO_ROUTER
        elif router.qtype == F32 and router.packed is None:
            logits = m.logits[:n]
            r = router.data.view(np.float32)
        else:
            logits = m.logits[:n]
            self.matmuls(x, (router,), (logits,), work)
            r = _NO_ROUTER
        moe.route_kernel(logits, r, norm, gating, bias, x, m.sel[:n], m.wts[:n], m.offsets, m.pair_token[: n * k], m.pair_of[:n],
                         m.xg[: n * k])

    def expert_matmuls(self, x: np.ndarray, ws: Sequence[QMatrix], outs: Sequence[np.ndarray], work: Workspace) -> None:
        """outs[m][p] = x[p] @ ws[m][e].T for each pair p of expert e (route_experts' grouping),
        for one or two expert stacks; each form in one launch that reads only the chosen experts."""
        m = work.moe
        assert m is not None  # allocated for a model with experts
        n, width = x.shape
        kq = [(w.packed, o) for w, o in zip(ws, outs) if isinstance(w.packed, KWeights)]
        if kq:
            args_k: list[object] = [x, *k_views(m, n, width), m.offsets]
            for kw, o in kq:
                args_k += [*kw.args, o]
            if len(kq) == 1:
                args_k += [*_NO_EXPERT_K, m.y[:n, :0]]
            matmul_experts.expert_matmul2_k_kernel(*args_k, self.n_threads)
        i8 = [(w.packed, o) for w, o in zip(ws, outs) if isinstance(w.packed, I8Weights)]
        if i8:
            args: list[object] = [x, *i8_views(m, n, width), m.offsets]
            for iw, o in i8:
                args += [*iw.args, o]
            if len(i8) == 1:
                args += [*_NO_EXPERT_I8, m.y[:n, :0]]
            matmul_experts.expert_matmul2_i8_kernel(*args, self.n_threads)
        fl = [(w, o) for w, o in zip(ws, outs) if w.packed is None]
        if fl:
            args = [x, m.offsets]
            for w, o in fl:
                args += [w.data, w.qtype, o]
            if len(fl) == 1:
                args += [*_NO_EXPERT_ROWS, m.y[:n, :0]]
            matmul_experts.expert_matmul2_kernel(*args, self.n_threads)

    def combine_experts(self, y: np.ndarray, out: np.ndarray, work: Workspace) -> None:
        """out[t] = sum over the token's choices j of weight_j * y[its pair j]."""
        m = work.moe
        assert m is not None  # allocated for a model with experts
        n = out.shape[0]
        moe.combine_kernel(y, m.pair_of[:n], m.wts[:n], out)

    gated_add = staticmethod(moe.gated_add_kernel)

    def embed(self, tokens: np.ndarray, emb: QMatrix, scale: np.float32, out: np.ndarray) -> None:
        """out[i] = row tokens[i] of the embedding, times scale."""
        matmul.embed_rows_kernel(tokens, emb.data, emb.qtype, out)
        if scale != 1.0:
            ops.scale_kernel(out, scale)

    def qkv_finish(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, bq: np.ndarray, bk: np.ndarray,
                   bv: np.ndarray, q_norm: np.ndarray, k_norm: np.ndarray, n_rot: int, positions: np.ndarray,
                   inv_freq: np.ndarray, mscale: float, neox: bool, eps: np.float32, slot_mapping: np.ndarray,
                   kv: KVLayer) -> None:
        attention.qkv_finish_kernel(q, k, v, bq, bk, bv, q_norm, k_norm, n_rot, positions, inv_freq, mscale, neox, eps,
                                    slot_mapping, *kv)

    def attention(self, q: np.ndarray, kv: KVLayer, block_tables: np.ndarray, token_seq: np.ndarray,
                  positions: np.ndarray, scale: np.float32, window: int, softcap: np.float32,
                  out: np.ndarray, sinks: np.ndarray = _NO_BIAS) -> None:
        """sinks f32 [n_heads]: gpt-oss's attention sinks ([0]: none)."""
        k_cache, k_scale, v_cache, v_scale = kv
        if k_scale.dtype == np.int64 and k_scale[1]:  # K stored rotated (kv_quant): Q rotated alike
            kv_quant.hadamard_rows_kernel(q, int(k_scale[1]))
        attention_tiles.paged_attention_kernel(q, k_cache, k_scale, v_cache, v_scale, block_tables, token_seq, positions,
                                         scale, window, softcap, sinks, out, self.n_threads)
        if v_scale.dtype == np.int64 and v_scale[1]:  # V stored rotated: the output rotated back
            kv_quant.hadamard_rows_kernel(out, int(v_scale[1]))

    rmsnorm = staticmethod(ops.rmsnorm_kernel)
    add_rmsnorm = staticmethod(ops.add_rmsnorm_kernel)
    silu_mul = staticmethod(ops.silu_mul_kernel)
    gelu_mul = staticmethod(ops.gelu_mul_kernel)
    relu_sqr = staticmethod(ops.relu_sqr_kernel)
    relu_mul = staticmethod(ops.relu_mul_kernel)
    swiglu_oai = staticmethod(ops.swiglu_oai_kernel)

    @staticmethod
    def expert_bias(y: np.ndarray, bias: np.ndarray, work: Workspace) -> None:
        """y [P, F] += each pair's expert's bias row (bias f32 [E, F])."""
        assert work.moe is not None
        moe.expert_bias_kernel(y, bias, work.moe.offsets)
    xielu = staticmethod(ops.xielu_kernel)

    # gemma3n's AltUp streams and activation sparsity (kernels_cpu.altup)
    altup_predict = staticmethod(altup.altup_predict_kernel)
    altup_correct = staticmethod(altup.altup_correct_kernel)
    match_norm = staticmethod(altup.match_norm_kernel)
    unembed_mean = staticmethod(altup.unembed_mean_kernel)
    gaussian_topk = staticmethod(altup.gaussian_topk_kernel)
    mul_rows = staticmethod(altup.mul_rows_kernel)

    # bidirectional encoders (kernels_cpu.encoder)
    layernorm = staticmethod(encoder.layernorm_kernel)
    add_layernorm = staticmethod(encoder.add_layernorm_kernel)
    input_layernorm = staticmethod(encoder.input_layernorm_kernel)
    bias_gelu = staticmethod(encoder.bias_gelu_kernel)
    softmax_rows = staticmethod(encoder.softmax_rows_kernel)
    kernel_threads = staticmethod(encoder.kernel_threads)
    widen_rows = staticmethod(encoder.widen_rows_kernel)

    def encoder_attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, seq_start: np.ndarray,
                          seq_end: np.ndarray, head_dim: int, scale: np.float32, slopes: np.ndarray, window: int,
                          out: np.ndarray) -> None:
        encoder.encoder_attention_kernel(q, k, v, seq_start, seq_end, head_dim, scale, slopes, window, self.n_threads,
                                         out)

    @staticmethod
    def expert_scale(n: int, scale: np.ndarray, work: Workspace) -> None:
        """The first n tokens' expert weights times their expert's scale f32 [E]."""
        assert work.moe is not None
        moe.expert_scale_kernel(work.moe.wts[:n], work.moe.sel[:n], scale)

    @staticmethod
    def take_rows(x: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        """out[i] = x[rows[i]] (rows are in range: clip mode writes out directly, unbuffered)."""
        np.take(x, rows, axis=0, out=out, mode="clip")

    @staticmethod
    def scale(x: np.ndarray, factor: np.float32) -> None:
        """x *= factor, in place."""
        ops.scale_kernel(x, factor)

    @staticmethod
    def add(h: np.ndarray, delta: np.ndarray) -> None:
        """h += delta, in place (a residual add with no norm after it)."""
        np.add(h, delta, out=h)

    @staticmethod
    def softcap(x: np.ndarray, cap: np.float32) -> None:
        """x = tanh(x / cap) * cap, in place."""
        np.divide(x, cap, out=x)
        np.tanh(x, out=x)
        np.multiply(x, cap, out=x)
