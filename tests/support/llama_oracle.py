"""llama.cpp as the tests load it (LlamaCpp: whole sequences scored teacher-forced; kl_rows): at its best (repacked weights on), unless the installed
llama-cpp-python was built with AMX, whose path crashes on some CPUs: then without the repack
buffers, with a warning to build the fair baseline (benchmarks/llama_cpp_build.py)."""

from __future__ import annotations

import ctypes
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import oracle_cache
import pytest


def built_with_amx(lc: Any) -> bool:
    """Whether this llama.cpp build has AMX compiled in (its system info names it)."""
    return "AMX" in lc.llama_print_system_info().decode(errors="replace")


def model_params(lc: Any) -> Any:
    """llama_model_default_params(), with the repack buffers off for an AMX build."""
    mp = lc.llama_model_default_params()
    if built_with_amx(lc):
        warnings.warn("llama-cpp-python was built with AMX: loading without its repacked weights; "
                      "install the oracle with `python benchmarks/llama_cpp_build.py --install`", stacklevel=2)
        mp.use_extra_bufts = False
    return mp


def kl_rows(p_logits: np.ndarray, q_logits: np.ndarray, chunk: int = 32) -> np.ndarray:
    """KL(p || q) per row, in float64 from the log-softmaxes, in chunks of rows (gemma's
    vocabulary is 262144 wide): sum softmax(a) * (a - b) - log Z_a + log Z_b, a and b the logits
    less their row maxima. The chunk buffers are allocated once (fresh ones per chunk were
    mostly page faults)."""
    n, width = len(p_logits), p_logits.shape[-1]
    out = np.empty(n)
    a, b, ea = (np.empty((min(chunk, n), width)) for _ in range(3))
    for r in range(0, n, chunk):
        m = min(chunk, n - r)
        pa, pb, pe = a[:m], b[:m], ea[:m]
        pa[...] = p_logits[r : r + m]
        pb[...] = q_logits[r : r + m]
        pa -= pa.max(axis=-1, keepdims=True)
        pb -= pb.max(axis=-1, keepdims=True)
        np.exp(pa, out=pe)
        za = pe.sum(axis=-1)
        pa -= pb  # a - b
        zb = np.exp(pb, out=pb).sum(axis=-1)
        out[r : r + m] = np.einsum("ij,ij->i", pe, pa) / za - np.log(za) + np.log(zb)
    return out


class LlamaCpp:
    """llama.cpp (llama-cpp-python's low-level API) scoring whole sequences teacher-forced.

    In the tests, the logits of a real model's file (oracle_cache.CACHED_FROM bytes or more) are kept across runs in
    oracle_cache, keyed by everything they depend on: the file's and the adapters' bytes, the
    ids, the batching, the context settings, llama.cpp's build, the thread count and this
    file's source. The model is loaded on the first call that needs llama.cpp itself."""

    def __init__(self, path: Path, n_ctx: int, pooling: int | None = None, type_k: int | None = None,
                 type_v: int | None = None) -> None:
        """pooling: a llama_pooling_type for an embeddings context (1 mean, 2 cls, 3 last);
        type_k, type_v: the KV cache's GGML types (llama.cpp's --cache-type-k / -v), with flash
        attention on (llama.cpp quantizes V only there)."""
        self.lc = pytest.importorskip("llama_cpp")
        self.path, self.n_ctx, self.pooling, self.type_k, self.type_v = Path(path), n_ctx, pooling, type_k, type_v
        self.n_threads = int(os.environ.get("NUMBA_NUM_THREADS", "2"))
        self.adapters: list[tuple[Path, float]] = []
        self._loaded = False

    def _load(self) -> None:
        if self._loaded:
            return
        from llama_cpp._logger import set_verbose

        lc = self.lc
        set_verbose(False)
        lc.llama_backend_init()
        mp = model_params(lc)
        self.model = lc.llama_model_load_from_file(str(self.path).encode(), mp)
        assert self.model, f"llama.cpp could not load {self.path}"
        cp = lc.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = self.n_ctx
        # two threads, or the one per worker tests/conftest.py gives numba under xdist: llama.cpp's
        # OpenMP threads spin-wait like numba's
        cp.n_threads = cp.n_threads_batch = self.n_threads
        if self.pooling is not None:
            cp.embeddings, cp.pooling_type = True, self.pooling
        if self.type_k is not None or self.type_v is not None:
            cp.flash_attn_type = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
            cp.type_k = cp.type_k if self.type_k is None else self.type_k
            cp.type_v = cp.type_v if self.type_v is None else self.type_v
        self.ctx = lc.llama_init_from_model(self.model, cp)
        assert self.ctx, "llama.cpp could not create a context"
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self._loaded = True
        self._apply_adapters()

    def _decode(self, ids: list[int], batch: int | None = None, out: np.ndarray | None = None) -> None:
        """One sequence from position 0, every row output, the memory cleared first: in one
        batch, or in batches of `batch` tokens (each batch's logits copied into out's rows)."""
        self._load()
        lc, n = self.lc, len(ids)
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        step = batch or n
        for s in range(0, n, step):
            part = ids[s : s + step]
            b = lc.llama_batch_init(len(part), 0, 1)
            try:
                for i, t in enumerate(part):
                    b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, s + i, 1, 1
                    b.seq_id[i][0] = 0
                b.n_tokens = len(part)
                assert lc.llama_decode(self.ctx, b) == 0, "llama_decode failed"
            finally:
                lc.llama_batch_free(b)
            if out is not None:
                for i in range(len(part)):
                    out[s + i] = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    def logits(self, ids: list[int], batch: int | None = None) -> np.ndarray:
        """float32 [len(ids), vocab]: one sequence from position 0, in one batch (or in batches
        of `batch` tokens: other matrix kernels, so other activation roundings)."""
        oc = oracle_cache
        if not oc.keeps(self.path):
            return self._logits(ids, batch)
        parts = ("logits", oc.file_digest(self.path), ids, batch, self.n_ctx, self.pooling, self.type_k,
                 self.type_v, [(oc.file_digest(a), s) for a, s in self.adapters], oc.llama_cpp_build(self.lc),
                 self.n_threads, oc.source_digest(__file__))
        return oc.cached_arrays("llama_cpp", parts, lambda: {"logits": self._logits(ids, batch)})["logits"]

    def _logits(self, ids: list[int], batch: int | None) -> np.ndarray:
        self._load()
        out = np.empty((len(ids), self.n_vocab), np.float32)
        self._decode(ids, batch, out)
        return out

    def embedding(self, ids: list[int]) -> np.ndarray:
        """float32 [n_embd]: the pooled embedding of one sequence (an embeddings context)."""
        self._decode(ids)
        width = self.lc.llama_model_n_embd(self.model)
        return np.ctypeslib.as_array(self.lc.llama_get_embeddings_seq(self.ctx, 0), shape=(width,)).copy()

    def set_adapters(self, adapters: list[tuple[Path, float]]) -> None:
        """Apply these LoRA adapter files at these scales to the following decodes ([]: none)."""
        self.adapters = [(Path(p), s) for p, s in adapters]
        if self._loaded:
            self._apply_adapters()

    def _apply_adapters(self) -> None:
        lc = self.lc
        if not hasattr(self, "_adapters"):
            self._adapters: dict[str, Any] = {}
        for path, _ in self.adapters:
            if str(path) not in self._adapters:
                ad = lc.llama_adapter_lora_init(self.model, str(path).encode())
                assert ad, f"llama.cpp could not load the adapter {path}"
                self._adapters[str(path)] = ad
        n = len(self.adapters)
        arr = (lc.llama_adapter_lora_p_ctypes * max(n, 1))(*[self._adapters[str(p)] for p, _ in self.adapters])
        scales = (ctypes.c_float * max(n, 1))(*[s for _, s in self.adapters])
        assert lc.llama_set_adapters_lora(self.ctx, arr if n else None, n, scales if n else None) == 0

    def close(self) -> None:
        if not self._loaded:
            return
        self._loaded = False
        for ad in getattr(self, "_adapters", {}).values():
            self.lc.llama_adapter_lora_free(ad)
        self._adapters = {}
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)
