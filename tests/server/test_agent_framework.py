"""A real agent framework drives the server: examples/langchain_tools.py (LangChain's
ChatOpenAI with bind_tools) against qwen2.5-coder-0.5b: the model calls get_weather for Paris,
the result goes back as a ToolMessage, and the answer uses it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("langchain_openai")

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_langchain_tool_loop(start_server, qwen2_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = start_server(qwen2_path, "-t", "2", "--kv-cache-memory", "128MiB", "--max-model-len", "2048")
    sys.path.insert(0, str(EXAMPLES))
    try:
        from langchain_tools import run
    finally:
        sys.path.remove(str(EXAMPLES))
    calls, answer = run(srv.url + "/v1", "qwen2.5-coder-0.5b")
    assert [(c["name"], c["args"]) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert "31" in answer, answer
