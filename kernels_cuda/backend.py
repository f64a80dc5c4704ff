"""The CUDA backend: the methods of models.backend.Backend over numba.cuda device arrays. Weights
are repacked on the host (layout.py) and uploaded once; the KV pool and the forward's workspace
live on the device; a step uploads its inputs in one copy (run_step), replays a recorded forward
when it is a decode or verification step (graphs.py), and copies back only what the sampler
reads (read_logits: every row's argmax, whole rows only where asked). Launches and copies go to
one stream. Norm weights, biases and RoPE tables are uploaded on first use."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from edge_infer.errors import InvalidRequest, UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.kernels_cpu.dequant import KERNEL_TYPES
from edge_infer.kernels_cpu.workspace import Workspace, workspace_shapes

from . import attention, matmul, ops
from .graphs import PackedInputs, StepGraph, StepGraphs
from .intrinsics import SIMULATOR
from .layout import to_host_matrix

KV_DTYPES = {"f16": np.float16, "f32": np.float32}
KV_SHARE = 0.8  # of the device memory free after the weights
SIMULATOR_MEMORY = 64 * 2**20
_NO_RECURRENT = ("device='cuda' has no recurrent-layer, gated-attention or per-layer-embedding kernels (hybrid "
                 "models, gemma4); use device='cpu'")


@dataclass(slots=True)
class DeviceMatrix:
    """A matrix on the device in layout.py's form: kind "codes" (q4 int32 [R, K/4] and its int8
    view q8 [R, K], s and o float32 [R, K/16]), "nibbles" (q4 int32 [R, K/8] and its uint8 view
    q8 [R, K/2], s, o, off) or "float" (f float16/float32 [R, K])."""

    kind: str
    q4: Any = None
    q8: Any = None
    s: Any = None
    o: Any = None
    f: Any = None
    nbytes: int = 0
    off: int = 0


def _upload(m: Any) -> DeviceMatrix:
    if m.kind in ("codes", "nibbles"):
        q = cuda.to_device(m.q)
        s, o = cuda.to_device(m.s), cuda.to_device(m.o)
        return DeviceMatrix(m.kind, q.view(np.int32), q, s, o, nbytes=m.q.nbytes + m.s.nbytes + m.o.nbytes, off=m.off)
    return DeviceMatrix("float", f=cuda.to_device(m.f), nbytes=m.f.nbytes)


def _elem_grid(x: Any) -> tuple[int, int]:
    return x.shape[0], (x.shape[1] + ops.ELEM_THREADS - 1) // ops.ELEM_THREADS


class CudaBackend:
    """One CUDA device (numba's current one). Refuses what it has no kernel for by name."""

    name = "cuda"
    matrix_types = KERNEL_TYPES

    def __init__(self, graphs: bool = True) -> None:
        """graphs: replay decode and verification steps from recorded forwards (graphs.py)."""
        name = getattr(cuda.get_current_device(), "name", "numba's CUDA simulator")
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.n_threads = 1
        self._forms: dict[int, tuple[Any, DeviceMatrix]] = {}  # id(GGUF data) -> (data, device form)
        self._vectors: dict[int, tuple[Any, Any]] = {}  # id(host array) -> (array, device copy)
        self._max_pos = 0  # the step's largest position (how many attention partitions it launches)
        self._stream = cuda.stream()  # every launch and copy of a step, in order
        self._steps = StepGraphs(graphs)  # recorded forwards and the buffers they share
        self._ids = cuda.device_array(64, np.int32)  # read_logits' argmax results

    def _k(self, kernel: Any, grid: Any, block: Any) -> Any:
        """kernel[grid, block] on the step's stream, or recorded while a graph is being made."""
        if self._steps.recording is not None:
            return self._steps.recording.recorder(kernel, grid, block)
        return kernel[grid, block, self._stream]

    @property
    def weight_bytes(self) -> int:
        """Bytes of the uploaded matrices in the device's form (what a decode step reads)."""
        return sum(m.nbytes for _, m in self._forms.values())

    @property
    def graph_replays(self) -> int:
        """Steps run by replaying a recorded forward so far (the tests' and benchmarks' check)."""
        return self._steps.replays

    # -- memory ------------------------------------------------------------------------------
    def memory_available(self) -> int:
        """Free device memory, bytes (what the KV pool is sized from)."""
        free, _total = cuda.current_context().get_memory_info()
        if not np.isfinite(free):  # numba's simulator reports infinite memory
            return SIMULATOR_MEMORY
        return int(free * KV_SHARE)

    def prepare_weights(self, f: GGUFFile, matrices: Sequence[tuple[str, QMatrix]]) -> list[QMatrix]:
        out = []
        for _role, w in matrices:
            if w.data.ndim == 3:
                raise UnsupportedModelError(f"{w.name}: device='cuda' has no mixture-of-experts kernels "
                                            "(route_experts, expert_matmuls); use device='cpu'")
            out.append(QMatrix(w.name, w.data, w.qtype, w.rows, w.cols, self._form(w)))
        return out

    def _form(self, w: QMatrix) -> DeviceMatrix:
        got = self._forms.get(id(w.data))
        if got is None:
            got = (w.data, _upload(to_host_matrix(w.data, w.qtype, w.rows, w.cols)))
            self._forms[id(w.data)] = got
        return got[1]

    def _dev(self, a: Any) -> Any:
        """A device copy of host array `a` (made once per array), or `a` when on the device."""
        if not isinstance(a, np.ndarray):
            return a
        got = self._vectors.get(id(a))
        if got is None:
            got = (a, cuda.to_device(np.ascontiguousarray(a)))
            self._vectors[id(a)] = got
        return got[1]

    def make_workspace(self, capacity: int, d_model: int, q_dim: int, kv_dim: int, ffn_dim: int,
                       experts: tuple[int, int, int] | None = None,
                       recurrent: tuple[int, ...] = (0, 0, 0, 0, 0), gated_attention: bool = False,
                       per_layer: int = 0, altup: tuple[int, int] = (0, 0)) -> Workspace:
        if experts is not None:
            raise UnsupportedModelError("device='cuda' has no mixture-of-experts kernels; use device='cpu'")
        if any(recurrent) or gated_attention or per_layer or any(altup):
            raise UnsupportedModelError(_NO_RECURRENT)
        self._steps.invalidate()  # recorded forwards hold the old workspace's addresses
        # The kernels slice the activation codes [:n, :K/g] (per_row) and keep no block sums.
        shapes = workspace_shapes(capacity, d_model, q_dim, kv_dim, ffn_dim, per_row=True)
        shapes["xsum"] = ((0, 0), np.int32)
        return Workspace.allocate(cuda.device_array, capacity, shapes)

    @staticmethod
    def kv_block_bytes(n_layers: int, n_kv_heads: int, head_dim: int, block_size: int, kv_dtype: str,
                       kv_dtype_v: str | None = None) -> int:
        if kv_dtype not in KV_DTYPES or (kv_dtype_v or kv_dtype) != kv_dtype:
            raise InvalidRequest(f"kv_cache_dtype {kv_dtype!r} / kv_cache_dtype_v {kv_dtype_v!r} are not available on "
                                 "device='cuda' (f16 or f32, the same for K and V)")
        return 2 * n_layers * block_size * n_kv_heads * head_dim * np.dtype(KV_DTYPES[kv_dtype]).itemsize

    def make_kv_pool(self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                     kv_dtype: str, kv_dtype_v: str | None = None) -> list[Any]:
        self.kv_block_bytes(n_layers, n_kv_heads, head_dim, block_size, kv_dtype, kv_dtype_v)
        if head_dim > attention.MAX_HD:
            raise UnsupportedModelError(f"head_dim {head_dim} > {attention.MAX_HD}: no CUDA attention kernel for it")
        self._block_size = block_size
        shape, dt = (num_blocks, block_size, n_kv_heads, head_dim), KV_DTYPES[kv_dtype]
        none = cuda.device_array((0, 0, 0), np.float32)
        return [(cuda.to_device(np.zeros(shape, dt)), none, cuda.to_device(np.zeros(shape, dt)), none)
                for _ in range(n_layers)]

    def shift_kv(self, layer: Any, moves: Any, head_dim: int, n_rot: int, inv_freq: Any, neox: bool) -> None:
        raise UnsupportedModelError("context shift runs on the CPU backend")  # engine/device.py refuses it first

    def make_state_pool(self, shapes: Sequence[Sequence[tuple[int, ...]]], num_slots: int) -> list[Any]:
        raise UnsupportedModelError(_NO_RECURRENT)  # engine/device.py refuses hybrids first

    def copy_states(self, states: list[Any], copies: list[tuple[int, int]]) -> None:
        raise UnsupportedModelError(_NO_RECURRENT)

    def short_conv(self, *args: Any) -> None:
        raise UnsupportedModelError(_NO_RECURRENT)

    conv_silu = ssm_scan = gated_group_rmsnorm = delta_rule = head_rmsnorm_gate = split_gated_q = sigmoid_mul = short_conv
    relu_sqr = xielu = relu_mul = swiglu_oai = expert_bias = expert_scale = short_conv  # refused by cuda_lacks first
    altup_predict = altup_correct = match_norm = unembed_mean = gaussian_topk = mul_rows = short_conv

    def copy_blocks(self, kv: list[Any], copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        pairs = cuda.to_device(np.asarray(copies, np.int32).reshape(-1, 2))
        for k_cache, _, v_cache, _ in kv:
            self._k(attention.copy_blocks_kernel, len(copies), 128)(k_cache, v_cache, pairs)

    # -- the step: inputs in, forward (eager or replayed), logits out -------------------------
    def run_step(self, inp: Any, launch: Callable[[Any], Any], replayable: bool) -> Any:
        """launch(device StepInputs) -> device result, after the step's one host-to-device copy.
        A replayable step (every token's logits wanted) of up to graphs.BUCKETS[-1] tokens is
        padded to its bucket and replayed from a recorded forward (recorded on first sight)."""
        n = inp.tokens.shape[0]
        max_pos = int(inp.positions.max()) if n else 0
        key = self._steps.key(n, max_pos, replayable)
        if key is None:
            seqs, width = inp.block_tables.shape  # [S, max_blocks]
            packed = PackedInputs(n, inp.logits_rows.shape[0], seqs, width, pinned=False)
            packed.fill(inp)
            packed.upload(self._stream)
            self._max_pos = max_pos
            return launch(type(inp)(*packed.device))
        g = self._steps.graphs.get(key)
        while g is None:
            b, parts = key
            g = StepGraph(b, parts, PackedInputs(b, b, b, -(-parts * attention.PART // self._block_size),
                                                 pinned=not SIMULATOR))
            self._max_pos, self._steps.recording, generation = parts * attention.PART - 1, g, self._steps.generation
            try:
                g.output = launch(type(inp)(*g.inputs.device))  # records the launches, runs nothing
            finally:
                self._steps.recording = None
            if self._steps.generation != generation:  # a shared buffer grew while recording: again
                g = None
                continue
            g.build()
            self._steps.graphs[key] = g
        g.inputs.fill(inp)
        g.inputs.upload(self._stream)
        g.replay(self._stream)
        self._steps.replays += 1
        return g.output

    def output_buffer(self, rows: int, cols: int) -> Any:
        if self._steps.recording is not None:  # a recorded forward's result: the shared logits
            return self._steps.shared("logits", (rows, cols))
        return cuda.device_array((rows, cols), np.float32)

    def to_host(self, x: Any, scratch: bool = False) -> np.ndarray:
        """A host copy of device array x, once the step's launches are done."""
        out: np.ndarray = x.copy_to_host(stream=self._stream)
        self._stream.synchronize()
        return out

    def read_logits(self, x: Any, whole: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Device logits x [M, V] -> (the rows where `whole` [M] bool is set, float32 [H, V] on
        the host; where [M]: each row's index in them or -1; argmax of every row, int32 [M]):
        greedy rows cross as one int each, not V floats."""
        m = x.shape[0]
        if self._ids.shape[0] < m:  # grown, not allocated per step: this runs every step
            self._ids = cuda.device_array(max(m, 2 * self._ids.shape[0]), np.int32)
        ids = self._ids[:m]
        self._k(ops.argmax_kernel, m, ops.ROW_THREADS)(x, ids)
        greedy = ids.copy_to_host(stream=self._stream)
        idx = np.flatnonzero(whole)
        where = np.full(m, -1, np.int64)
        where[idx] = np.arange(idx.size)
        rows = np.empty((idx.size, x.shape[1]), np.float32)
        at = 0
        while at < idx.size:  # runs of consecutive rows, one copy each
            end = at + 1
            while end < idx.size and idx[end] == idx[end - 1] + 1:
                end += 1
            rows[at:end] = x[idx[at] : idx[end - 1] + 1].copy_to_host(stream=self._stream)
            at = end
        self._stream.synchronize()
        return rows, where, greedy

    # -- compute -----------------------------------------------------------------------------
    def matmuls(self, x: Any, ws: Sequence[QMatrix], outs: Sequence[Any], work: Workspace) -> None:
        n, width = x.shape
        quantized = False
        for w, o in zip(ws, outs):
            m = w.packed if isinstance(w.packed, DeviceMatrix) else self._form(w)
            if m.kind != "float":
                xq4, xd, xs16 = work.xq4[:n, : width // 4], work.xd[:n, : width // 32], work.xs16[:n, : width // 16]
                if not quantized:
                    self._k(matmul.quantize_q8_kernel, n, 32)(x, xq4, xd, xs16)
                    quantized = True
                self._k(matmul.matmul_codes_kernel, w.rows, matmul.THREADS)(
                    xq4, xd, xs16, m.q4, m.kind == "nibbles", m.off, m.s, m.o, o)
            else:
                self._k(matmul.matmul_float_kernel, w.rows, matmul.THREADS)(x, m.f, o)

    def embed(self, tokens: Any, emb: QMatrix, scale: Any, out: Any) -> None:
        m = self._form(emb)
        if m.kind == "codes":
            self._k(matmul.embed_codes_kernel, tokens.shape[0], 128)(tokens, m.q8, m.s, m.o, np.float32(scale), out)
        elif m.kind == "nibbles":
            self._k(matmul.embed_nibbles_kernel, tokens.shape[0], 128)(
                tokens, m.q8, m.off, m.s, m.o, np.float32(scale), out)
        else:
            self._k(matmul.embed_float_kernel, tokens.shape[0], 128)(tokens, m.f, np.float32(scale), out)

    def qkv_finish(self, q: Any, k: Any, v: Any, bq: Any, bk: Any, bv: Any, q_norm: Any, k_norm: Any, n_rot: int,
                   positions: Any, inv_freq: Any, mscale: float, neox: bool, eps: Any, slot_mapping: Any,
                   kv: Any) -> None:
        d = self._dev
        self._k(attention.qkv_finish_kernel, q.shape[0], attention.ROW)(
            q, k, v, d(bq), d(bk), d(bv), d(q_norm), d(k_norm), n_rot, positions, d(inv_freq), float(mscale),
            bool(neox), np.float32(eps), slot_mapping, kv[0], kv[2])

    def attention(self, q: Any, kv: Any, block_tables: Any, token_seq: Any, positions: Any, scale: Any,
                  window: int, softcap: Any, out: Any, sinks: Any = None) -> None:
        if sinks is not None and len(sinks):
            raise UnsupportedModelError("device='cuda' has no attention-sink kernel")  # cuda_lacks refuses first
        n, hd = q.shape[0], kv[0].shape[3]
        heads, parts = q.shape[1] // hd, self._max_pos // attention.PART + 1
        pm, pl, pa = self._part_scratch((n, heads, parts, hd))
        self._k(attention.attention_part_kernel, (n, heads, parts), attention.KEYS)(
            q, kv[0], kv[2], block_tables, token_seq, positions, np.float32(scale), int(window), np.float32(softcap),
            pm, pl, pa)
        self._k(attention.attention_combine_kernel, (n, heads), 64)(pm, pl, pa, out)

    def _part_scratch(self, need: tuple[int, int, int, int]) -> tuple[Any, Any, Any]:
        """Attention partials: max and sum [N, H, P], acc [N, H, P, hd] (shared buffers)."""
        s = self._steps.shared
        return s("part_m", need[:3]), s("part_l", need[:3]), s("part_acc", need)

    def rmsnorm(self, x: Any, w: Any, eps: Any, out: Any) -> None:
        self._k(ops.rmsnorm_kernel, x.shape[0], ops.ROW_THREADS)(x, self._dev(w), np.float32(eps), out)

    def add_rmsnorm(self, h: Any, delta: Any, w: Any, eps: Any, out: Any) -> None:
        self._k(ops.add_rmsnorm_kernel, h.shape[0], ops.ROW_THREADS)(h, delta, self._dev(w), np.float32(eps), out)

    def silu_mul(self, gate: Any, up: Any, out: Any) -> None:
        self._k(ops.silu_mul_kernel, _elem_grid(gate), ops.ELEM_THREADS)(gate, up, out)

    def gelu_mul(self, gate: Any, up: Any, out: Any) -> None:
        self._k(ops.gelu_mul_kernel, _elem_grid(gate), ops.ELEM_THREADS)(gate, up, out)

    def take_rows(self, x: Any, rows: Any, out: Any) -> None:
        if len(x.shape) == 1:
            self._k(ops.take_ids_kernel, (out.shape[0] + 63) // 64, 64)(x, rows, out)
        else:
            self._k(ops.take_rows_kernel, out.shape[0], 128)(x, rows, out)

    def softcap(self, x: Any, cap: Any) -> None:
        self._k(ops.softcap_kernel, _elem_grid(x), ops.ELEM_THREADS)(x, np.float32(cap))

    def scale(self, x: Any, factor: Any) -> None:
        self._k(ops.scale_kernel, _elem_grid(x), ops.ELEM_THREADS)(x, np.float32(factor))

    def add(self, h: Any, delta: Any) -> None:
        self._k(ops.add_kernel, _elem_grid(h), ops.ELEM_THREADS)(h, delta)

    def route_experts(self, *args: Any) -> None:
        raise UnsupportedModelError("device='cuda' has no route_experts kernel")

    expert_matmuls = combine_experts = gated_add = route_experts
