"""Chat templates from the oracle's own source tree (llama-cpp-python's sdist, vendor/llama.cpp/
models/templates: the real templates of model families we have no GGUF of), fetched once with
`pip download` into the test-data cache; a test that needs one is skipped when the sdist cannot
be fetched (no registry)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the oracle's pinned version (pyproject.toml)
_INSIDE = "/vendor/llama.cpp/models/templates/"


def templates_dir() -> Path:
    """The cached templates folder, filled from the sdist on first use."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edge-infer" / "test-data" / "llama-templates"
    if (root / ".complete").exists():
        return root
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", tmp,
               LLAMA_CPP_PYTHON]
        if subprocess.run(cmd, capture_output=True, timeout=600).returncode != 0:
            pytest.skip(f"cannot fetch the {LLAMA_CPP_PYTHON} sdist for its chat templates")
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        part = root.with_name(root.name + f".part{os.getpid()}")
        part.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                if _INSIDE in m.name and m.name.endswith(".jinja") and m.isfile():
                    f = tar.extractfile(m)
                    assert f is not None
                    (part / Path(m.name).name).write_bytes(f.read())
        (part / ".complete").touch()
        try:
            part.rename(root)
        except OSError:  # another worker won the race: its copy is the same
            shutil.rmtree(part, ignore_errors=True)
    return root


def template(name: str) -> str:
    """The text of models/templates/<name>.jinja."""
    return (templates_dir() / f"{name}.jinja").read_text(encoding="utf-8")
