"""`edge-infer doctor`: what this machine gives the kernels, and why a model runs at the speed it
does: CPU and the features the kernels use, the matmul path of each weight type, numba and LLVM,
the JIT cache, memory and its read bandwidth, cached models, and the llama.cpp oracle."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from edge_infer._version import __version__
from edge_infer.cli.inspect import human_bytes

BANDWIDTH_BYTES = 256 * 2**20  # streamed for the read-bandwidth figure: larger than any L3 here


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor", parents=parents, help="explain this machine: CPU features, kernel paths, JIT cache, memory",
        description="Report what edge-infer sees on this machine: the CPU and the instruction-set features "
        "the kernels use, which matmul path each GGUF weight type takes (int8 VNNI, AVX2, generic, float), "
        "numba/LLVM versions and the threading layer, where the compiled kernels are cached and whether "
        "they are compiled for this CPU, available memory and the default KV pool, the memory read "
        "bandwidth (what bounds decoding) and the cached models, whether CUDA is usable (device='auto'), "
        "and the llama.cpp oracle if installed.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("-m", "--model", metavar="M",
                   help="also report this model (a cached known name or a .gguf path): its matrices' types and paths")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the ~1 s memory bandwidth measurement")
    p.set_defaults(func=doctor)


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (x86 "model name", a Pi's "Model"), else what
    platform reports."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for key in ("model name", "Model", "Hardware"):
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    return platform.processor() or platform.machine()


def _threading(n_threads: int) -> dict[str, Any]:
    """numba's threading layer, found by running one small parallel kernel (cached)."""
    import numba
    import numpy as np

    from edge_infer.kernels_cpu import membw

    membw.sum_kernel(np.ones(4096, np.float32), min(n_threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    return {"layer": numba.threading_layer(), "configured": numba.config.THREADING_LAYER,  # type: ignore[attr-defined]
            "numba_threads": numba.config.NUMBA_NUM_THREADS}  # type: ignore[attr-defined]


def model_report(model: str) -> dict[str, Any]:
    """A model's matrices grouped by (weight type, matmul path): count and bytes; its size.
    The token embedding is only looked up by rows, unless the output reuses it (tied)."""
    from edge_infer import hub
    from edge_infer.cli.inspect import layers
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.kernels_cpu.target import matrix_path

    path = hub.resolve_model(model, download=False)
    groups: dict[tuple[str, str], list[int]] = {}
    with GGUFFile(path) as f:
        tied = "output.weight" not in f.tensors
        arch = str(f.metadata.get("general.architecture", "?"))
        kinds = layers(f)
        kv_per_token = _kv_bytes_per_token(f)
        for t in f.tensors.values():
            if len(t.shape) < 2 or (t.name == "token_embd.weight" and not tied):
                continue
            role = "output" if t.name in ("output.weight", "token_embd.weight") else "layer"
            g = groups.setdefault((t.type.name, matrix_path(int(t.type), t.shape[0], role)), [0, 0])
            g[0] += 1
            g[1] += t.nbytes
    matrices = [{"type": k[0], "path": k[1], "count": c, "bytes": b} for k, (c, b) in groups.items()]
    return {"path": str(path), "arch": arch, "size": path.stat().st_size, "layers": kinds,
            "matrices": sorted(matrices, key=lambda m: -m["bytes"]), "kv_bytes_per_token": kv_per_token}


def _kv_bytes_per_token(f: Any) -> dict[str, int]:
    """The KV pool's bytes per token of context for each KV type this model's heads can take
    (empty for an encoder or a file the loader refuses)."""
    from edge_infer.config import KV_CACHE_DTYPES
    from edge_infer.engine.model_runner import kv_block_bytes
    from edge_infer.errors import EdgeInferError
    from edge_infer.kernels_cpu.backend import CpuBackend
    from edge_infer.models import config_from_gguf

    try:
        cfg = config_from_gguf(f)
    except EdgeInferError:
        return {}
    out = {}
    for t in KV_CACHE_DTYPES:
        try:
            out[t] = kv_block_bytes(CpuBackend, cfg, 1, t)  # type: ignore[arg-type]
        except EdgeInferError:  # a block type on heads not a multiple of 32
            continue
    return out


def gather(bandwidth: bool = True, model: str | None = None) -> dict[str, Any]:
    """Everything the report shows, as one JSON-ready dict."""
    import llvmlite
    import llvmlite.binding as llvm
    import numba
    import psutil

    from edge_infer.bench.baseline import baseline_info
    from edge_infer.cli.models import list_models
    from edge_infer.config import EngineConfig, default_threads
    from edge_infer.engine.loader import kv_budget
    from edge_infer.kernels_cpu import jit_cache, target

    threads = default_threads()
    cache = jit_cache.jit_cache_status()
    mem = psutil.virtual_memory()
    report: dict[str, Any] = {
        "edge_infer": __version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": {"model": cpu_model(), "llvm_name": target.cpu_name(), "machine": platform.machine(),
                "logical_cores": os.cpu_count(), "default_threads": threads,
                "features": target.features()},
        "int8_isa": target.int8_isa(),
        "matmul_paths": target.matmul_paths(),
        "numpy_blas": target.numpy_blas(),
        "numba": {"numba": numba.__version__, "llvmlite": llvmlite.__version__,
                  "llvm": ".".join(map(str, llvm.llvm_version_info)),
                  "cpu_name_env": os.environ.get("NUMBA_CPU_NAME"), **_threading(threads)},
        "jit_cache": {"location": cache.location, "writable": cache.writable, "state": cache.state,
                      "compiled": cache.compiled, "total": cache.total, "error": cache.error,
                      "modules": {k: {"compiled": c, "total": t} for k, (c, t) in cache.kernels.items()}},
        "memory": {"total_bytes": mem.total, "available_bytes": mem.available,
                   "default_kv_pool_bytes": kv_budget(EngineConfig(model="-")),
                   "read_bandwidth_gbps": None},
    }
    if bandwidth:
        from edge_infer.kernels_cpu.membw import read_bandwidth_gbps

        nbytes = int(min(BANDWIDTH_BYTES, mem.available // 8)) // 4096 * 4096
        report["memory"]["read_bandwidth_gbps"] = round(read_bandwidth_gbps(threads, nbytes, 3), 2)
    listing = list_models()
    models = [{"name": m["name"], "path": m["path"], "size": m["size"]} for m in listing["models"] if m["cached"] == "yes"]
    models += [{"name": Path(o["path"]).stem, "path": o["path"], "size": o["size"]} for o in listing["other_files"]]
    gbps = report["memory"]["read_bandwidth_gbps"]
    for m in models:  # decoding reads about every weight once per token: the file's size
        m["decode_ceiling_tok_s"] = round(gbps * 1e9 / m["size"], 1) if gbps else None
    report["models"] = {"cache_dir": listing["cache_dir"], "cached": models}
    if model is not None:
        report["model"] = model_report(model)
        report["model"]["decode_ceiling_tok_s"] = round(gbps * 1e9 / report["model"]["size"], 1) if gbps else None
    from edge_infer.engine.device import cuda_missing

    missing = cuda_missing()  # what device="auto" decides from (numba-cuda, a device)
    report["cuda"] = {"usable": missing is None, "reason": missing}
    info = baseline_info()
    report["llama_cpp"] = {"installed": info is not None, **(info or {})}
    return report


def _print_report(r: dict[str, Any]) -> None:
    def row(label: str, text: str) -> None:
        print(f"{label:<13}{text}")

    cpu, nb, jc, mem = r["cpu"], r["numba"], r["jit_cache"], r["memory"]
    print(f"edge-infer {r['edge_infer']} on {r['platform']}, Python {r['python']}")
    row("CPU", f"{cpu['model']} (LLVM target: {cpu['llvm_name']}), {cpu['logical_cores']} logical cores, "
               f"{cpu['default_threads']} threads by default")
    have = [f for f, ok in cpu["features"].items() if ok]
    lack = [f for f, ok in cpu["features"].items() if not ok]
    row("features", " ".join(have) or "none of those the kernels use")
    if lack:
        print(f"{'':<13}(without: {' '.join(lack)})")
    by_path: dict[str, list[str]] = {}
    for t, path in r["matmul_paths"].items():
        by_path.setdefault(path, []).append(t)
    for i, (path, types) in enumerate(sorted(by_path.items(), key=lambda kv: kv[0].startswith("float"))):
        row("weight types" if i == 0 else "", f"{' '.join(types)}: {path}")
    row("numba", f"{nb['numba']}, llvmlite {nb['llvmlite']} (LLVM {nb['llvm']}), threading layer {nb['layer']}"
                 f" ({nb['numba_threads']} threads)" + (f", NUMBA_CPU_NAME={nb['cpu_name_env']}" if nb["cpu_name_env"] else ""))
    from edge_infer.kernels_cpu.target import format_numpy_blas

    row("NumPy BLAS", format_numpy_blas(r["numpy_blas"]) + " (the vision towers' float products)")
    state = jc["state"]
    if jc["error"]:
        state += f" ({jc['error']})"
    else:
        state += f": {jc['compiled']} of {jc['total']} kernels compiled for this CPU and version"
        cold = [k for k, m in jc["modules"].items() if m["compiled"] < m["total"]]
        if cold:
            state += f"; still to compile: {', '.join(cold)} (once, at the first model that needs them)"
    row("JIT cache", f"{jc['location'] or 'none'}" + ("" if jc["writable"] else " (not writable: kernels recompile every run)"))
    print(f"{'':<13}{state}")
    bw = f"; read bandwidth {mem['read_bandwidth_gbps']:.1f} GB/s" if mem["read_bandwidth_gbps"] else ""
    row("memory", f"{human_bytes(mem['available_bytes'])} available of {human_bytes(mem['total_bytes'])}; "
                  f"default KV pool up to {human_bytes(mem['default_kv_pool_bytes'])}{bw}")
    models = r["models"]["cached"]
    if not models:
        row("models", f"none cached in {r['models']['cache_dir']}")
    for i, m in enumerate(models):
        ceil = f", decode at most ~{m['decode_ceiling_tok_s']:.0f} tokens/s (size / bandwidth)" if m["decode_ceiling_tok_s"] else ""
        row("models" if i == 0 else "", f"{m['name']} {human_bytes(m['size'])}{ceil}")
    if "model" in r:
        m = r["model"]
        ceil = f", decode at most ~{m['decode_ceiling_tok_s']:.0f} tokens/s" if m["decode_ceiling_tok_s"] else ""
        row("this model", f"{m['path']} ({m['arch']}, {human_bytes(m['size'])}{ceil})")
        for g in m["matrices"]:
            print(f"{'':<13}{g['count']:>4} {g['type']} matrices, {human_bytes(g['bytes'])}: {g['path']}")
        if m.get("kv_bytes_per_token"):
            print(f"{'':<13}KV cache per token of context: " + ", ".join(
                f"{t} {human_bytes(b)}" for t, b in m["kv_bytes_per_token"].items()))
        state = m["layers"].get("state_bytes_per_sequence", 0)
        if state:
            print(f"{'':<13}recurrent state: {human_bytes(state)} per sequence, one slot per sequence "
                  "(max_num_seqs + 4), out of the KV budget")
    cu = r["cuda"]
    row("CUDA", "usable: device='auto' runs on the GPU" if cu["usable"] else f"no: {cu['reason']} (device='auto' is the CPU)")
    lc = r["llama_cpp"]
    if not lc["installed"]:
        row("llama.cpp", "not installed (only the tests and benchmarks use it)")
    else:
        amx = "AMX compiled in (not the fair baseline here: benchmarks/llama_cpp_build.py)" if lc["amx"] else "built without AMX"
        row("llama.cpp", f"llama-cpp-python {lc['version']}, {amx}")
        print(f"{'':<13}{lc['system_info']}")


def doctor(args: argparse.Namespace) -> int:
    """Print the report (or --json); returns 0."""
    report = gather(bandwidth=not args.no_bandwidth, model=args.model)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    sys.stdout.flush()
    return 0
