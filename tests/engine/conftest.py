"""Session-scoped tiny GGUF models (see tests/support/tiny_models.py) for the engine tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import write_tiny_gemma3, write_tiny_llama, write_tiny_qwen2


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def tiny_llama_path(tiny_dir: Path) -> Path:
    """llama, F32 weights, untied output."""
    return write_tiny_llama(tiny_dir / "llama-f32.gguf")


@pytest.fixture(scope="session")
def tiny_q8_path(tiny_dir: Path) -> Path:
    """llama, Q8_0 weights."""
    return write_tiny_llama(tiny_dir / "llama-q8_0.gguf", qtype="Q8_0")


@pytest.fixture(scope="session")
def tiny_qwen2_path(tiny_dir: Path) -> Path:
    """qwen2 (QKV bias, NEOX rope, tied embeddings), F32."""
    return write_tiny_qwen2(tiny_dir / "qwen2-f32.gguf")


@pytest.fixture(scope="session")
def tiny_gemma3_path(tiny_dir: Path) -> Path:
    """gemma3 (QK-norm, post-norms, GeGLU, sliding window 8 on layer 0), F32."""
    return write_tiny_gemma3(tiny_dir / "gemma3-f32.gguf")
