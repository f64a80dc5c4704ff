"""The CUDA backend: the methods of models.backend.Backend over numba.cuda device arrays. Weights
are repacked on the host (layout.py) and uploaded once; the KV pool and the forward's workspace
live on the device; a step uploads its inputs once (upload_inputs) and copies back only the
logits it returns (to_host). Norm weights, biases and RoPE tables are uploaded on first use."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from edge_infer.errors import InvalidRequest, UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.kernels_cpu.dequant import KERNEL_TYPES
from edge_infer.kernels_cpu.workspace import Workspace

from . import attention, matmul, ops
from .layout import to_host_matrix

KV_DTYPES = {"f16": np.float16, "f32": np.float32}
KV_SHARE = 0.8  # of the device memory free after the weights
SIMULATOR_MEMORY = 64 * 2**20


@dataclass(slots=True)
class DeviceMatrix:
    """A matrix on the device in layout.py's form: kind "codes" (q4 int32 [R, K/4] and its int8
    view q8 [R, K], s and o float32 [R, K/16]) or "float" (f float16/float32 [R, K])."""

    kind: str
    q4: Any = None
    q8: Any = None
    s: Any = None
    o: Any = None
    f: Any = None
    nbytes: int = 0


def _upload(m: Any) -> DeviceMatrix:
    if m.kind == "codes":
        q = cuda.to_device(m.q)
        s, o = cuda.to_device(m.s), cuda.to_device(m.o)
        return DeviceMatrix("codes", q.view(np.int32), q, s, o, nbytes=m.q.nbytes + m.s.nbytes + m.o.nbytes)
    return DeviceMatrix("float", f=cuda.to_device(m.f), nbytes=m.f.nbytes)


def _elem_grid(x: Any) -> tuple[int, int]:
    return x.shape[0], (x.shape[1] + ops.ELEM_THREADS - 1) // ops.ELEM_THREADS


class CudaBackend:
    """One CUDA device (numba's current one). Refuses what it has no kernel for by name."""

    name = "cuda"
    matrix_types = KERNEL_TYPES

    def __init__(self) -> None:
        name = getattr(cuda.get_current_device(), "name", "numba's CUDA simulator")
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.n_threads = 1
        self._forms: dict[int, tuple[Any, DeviceMatrix]] = {}  # id(GGUF data) -> (data, device form)
        self._vectors: dict[int, tuple[Any, Any]] = {}  # id(host array) -> (array, device copy)
        self._parts: Any = None  # attention partition scratch (m, l, acc), grown on demand
        self._max_pos = 0

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
                                            "(route_experts, expert_matmuls); use device='cpu'")  # fmt: skip
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
                       experts: tuple[int, int, int] | None = None) -> Workspace:
        if experts is not None:
            raise UnsupportedModelError("device='cuda' has no mixture-of-experts kernels; use device='cpu'")
        t, k_max = capacity, max(d_model, q_dim, ffn_dim)

        def f32(*shape: int) -> Any:
            return cuda.device_array(shape, np.float32)

        return Workspace(
            t, f32(t, d_model), f32(t, d_model), f32(t, q_dim), f32(t, kv_dim), f32(t, kv_dim), f32(t, q_dim),
            f32(t, d_model), f32(t, d_model), f32(t, ffn_dim), f32(t, ffn_dim), f32(t, ffn_dim), f32(t, q_dim),
            f32(t, d_model), f32(t, d_model), cuda.device_array(t, np.int32), cuda.device_array(t, np.int32),
            cuda.device_array((t, k_max // 4), np.int32), f32(t, k_max // 32), cuda.device_array((0, 0), np.int32),
            cuda.device_array((t, k_max // 16), np.int32), f32(t, 0),
        )  # fmt: skip

    @staticmethod
    def kv_block_bytes(n_layers: int, n_kv_heads: int, head_dim: int, block_size: int, kv_dtype: str) -> int:
        if kv_dtype not in KV_DTYPES:
            raise InvalidRequest(f"kv_cache_dtype {kv_dtype!r} is not available on device='cuda' (f16, f32)")
        return 2 * n_layers * block_size * n_kv_heads * head_dim * np.dtype(KV_DTYPES[kv_dtype]).itemsize

    def make_kv_pool(self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                     kv_dtype: str) -> list[Any]:
        if head_dim > attention.MAX_HD:
            raise UnsupportedModelError(f"head_dim {head_dim} > {attention.MAX_HD}: no CUDA attention kernel for it")
        shape, dt = (num_blocks, block_size, n_kv_heads, head_dim), KV_DTYPES[kv_dtype]
        none = cuda.device_array((0, 0, 0), np.float32)
        return [(cuda.to_device(np.zeros(shape, dt)), none, cuda.to_device(np.zeros(shape, dt)), none)
                for _ in range(n_layers)]  # fmt: skip

    def copy_blocks(self, kv: list[Any], copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        pairs = cuda.to_device(np.asarray(copies, np.int32).reshape(-1, 2))
        for k_cache, _, v_cache, _ in kv:
            attention.copy_blocks_kernel[len(copies), 128](k_cache, v_cache, pairs)

    # -- the step's inputs and outputs --------------------------------------------------------
    def upload_inputs(self, inp: Any) -> Any:
        """The step's token-level arrays on the device (one copy each), as a new StepInputs."""
        self._max_pos = int(inp.positions.max()) if inp.positions.size else 0
        return type(inp)(*(cuda.to_device(np.ascontiguousarray(a)) for a in (
            inp.tokens, inp.positions, inp.slot_mapping, inp.token_seq, inp.block_tables, inp.logits_rows)))

    @staticmethod
    def output_buffer(rows: int, cols: int) -> Any:
        return cuda.device_array((rows, cols), np.float32)

    @staticmethod
    def to_host(x: Any, scratch: bool = False) -> np.ndarray:
        """A host copy of device array x (the step's one device-to-host copy)."""
        out: np.ndarray = x.copy_to_host()
        cuda.synchronize()
        return out

    # -- compute -----------------------------------------------------------------------------
    def matmuls(self, x: Any, ws: Sequence[QMatrix], outs: Sequence[Any], work: Workspace) -> None:
        n, width = x.shape
        quantized = False
        for w, o in zip(ws, outs):
            m = w.packed if isinstance(w.packed, DeviceMatrix) else self._form(w)
            if m.kind == "codes":
                xq4, xd, xs16 = work.xq4[:n, : width // 4], work.xd[:n, : width // 32], work.xs16[:n, : width // 16]
                if not quantized:
                    matmul.quantize_q8_kernel[n, 32](x, xq4, xd, xs16)
                    quantized = True
                matmul.matmul_codes_kernel[w.rows, matmul.THREADS](xq4, xd, xs16, m.q4, m.s, m.o, o)
            else:
                matmul.matmul_float_kernel[w.rows, matmul.THREADS](x, m.f, o)

    def embed(self, tokens: Any, emb: QMatrix, scale: Any, out: Any) -> None:
        m = self._form(emb)
        if m.kind == "codes":
            matmul.embed_codes_kernel[tokens.shape[0], 128](tokens, m.q8, m.s, m.o, np.float32(scale), out)
        else:
            matmul.embed_float_kernel[tokens.shape[0], 128](tokens, m.f, np.float32(scale), out)

    def qkv_finish(self, q: Any, k: Any, v: Any, bq: Any, bk: Any, bv: Any, q_norm: Any, k_norm: Any, n_rot: int,
                   positions: Any, inv_freq: Any, mscale: float, neox: bool, eps: Any, slot_mapping: Any,
                   kv: Any) -> None:
        d = self._dev
        attention.qkv_finish_kernel[q.shape[0], attention.ROW](
            q, k, v, d(bq), d(bk), d(bv), d(q_norm), d(k_norm), n_rot, positions, d(inv_freq), float(mscale),
            bool(neox), np.float32(eps), slot_mapping, kv[0], kv[2])

    def attention(self, q: Any, kv: Any, block_tables: Any, token_seq: Any, positions: Any, scale: Any,
                  window: int, softcap: Any, out: Any) -> None:
        n, hd = q.shape[0], kv[0].shape[3]
        heads, parts = q.shape[1] // hd, self._max_pos // attention.PART + 1
        need = (n, heads, parts, hd)
        if self._parts is None or any(a < b for a, b in zip(self._parts[2].shape, need)):
            grow = tuple(max(a, b) for a, b in zip(self._parts[2].shape, need)) if self._parts else need
            self._parts = (cuda.device_array(grow[:3], np.float32), cuda.device_array(grow[:3], np.float32),
                           cuda.device_array(grow, np.float32))  # fmt: skip
        pm, pl, pa = (a[:n, :heads, :parts] for a in self._parts)
        attention.attention_part_kernel[(n, heads, parts), attention.KEYS](
            q, kv[0], kv[2], block_tables, token_seq, positions, np.float32(scale), int(window), np.float32(softcap),
            pm, pl, pa)
        attention.attention_combine_kernel[(n, heads), 64](pm, pl, pa, out)

    def rmsnorm(self, x: Any, w: Any, eps: Any, out: Any) -> None:
        ops.rmsnorm_kernel[x.shape[0], ops.ROW_THREADS](x, self._dev(w), np.float32(eps), out)

    def add_rmsnorm(self, h: Any, delta: Any, w: Any, eps: Any, out: Any) -> None:
        ops.add_rmsnorm_kernel[h.shape[0], ops.ROW_THREADS](h, delta, self._dev(w), np.float32(eps), out)

    def silu_mul(self, gate: Any, up: Any, out: Any) -> None:
        ops.silu_mul_kernel[_elem_grid(gate), ops.ELEM_THREADS](gate, up, out)

    def gelu_mul(self, gate: Any, up: Any, out: Any) -> None:
        ops.gelu_mul_kernel[_elem_grid(gate), ops.ELEM_THREADS](gate, up, out)

    def take_rows(self, x: Any, rows: Any, out: Any) -> None:
        if len(x.shape) == 1:
            ops.take_ids_kernel[(out.shape[0] + 63) // 64, 64](x, rows, out)
        else:
            ops.take_rows_kernel[out.shape[0], 128](x, rows, out)

    def softcap(self, x: Any, cap: Any) -> None:
        ops.softcap_kernel[_elem_grid(x), ops.ELEM_THREADS](x, np.float32(cap))

    def scale(self, x: Any, factor: Any) -> None:
        ops.scale_kernel[_elem_grid(x), ops.ELEM_THREADS](x, np.float32(factor))

    def add(self, h: Any, delta: Any) -> None:
        ops.add_kernel[_elem_grid(h), ops.ELEM_THREADS](h, delta)

    def argmax(self, x: Any) -> np.ndarray:
        """The greedy token of each row of device logits x [M, V], int32 [M] on the host: only M
        ints cross to the host, not the whole vocabulary."""
        out = cuda.device_array(x.shape[0], np.int32)
        ops.argmax_kernel[x.shape[0], ops.ROW_THREADS](x, out)
        return out.copy_to_host()

    def route_experts(self, *args: Any) -> None:
        raise UnsupportedModelError("device='cuda' has no route_experts kernel")

    expert_matmuls = combine_experts = gated_add = route_experts
