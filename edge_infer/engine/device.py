"""Which backend runs a model: `device="cpu"`, `"cuda"` (numba-cuda and a device, or its
simulator, required; a model the CUDA kernels cannot run is refused naming what is missing) or
`"auto"` (CUDA when the `[cuda]` extra finds a device and the model is supported, else the CPU,
saying why in the log)."""

from __future__ import annotations

import importlib.util
import logging

from edge_infer.config import EngineConfig, default_threads
from edge_infer.errors import InvalidRequest, UnsupportedModelError
from edge_infer.models.backend import Backend, EncoderBackend
from edge_infer.models.config import ModelConfig

log = logging.getLogger("edge_infer.engine")


def cuda_missing() -> str | None:
    """Why CUDA cannot be used on this machine (no numba-cuda, no device), or None."""
    if importlib.util.find_spec("numba_cuda") is None:
        return "numba-cuda is not installed (pip install 'edge-infer[cuda]')"
    from numba import cuda
    from numba.core import config

    if config.ENABLE_CUDASIM:  # type: ignore[attr-defined]  # numba sets its config names through globals()
        return None
    try:
        if not cuda.is_available():
            return "numba-cuda finds no CUDA device"
    except Exception as e:  # a broken driver install: say so, run on the CPU
        return f"CUDA is not usable: {type(e).__name__}: {e}"
    return None


def cuda_lacks(config: EngineConfig, cfg: ModelConfig) -> str | None:
    """What the CUDA backend has no kernel for in this model and configuration, or None."""
    if cfg.n_experts:
        return f"{cfg.arch}: the CUDA backend has no mixture-of-experts kernels (route_experts, expert_matmuls)"
    if cfg.recurrent:
        return f"{cfg.arch}: the CUDA backend has no recurrent-layer kernels (short_conv) or state pool"
    if cfg.per_layer_input or cfg.v_norm or cfg.kv_shared_from or cfg.head_dim_swa or cfg.layer_ffn_dims:
        return (f"{cfg.arch}: the CUDA backend has no per-layer embedding, V-norm, shared-KV or per-layer "
                "head-size paths")
    if cfg.activation in ("relu2", "xielu") or cfg.attn_out_bias or cfg.attn_sinks:
        return (f"{cfg.arch}: the CUDA backend has no {cfg.activation} activation, attention-output bias or "
                "attention-sink kernels")
    if config.context_shift:
        return "context_shift: the context shift runs on the CPU backend"
    if config.prefix_cache_dir is not None:
        return "prefix_cache_dir: the disk prefix cache runs on the CPU backend"
    if config.kv_cache_dtype not in ("f16", "f32") or config.kv_cache_dtype_v not in (None, config.kv_cache_dtype):
        return (f"kv_cache_dtype {config.kv_cache_dtype!r} / kv_cache_dtype_v {config.kv_cache_dtype_v!r}: the CUDA "
                "backend stores f16 or f32 KV only, the same for K and V")
    if cfg.head_dim > 256:
        return f"head_dim {cfg.head_dim}: the CUDA attention kernel takes head_dim <= 256"
    return None


def make_backend(config: EngineConfig, cfg: ModelConfig) -> Backend:
    """The backend for config.device (see the module docstring)."""
    from edge_infer.kernels_cpu.backend import CpuBackend

    if config.device == "cpu":
        return CpuBackend(config.n_threads or default_threads())
    missing = cuda_missing()
    lacks = cuda_lacks(config, cfg) if missing is None else None
    if config.device == "cuda":
        if missing is not None:
            raise InvalidRequest(f"device='cuda': {missing}; use device='cpu' or 'auto'")
        if lacks is not None:
            raise UnsupportedModelError(f"device='cuda': {lacks}; use device='cpu' or 'auto'")
    if missing is None and lacks is None:
        from edge_infer.kernels_cuda.backend import CudaBackend

        backend = CudaBackend(graphs=not config.enforce_eager)
        log.info("device %s: CUDA on %s%s", config.device, backend.device_name,
                 " (eager: no CUDA graphs)" if config.enforce_eager else "")
        return backend
    if lacks is not None:  # a GPU is there but this model cannot use it: worth a warning
        log.warning("device auto: running on the CPU: %s", lacks)
    else:
        log.info("device auto: the CPU (%s)", missing)
    return CpuBackend(config.n_threads or default_threads())


def encoder_backend(config: EngineConfig, arch: str) -> EncoderBackend:
    """The backend of an encoder model: the CPU (the CUDA backend has no encoder kernels:
    device='cuda' is refused by name, 'auto' says so in the log)."""
    from edge_infer.kernels_cpu.backend import CpuBackend

    if config.device == "cuda":
        raise UnsupportedModelError(f"device='cuda': {arch}: the CUDA backend has no encoder kernels (bidirectional "
                                    "attention, LayerNorm); use device='cpu' or 'auto'")
    if config.device == "auto" and cuda_missing() is None:
        log.warning("device auto: running on the CPU: %s: the CUDA backend has no encoder kernels", arch)
    return CpuBackend(config.n_threads or default_threads())
