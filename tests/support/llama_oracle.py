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
    less their row maxima."""
    out = np.empty(len(p_logits))
    for r in range(0, len(p_logits), chunk):
        a = p_logits[r : r + chunk].astype(np.float64)
        b = q_logits[r : r + chunk].astype(np.float64)
        a -= a.max(axis=-1, keepdims=True)
        b -= b.max(axis=-1, keepdims=True)
        ea = np.exp(a)
        za, zb = ea.sum(axis=-1), np.exp(b).sum(axis=-1)
        out[r : r + chunk] = np.einsum("ij,ij->i", ea, a - b) / za - np.log(za) + np.log(zb)
    return out


class LlamaCpp:
    """llama.cpp (llama-cpp-python's low-level API) scoring whole sequences teacher-forced."""

    def __init__(self, path: Path, n_ctx: int, pooling: int | None = None, type_k: int | None = None,
                 type_v: int | None = None) -> None:
        """pooling: a llama_pooling_type for an embeddings context (1 mean, 2 cls, 3 last);
        type_k, type_v: the KV cache's GGML types (llama.cpp's --cache-type-k / -v), with flash
        attention on (llama.cpp quantizes V only there)."""
        lc = pytest.importorskip("llama_cpp")
        from llama_cpp._logger import set_verbose

        set_verbose(False)
        lc.llama_backend_init()
        self.lc = lc
        mp = model_params(lc)
        self.model = lc.llama_model_load_from_file(str(path).encode(), mp)
        assert self.model, f"llama.cpp could not load {path}"
        cp = lc.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        # two threads, or the one per worker tests/conftest.py gives numba under xdist: llama.cpp's
        # OpenMP threads spin-wait like numba's
        cp.n_threads = cp.n_threads_batch = int(os.environ.get("NUMBA_NUM_THREADS", "2"))
        if pooling is not None:
            cp.embeddings, cp.pooling_type = True, pooling
        if type_k is not None or type_v is not None:
            cp.flash_attn_type = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
            cp.type_k = cp.type_k if type_k is None else type_k
            cp.type_v = cp.type_v if type_v is None else type_v
        self.ctx = lc.llama_init_from_model(self.model, cp)
        assert self.ctx, "llama.cpp could not create a context"
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))

    def _decode(self, ids: list[int], batch: int | None = None, out: np.ndarray | None = None) -> None:
        """One sequence from position 0, every row output, the memory cleared first: in one
        batch, or in batches of `batch` tokens (each batch's logits copied into out's rows)."""
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
        lc = self.lc
        if not hasattr(self, "_adapters"):
            self._adapters: dict[str, Any] = {}
        for path, _ in adapters:
            if str(path) not in self._adapters:
                ad = lc.llama_adapter_lora_init(self.model, str(path).encode())
                assert ad, f"llama.cpp could not load the adapter {path}"
                self._adapters[str(path)] = ad
        n = len(adapters)
        arr = (lc.llama_adapter_lora_p_ctypes * max(n, 1))(*[self._adapters[str(p)] for p, _ in adapters])
        scales = (ctypes.c_float * max(n, 1))(*[s for _, s in adapters])
        assert lc.llama_set_adapters_lora(self.ctx, arr if n else None, n, scales if n else None) == 0

    def close(self) -> None:
        for ad in getattr(self, "_adapters", {}).values():
            self.lc.llama_adapter_lora_free(ad)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)
