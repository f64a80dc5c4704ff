"""Charts of what the benchmarks measure (matplotlib, from the `[bench]` extra), written as PNG.

Two kinds: prefill and decode tokens/s per model, edge-infer beside llama.cpp, with the ratio on
each pair (`plot_pp_tg`); throughput against concurrency, one line per configuration and a
flat line per single-rate baseline (`plot_throughput`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_infer.errors import EdgeInferError, InvalidRequest

EDGE_COLOR, BASE_COLOR = "#1f77b4", "#ff7f0e"


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never open a window
        import matplotlib.pyplot as plt
    except ImportError:
        raise EdgeInferError("--plot needs matplotlib: pip install 'edge-infer[bench]'") from None
    return plt


def check_plot_path(path: str | Path) -> Path:
    """The chart's path, checked before any measuring starts (a .png in an existing folder)."""
    p = Path(path)
    if p.suffix.lower() != ".png":
        raise InvalidRequest(f"--plot writes a PNG: give a file name ending in .png, got {str(path)!r}")
    if not p.parent.is_dir():
        raise InvalidRequest(f"--plot: folder {str(p.parent)!r} does not exist")
    return p


def _save(fig: Any, path: Path) -> None:
    # written beside and renamed: an interrupted run leaves no half-written chart
    tmp = path.with_name(path.name + ".part")
    fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    tmp.replace(path)


def plot_pp_tg(results: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """results: `edge-infer bench --json` objects (one per model). Two panels, prefill and
    decode, a pair of bars per model (llama.cpp omitted where it did not run)."""
    target = check_plot_path(path)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [Path(m).stem if (m := str(r["model"])).endswith(".gguf") else m for r in results]
    for ax, key, label in ((axes[0], "pp_tps", "prefill"), (axes[1], "tg_tps", "decode")):
        xs = range(len(results))
        edge = [r["edge"][key] for r in results]
        base = [r.get("llama_cpp", {}).get(key, 0.0) for r in results]
        ax.bar([x - 0.2 for x in xs], edge, 0.4, label="edge-infer", color=EDGE_COLOR)
        ax.bar([x + 0.2 for x in xs], base, 0.4, label="llama.cpp", color=BASE_COLOR)
        for x, e, b in zip(xs, edge, base):
            if b:
                ax.annotate(f"{e / b:.2f}x", (x - 0.2, e), ha="center", va="bottom", fontsize=8)
        n = results[0]["n_prompt"] if key == "pp_tps" else results[0]["n_gen"]
        ax.set_title(f"{label} ({'pp' if key == 'pp_tps' else 'tg'}{n})")
        ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("tokens/s")
        ax.legend(fontsize=8)
    threads = results[0].get("threads")
    fig.suptitle(title or f"edge-infer vs llama.cpp, {threads} threads (medians)")
    _save(fig, target)
    plt.close(fig)
    return target


def plot_throughput(series: dict[str, dict[int, float]], flat: dict[str, float], path: str | Path,
                    title: str, points: dict[str, tuple[int, float]] | None = None) -> Path:
    """series: name -> {concurrency: tokens/s}, drawn as lines; flat: name -> tokens/s of a
    baseline with no concurrency axis (e.g. llama.cpp serving one request at a time); points:
    name -> (concurrency, tokens/s), single marks (e.g. static batching at its batch size)."""
    target = check_plot_path(path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, line in series.items():
        cs = sorted(line)
        ax.plot(cs, [line[c] for c in cs], marker="o", label=name)
    for i, (name, (c, tps)) in enumerate((points or {}).items()):
        ax.plot([c], [tps], marker="sx^"[i % 3], linestyle="none", markersize=8, label=name)
    for i, (name, tps) in enumerate(flat.items()):
        ax.axhline(tps, linestyle="--", color=[BASE_COLOR, "gray", "green"][i % 3], label=name)
    ax.set_xscale("log", base=2)
    ticks = sorted({c for line in series.values() for c in line} | {c for c, _ in (points or {}).values()})
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("output tokens/s")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    _save(fig, target)
    plt.close(fig)
    return target
