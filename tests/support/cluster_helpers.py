"""Helpers of the Ray Serve tests (tests/server/test_cluster*.py): the openai client's chat
call, the engine replicas' processes, bounded waiting."""

from __future__ import annotations

import time
from collections.abc import Callable

import openai

ENGINE_PROC = "ServeReplica:edge-infer:engine"  # the engine replicas' process titles contain this


def engine_pids() -> list[int]:
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(ENGINE_PROC in part for part in (p.info["cmdline"] or [])):
                out.append(p.pid)
        except psutil.Error:
            pass
    return sorted(out)


def busiest(pids: list[int], seconds: float = 0.5) -> int:
    """The pid among `pids` that used the most CPU over the next `seconds`."""
    import psutil

    procs = [psutil.Process(p) for p in pids]
    for p in procs:
        p.cpu_percent(None)
    time.sleep(seconds)
    return max(procs, key=lambda p: p.cpu_percent(None)).pid


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def chat(url: str, prompt: str, max_tokens: int = 12, stream: bool = True, timeout: float = 120,
         ignore_eos: bool = False, on_first: Callable[[], None] | None = None) -> str:
    """The greedy reply to one user message (ignore_eos: exactly max_tokens of it); a stream
    calls on_first() when its first text arrives."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=timeout, max_retries=0)
    messages = [{"role": "user", "content": prompt}]
    extra = {"ignore_eos": True} if ignore_eos else None
    if not stream:
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=0,
                                           extra_body=extra)
        return r.choices[0].message.content or ""
    parts = []
    for chunk in client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens,
                                                temperature=0, stream=True, extra_body=extra):
        if chunk.choices and chunk.choices[0].delta.content:
            if on_first is not None and not parts:
                on_first()
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)
