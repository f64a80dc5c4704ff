"""The llama.cpp baseline as built: what every benchmark prints beside its figures."""

from __future__ import annotations

from typing import Any


def baseline_info() -> dict[str, Any] | None:
    """How the installed llama.cpp was built, for printing beside every figure compared with
    it: {"version", "system_info" (llama_print_system_info()), "amx" (AMX compiled in)}; None
    without llama-cpp-python. Loads no model."""
    try:
        import llama_cpp as lc
    except ImportError:
        return None
    info = lc.llama_print_system_info().decode(errors="replace").strip()
    return {"version": getattr(lc, "__version__", "?"), "system_info": info, "amx": "AMX" in info}


def format_baseline(info: dict[str, Any] | None) -> str:
    """One line for a table; an AMX build is flagged (its path crashes on some CPUs, and with it
    off the baseline is hobbled: build the fair one with benchmarks/llama_cpp_build.py)."""
    if info is None:
        return "llama.cpp: not installed"
    line = f"llama.cpp {info['version']}: {info['system_info']}"
    if info["amx"]:
        line += "\n**this llama.cpp was built with AMX: not the fair baseline (benchmarks/llama_cpp_build.py)**"
    return line
