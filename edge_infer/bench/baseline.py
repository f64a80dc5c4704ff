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


def combine_runs(before: dict[str, Any] | None, after: dict[str, Any] | None, keys: tuple[str, ...]
                 ) -> dict[str, Any] | None:
    """One baseline row from the runs of llama.cpp before and after ours (so that a machine that
    drifts during the run shows as two different baselines, not as a ratio): `before` with each
    of `keys` (rates, higher is better) replaced by the mean of both runs, the two runs' own
    values under "before" / "after" and their spread under "drift" (after / before - 1 of the
    first key). `before` unchanged when either run lacks a key (failed or skipped)."""
    if before is None or after is None or any(k not in before or k not in after for k in keys):
        return before
    out = dict(before)
    for k in keys:
        out[k] = (before[k] + after[k]) / 2
    out["before"] = {k: before[k] for k in keys}
    out["after"] = {k: after[k] for k in keys}
    out["drift"] = after[keys[0]] / before[keys[0]] - 1 if before[keys[0]] else 0.0
    return out


def format_drift(row: dict[str, Any], key: str) -> str:
    """' (before X, after Y)' for a row combine_runs made, else ''."""
    if "before" not in row:
        return ""
    return f" (before us {row['before'][key]:.1f}, after us {row['after'][key]:.1f})"
