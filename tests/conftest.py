"""Shared fixtures: real models (pulled into the cache on first use) and tiny GGUF writers.

The helper modules live in tests/support (on pytest's pythonpath); child Python processes
that tests start get that folder on their PYTHONPATH too, so they import the same helpers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parent / "support"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))

REAL_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")


def real_model_path(name: str) -> Path:
    """Path of a known real model, pulling it on first use (the CI cache keeps it warm)."""
    from edge_infer import hub

    if hasattr(hub, "pull") and not hub.cached_path(name).exists():
        return Path(hub.pull(name, progress=False))
    return hub.resolve_model(name)


_GGUF_PY_READERS: dict[str, object] = {}


def gguf_py_reader(path: Path) -> object:
    """gguf-py's GGUFReader for `path`, opened once per session (it takes 3-15 s per model)."""
    from gguf import GGUFReader

    key = str(path)
    if key not in _GGUF_PY_READERS:
        _GGUF_PY_READERS[key] = GGUFReader(key)
    return _GGUF_PY_READERS[key]


@pytest.fixture(scope="session", params=REAL_MODELS)
def any_real_model(request: pytest.FixtureRequest) -> Path:
    """Each of the three real models in turn."""
    return real_model_path(request.param)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return real_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return real_model_path("gemma3-270m")


@pytest.fixture(scope="session")
def qwen2_path() -> Path:
    return real_model_path("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen2_1p5b_path() -> Path:
    """The real-size model (1.07 GB Q4_K_M, Q4_K and Q6_K matrices: the K-quant int8 kernel)."""
    return real_model_path("qwen2.5-coder-1.5b")



def _simulator_module(session: pytest.Session) -> object | None:
    """tests/test_cuda_simulator.py as pytest imported it, when its test is selected."""
    for item in session.items:
        if item.nodeid.endswith("test_cuda_kernels_and_engine_under_the_simulator"):
            return getattr(item, "module", None)
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the CUDA simulator's own process early when its test is selected, so it runs beside
    the tests collected before it (tests/test_cuda_simulator.py waits for it)."""
    mod = _simulator_module(session)
    if mod is not None:
        mod.start_simulator()  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A session that ends early (-x, Ctrl-C) does not leave the simulator running."""
    mod = _simulator_module(session)
    for proc, _ in getattr(mod, "_started", []):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
