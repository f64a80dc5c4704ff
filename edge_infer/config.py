"""EngineConfig (what the user asked for: frozen, validated) and RuntimePlan (what was decided at
start from the model and the machine: KV blocks, threads)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields
from typing import Any

from edge_infer.errors import InvalidRequest

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_bytes(value: int | float | str, field_name: str = "kv_cache_memory") -> int:
    """Bytes from an int or a size string such as "512MiB", "2GiB", "1.5GB"."""
    if isinstance(value, bool):
        raise InvalidRequest(f"{field_name} must be a number of bytes or a size like '2GiB', got {value!r}")
    if isinstance(value, (int, float)):
        n = int(value)
    else:
        m = _SIZE.match(str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise InvalidRequest(f"{field_name} must be a number of bytes or a size like '2GiB', got {value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise InvalidRequest(f"{field_name} must be positive, got {value!r}")
    return n


def default_threads() -> int:
    """Physical cores (hyper-threads do not help memory-bound decoding)."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # pragma: no cover - psutil missing on an exotic platform
        n = None
    n = n or os.cpu_count() or 1
    try:
        n = min(n, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        pass
    return max(1, n)


# the KV pool's types: floats, and llama.cpp's quantized KV types (kernels_cpu.kv_quant)
KV_CACHE_DTYPES = ("f16", "f32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
SPEC_OPTIONS = ("method", "k", "k_max", "n", "model")


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """Speculative decoding. method: "ngram" (prompt lookup) | "draft" (a draft model); k:
    proposals per step, or "auto" (adaptive from k_max down to 0); n: longest n-gram matched
    (ngram); model: the draft model, a known name or a .gguf path (draft)."""

    method: str
    k: int | str = 4
    k_max: int = 8
    n: int = 3
    model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft"):
            raise InvalidRequest(f"speculative method must be 'ngram' or 'draft', got {self.method!r}")
        k = self.k
        if k != "auto" and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 16):
            raise InvalidRequest(f"speculative k must be an integer in 1..16 or 'auto', got {k!r}")
        if not isinstance(self.k_max, int) or isinstance(self.k_max, bool) or not 1 <= self.k_max <= 16:
            raise InvalidRequest(f"speculative k_max must be an integer in 1..16, got {self.k_max!r}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or not 1 <= self.n <= 8:
            raise InvalidRequest(f"speculative n (n-gram length) must be an integer in 1..8, got {self.n!r}")
        if self.method == "draft" and not self.model:
            raise InvalidRequest("speculative method 'draft' needs a draft 'model' (a known name or a .gguf path)")
        if self.model is not None and not isinstance(self.model, str):
            raise InvalidRequest(f"speculative model must be a known model name or a .gguf path, got {self.model!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpecConfig:
        """From the `speculative` option's dict; unknown keys are rejected by name. k_max
        defaults to 8 with k="auto", else to k."""
        unknown = sorted(set(d) - set(SPEC_OPTIONS))
        if unknown:
            raise InvalidRequest(f"unknown speculative option(s): {', '.join(unknown)} (known: {', '.join(sorted(SPEC_OPTIONS))})")
        k = d.get("k", 4)
        method: Any = d.get("method")  # None when missing: __post_init__ refuses it, as any bad value
        return cls(method, k, d.get("k_max", 8 if k == "auto" else k), d.get("n", 3), d.get("model"))

    @property
    def start_k(self) -> int:
        """A new sequence's k: k, or k_max when adaptive."""
        return self.k_max if self.k == "auto" else int(self.k)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything that shapes an engine. kv_cache_memory: bytes or "2GiB" (default: a quarter of
    the available memory, at most 4 GiB); max_model_len: default the model's context length,
    capped by the KV pool; prefill_chunk_while_decoding: prompt tokens allowed in a step that
    also decodes (None: automatic, 0: no cap; see Scheduler); speculative: None, a SpecConfig or
    its dict form {"method": "ngram"|"draft", "k": int|"auto", "model": path (draft), "n": match
    length (ngram)}, turned into a SpecConfig here so that a bad option fails before any load."""

    model: str
    n_threads: int | None = None
    device: str = "auto"
    enforce_eager: bool = False  # CUDA: launch every step's kernels, never replay a CUDA graph (vLLM's name)
    kv_cache_memory: int | str | None = None
    kv_cache_dtype: str = "f16"
    kv_cache_dtype_v: str | None = None  # V's type when it differs from K's (llama.cpp's --cache-type-v)
    max_model_len: int | None = None
    block_size: int = 16
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 256
    enable_prefix_caching: bool = True
    # a prefix cache on disk (engine/disk_prefix_cache.py): full KV blocks kept across processes
    prefix_cache_dir: str | None = None
    prefix_cache_disk_size: int | str = "8GiB"
    # context shift (engine/context_shift.py): a full context drops tokens instead of finishing
    # with "length": llama.cpp's half after the first context_keep (and BOS), or with None a
    # chat's oldest whole messages after its first one
    context_shift: bool = False
    context_keep: int | None = None
    # hybrid models: states kept at cached prefix blocks (None: 4 per max_num_seqs; 0 turns their
    # prefix cache off), one every state_snapshot_interval blocks and at each prompt's last full block
    state_snapshots: int | None = None
    state_snapshot_interval: int = 8
    enable_chunked_prefill: bool = True
    prefill_chunk_while_decoding: int | None = None
    seed: int = 0
    speculative: SpecConfig | dict | None = None
    # a multimodal projector (llama.cpp's --mmproj): images in prompts (engine/image_prompt.py)
    mmproj: str | None = None
    # LoRA adapters loaded at start (engine/lora.py): {name: path} or {name: (path, scale)}, kept
    # as ((name, path, scale), ...); a request picks them by name
    adapters: dict | tuple = ()

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise InvalidRequest(f"model must be a known model name or a .gguf path, got {self.model!r}")
        if self.n_threads is not None and (not isinstance(self.n_threads, int) or self.n_threads < 1):
            raise InvalidRequest(f"n_threads must be a positive integer, got {self.n_threads!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise InvalidRequest(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if not isinstance(self.enforce_eager, bool):
            raise InvalidRequest(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        if self.kv_cache_memory is not None:
            object.__setattr__(self, "kv_cache_memory", parse_bytes(self.kv_cache_memory))
        object.__setattr__(self, "prefix_cache_disk_size", parse_bytes(self.prefix_cache_disk_size, "prefix_cache_disk_size"))
        if self.prefix_cache_dir is not None and (not isinstance(self.prefix_cache_dir, str) or not self.prefix_cache_dir):
            raise InvalidRequest(f"prefix_cache_dir must be a directory path, got {self.prefix_cache_dir!r}")
        if self.mmproj is not None and (not isinstance(self.mmproj, str) or not self.mmproj):
            raise InvalidRequest(f"mmproj must be the path of a multimodal projector .gguf, got {self.mmproj!r}")
        object.__setattr__(self, "adapters", adapter_specs(self.adapters))
        if not isinstance(self.context_shift, bool):
            raise InvalidRequest(f"context_shift must be True or False, got {self.context_shift!r}")
        keep = self.context_keep
        if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool) or keep < 0):
            raise InvalidRequest(f"context_keep must be None (a chat's first message) or an integer >= 0 (tokens "
                                 f"after BOS), got {keep!r}")
        for name in ("kv_cache_dtype", "kv_cache_dtype_v"):
            v = getattr(self, name)
            if (v is not None or name == "kv_cache_dtype") and v not in KV_CACHE_DTYPES:
                raise InvalidRequest(f"{name} must be one of {', '.join(KV_CACHE_DTYPES)}, got {v!r}")
        for name, low in (("block_size", 1), ("max_num_seqs", 1), ("max_num_batched_tokens", 1)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise InvalidRequest(f"{name} must be an integer >= {low}, got {v!r}")
        for name, low in (("state_snapshots", 0), ("state_snapshot_interval", 1)):
            v = getattr(self, name)
            if (v is not None or name == "state_snapshot_interval") and (not isinstance(v, int) or isinstance(v, bool) or v < low):
                raise InvalidRequest(f"{name} must be an integer >= {low}, got {v!r}")
        if self.block_size & (self.block_size - 1) or self.block_size > 256:
            raise InvalidRequest(f"block_size must be a power of two up to 256, got {self.block_size}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise InvalidRequest(f"max_model_len must be an integer >= 2, got {self.max_model_len!r}")
        p = self.prefill_chunk_while_decoding
        if p is not None and (not isinstance(p, int) or isinstance(p, bool) or p < 0):
            raise InvalidRequest(f"prefill_chunk_while_decoding must be None (automatic), 0 (no cap) or a positive integer, got {p!r}")
        if not isinstance(self.seed, int):
            raise InvalidRequest(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.speculative, dict):  # validated here, before any model loads
            object.__setattr__(self, "speculative", SpecConfig.from_dict(self.speculative))
        elif self.speculative is not None and not isinstance(self.speculative, SpecConfig):
            raise InvalidRequest(f"speculative must be a dict such as {{'method': 'ngram', 'k': 4}}, got {self.speculative!r}")

    @classmethod
    def from_options(cls, model: str, **options: Any) -> EngineConfig:
        """Build from keyword options, rejecting unknown ones with a message that names them."""
        known = {f.name for f in fields(cls)} - {"model"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidRequest(f"unknown option(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(model=model, **options)

    @property
    def shifts_whole_messages(self) -> bool:
        """A context shift that keeps a chat's first message and drops whole ones (context_keep
        None): a chat's requests then carry ChatTemplate.message_starts."""
        return self.context_shift and self.context_keep is None


def finite_scale(value: object, what: str) -> float:
    """A LoRA adapter's scale, checked: a finite number (InvalidRequest naming `what` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"{what} must be a finite number, got {value!r}")
    return float(value)


def adapter_specs(adapters: Any) -> tuple[tuple[str, str, float], ...]:
    """LLM(adapters=...) as ((name, path, scale), ...): a dict of name -> path or (path, scale),
    or those triples already."""
    if isinstance(adapters, dict):
        items = [(n, (v, 1.0) if isinstance(v, str) else v) for n, v in adapters.items()]
    elif isinstance(adapters, (tuple, list)) and all(isinstance(t, (tuple, list)) and len(t) == 3 for t in adapters):
        items = [(t[0], (t[1], t[2])) for t in adapters]
    else:
        raise InvalidRequest(f"adapters must be a dict of name -> adapter .gguf path (or (path, scale)), got {adapters!r}")
    out = []
    for name, v in items:
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"an adapter's name must be a non-empty string, got {name!r}")
        if not isinstance(v, (tuple, list)) or len(v) != 2 or not isinstance(v[0], str) or not v[0]:
            raise InvalidRequest(f"adapter {name!r} needs the path of its LoRA .gguf (or (path, scale)), got {v!r}")
        out.append((name, v[0], finite_scale(v[1], f"adapter {name!r}'s scale")))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RuntimePlan:
    """Decided at start: the KV pool size, threads, and the limits they imply."""

    model_path: str
    num_kv_blocks: int
    block_size: int
    kv_cache_bytes: int
    kv_cache_dtype: str
    max_model_len: int
    n_threads: int
    device: str
    decode_weight_bytes: int = 0  # weights one decode step reads (models.weights.decode_weight_bytes)
    num_state_slots: int = 0  # a hybrid model's recurrent-state slots (one per sequence)
    num_state_snapshots: int = 0  # and its slots for states at cached prefix blocks
    state_cache_bytes: int = 0  # both's memory, out of the same budget as the KV pool
    kv_cache_dtype_v: str = ""  # V's type ("": kv_cache_dtype's)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    @property
    def kv_bytes_per_token(self) -> int:
        """The KV pool's bytes per token of context (K and V across the attention layers)."""
        return self.kv_cache_bytes // max(1, self.kv_capacity_tokens)

    @property
    def kv_types(self) -> str:
        """'K/V' types, or the one type both have."""
        v = self.kv_cache_dtype_v or self.kv_cache_dtype
        return self.kv_cache_dtype if v == self.kv_cache_dtype else f"{self.kv_cache_dtype}/{v}"
