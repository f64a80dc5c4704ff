"""Model architectures: one module per architecture, each with `config_from_gguf(file)`."""

from __future__ import annotations

from types import ModuleType

from edge_infer.models import gemma3, llama, qwen2

ARCHITECTURES: dict[str, ModuleType] = {m.ARCH: m for m in (llama, qwen2, gemma3)}
