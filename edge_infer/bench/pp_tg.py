"""`edge-infer bench`: prefill (ppN) and decode (tgN) tokens/s of edge-infer and, when
llama-cpp-python is installed, of llama.cpp on the same model, prompt and threads, in the same
run; medians of several repetitions.

llama.cpp runs in a child process (`python -m edge_infer.bench.llamacpp`) through its low-level
decode API, taking the argmax of the last logits (no Python sampling over the vocabulary), so
its thread pool never shares a process with numba's.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_infer.bench.baseline import baseline_info, format_baseline


@dataclass(frozen=True, slots=True)
class BenchConfig:
    model: str
    threads: int = 2
    n_prompt: int = 512
    n_gen: int = 128
    repetitions: int = 3
    llama_cpp: bool = True
    seed: int = 42
    ik_llama_bench: str | None = None  # ik_llama.cpp's llama-bench binary: a second baseline row
    kv_cache_dtype: str = "f16"  # K's type (llama.cpp gets the same type_k, flash attention on)
    kv_cache_dtype_v: str | None = None  # V's, when it differs


def bench_prompt(vocab_size: int, n: int, seed: int) -> list[int]:
    """A fixed pseudo-random prompt (ids from the first 20k tokens: ordinary text pieces)."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(100, min(vocab_size, 20000), n)]


def run_edge(cfg: BenchConfig) -> dict[str, Any]:
    """pp: time to prefill n_prompt tokens; tg: n_gen greedy tokens after it, one at a time."""
    import os

    import psutil

    from edge_infer.llm import LLM
    from edge_infer.sampling_params import SamplingParams

    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    # Chunked prefill off and a budget of the whole prompt: one forward, as llama.cpp's n_batch.
    # The pool sized to the context it runs (its bytes per token are the KV type's).
    llm = LLM(cfg.model, n_threads=cfg.threads, max_num_batched_tokens=max(cfg.n_prompt, 256),
              enable_prefix_caching=False, kv_cache_memory=256 * 2**20, max_num_seqs=1,
              kv_cache_dtype=cfg.kv_cache_dtype, kv_cache_dtype_v=cfg.kv_cache_dtype_v,
              max_model_len=cfg.n_prompt + cfg.n_gen + 32)
    load_s = time.perf_counter() - t0
    prompt = bench_prompt(llm.model_config.vocab_size, cfg.n_prompt, cfg.seed)
    pp, tg = [], []
    try:
        llm.generate([prompt[:16]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
        for _ in range(cfg.repetitions):
            out = llm.generate([prompt], SamplingParams(max_tokens=cfg.n_gen + 1, temperature=0.0, ignore_eos=True))
            m = out[0].metrics
            assert m is not None and m.first_token_time is not None and m.first_scheduled_time is not None
            pp.append(cfg.n_prompt / (m.first_token_time - m.first_scheduled_time))
            tg.append(cfg.n_gen / (m.token_times[-1] - m.token_times[0]))
        # Resident memory the model added (weights paged in from the mmap, compiled kernels,
        # scratch), without the KV cache pages actually touched.
        kv_touched = (cfg.n_prompt + cfg.n_gen + 1) * llm.plan.kv_cache_bytes // max(1, llm.plan.kv_capacity_tokens)
        rss_added = proc.memory_info().rss - rss0 - kv_touched
        file_size = os.path.getsize(llm.plan.model_path)
        stream = llm.plan.decode_weight_bytes
        kv_types, kv_per_token = llm.plan.kv_types, llm.plan.kv_bytes_per_token
    finally:
        llm.close()
    return {"pp_tps": statistics.median(pp), "tg_tps": statistics.median(tg), "load_s": load_s,
            "pp_all": pp, "tg_all": tg, "rss_added_mb": rss_added / 2**20, "file_mb": file_size / 2**20,
            "decode_weight_bytes": stream, "kv_types": kv_types, "kv_bytes_per_token": kv_per_token}


def decode_limit(edge: dict[str, Any], ref: dict[str, Any] | None, threads: int) -> dict[str, Any]:
    """Decode's memory limit: the read bandwidth measured now (kernels_cpu.membw, `threads`
    threads) over the weight bytes one decode step reads; each runtime's decode as a fraction
    of it (llama.cpp reads about as many: the same file)."""
    from edge_infer.kernels_cpu.membw import read_bandwidth_gbps

    gbps = read_bandwidth_gbps(threads)
    limit = gbps * 1e9 / edge["decode_weight_bytes"]
    out = {"read_gbps": gbps, "bytes_per_token": edge["decode_weight_bytes"], "limit_tps": limit,
           "edge_frac": edge["tg_tps"] / limit}
    if ref and "tg_tps" in ref:
        out["llama_cpp_frac"] = ref["tg_tps"] / limit
    return out


def run_llama_cpp(cfg: BenchConfig, model_path: str, vocab_size: int) -> dict[str, Any] | None:
    """llama.cpp in a child process; None when llama-cpp-python is missing."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None
    args = [sys.executable, "-m", "edge_infer.bench.llamacpp", model_path, str(cfg.threads), str(cfg.n_prompt),
            str(cfg.n_gen), str(cfg.repetitions), str(cfg.seed), str(vocab_size), cfg.kv_cache_dtype,
            cfg.kv_cache_dtype_v or cfg.kv_cache_dtype]
    for extra in ("1", "0"):  # repacked weights first; this CPU's AMX path can crash: fall back
        r = subprocess.run(args + [extra], capture_output=True, text=True, timeout=1800)
        if r.returncode == 0 and r.stdout.strip():
            res: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
            res["extra_buffers"] = extra == "1"
            return res
    return {"error": f"llama.cpp exited with code {r.returncode}"}


def run(cfg: BenchConfig) -> dict[str, Any]:
    from edge_infer import hub
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.models import config_from_gguf

    path = str(hub.resolve_model(cfg.model))
    with GGUFFile(path) as f:
        vocab = config_from_gguf(f).vocab_size
    # llama.cpp before and after ours: a machine that drifts shows as two different baselines
    before = run_llama_cpp(cfg, path, vocab) if cfg.llama_cpp else None
    edge = run_edge(dataclasses.replace(cfg, model=path))
    after = run_llama_cpp(cfg, path, vocab) if before is not None and "pp_tps" in before else None
    ref = combine_baseline(before, after)
    out: dict[str, Any] = {"model": cfg.model, "threads": cfg.threads, "n_prompt": cfg.n_prompt, "n_gen": cfg.n_gen,
                           "edge": {"pp_tps": edge["pp_tps"], "tg_tps": edge["tg_tps"]},
                           "memory": {"rss_added_mb": edge["rss_added_mb"], "file_mb": edge["file_mb"]},
                           "kv": {"types": edge["kv_types"], "bytes_per_token": edge["kv_bytes_per_token"]},
                           "load_s": edge["load_s"], "decode_limit": decode_limit(edge, ref, cfg.threads)}
    if ref and "pp_tps" in ref:
        out["llama_cpp"] = ref
        out["ratio"] = {"pp": edge["pp_tps"] / ref["pp_tps"], "tg": edge["tg_tps"] / ref["tg_tps"]}
        out["llama_cpp_extra_buffers"] = ref.get("extra_buffers")
    elif ref:
        out["llama_cpp"] = ref
    if ref:
        out["llama_cpp_build"] = baseline_info()
    if cfg.ik_llama_bench:
        from edge_infer.bench.ik_llama import run_ik_llama

        out["ik_llama"] = run_ik_llama(cfg.ik_llama_bench, path, cfg.threads, cfg.n_prompt, cfg.n_gen, cfg.repetitions)
    return out


def combine_baseline(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """One baseline from llama.cpp's runs before and after ours: medians over the repetitions
    of both, each run's own medians kept under "before" / "after"."""
    if before is None or "pp_tps" not in before or after is None or "pp_tps" not in after:
        return before
    return {"pp_tps": statistics.median(before["pp_all"] + after["pp_all"]),
            "tg_tps": statistics.median(before["tg_all"] + after["tg_all"]),
            "before": {"pp_tps": before["pp_tps"], "tg_tps": before["tg_tps"]},
            "after": {"pp_tps": after["pp_tps"], "tg_tps": after["tg_tps"]},
            "extra_buffers": before.get("extra_buffers") and after.get("extra_buffers")}


def format_table(res: dict[str, Any]) -> str:
    p, n = res["n_prompt"], res["n_gen"]
    lines = [f"model {res['model']}, {res['threads']} threads (medians)",
             f"{'':12}{'pp' + str(p) + ' tok/s':>16}{f'tg{n}@{p} tok/s':>16}",
             f"{'edge-infer':12}{res['edge']['pp_tps']:>16.1f}{res['edge']['tg_tps']:>16.1f}"]
    mem = res.get("memory")
    if mem:
        lines.append(f"edge-infer resident memory added by loading: {mem['rss_added_mb']:.0f} MB "
                     f"(model file {mem['file_mb']:.0f} MB, KV cache excluded); load {res['load_s']:.2f}s")
    kv = res.get("kv")
    if kv:
        lines.append(f"KV cache {kv['types']}: {kv['bytes_per_token']} bytes per token of context")
    lim = res.get("decode_limit")
    if lim:
        share = f", llama.cpp {lim['llama_cpp_frac']:.0%}" if "llama_cpp_frac" in lim else ""
        lines.append(f"decode reads {lim['bytes_per_token'] / 2**20:.0f} MiB of weights per token; at the "
                     f"{lim['read_gbps']:.1f} GB/s read bandwidth measured now the limit is {lim['limit_tps']:.1f} "
                     f"tok/s: edge-infer at {lim['edge_frac']:.0%} of it{share}")
    ref = res.get("llama_cpp")
    if ref and "pp_tps" in ref:
        lines.append(f"{'llama.cpp':12}{ref['pp_tps']:>16.1f}{ref['tg_tps']:>16.1f}")
        if "before" in ref:
            b, a = ref["before"], ref["after"]
            lines.append(f"{'  before us':12}{b['pp_tps']:>16.1f}{b['tg_tps']:>16.1f}")
            lines.append(f"{'  after us':12}{a['pp_tps']:>16.1f}{a['tg_tps']:>16.1f}")
        lines.append(f"{'ratio':12}{res['ratio']['pp']:>15.2f}x{res['ratio']['tg']:>15.2f}x")
        repack = "on" if res.get("llama_cpp_extra_buffers") else "**OFF (its repacking path failed: a hobbled baseline)**"
        lines.append(f"llama.cpp repacked weights: {repack}")
    if ref and "error" in ref:
        lines.append(f"llama.cpp: {ref['error']}")
    if ref:
        lines.append(format_baseline(res.get("llama_cpp_build")))
    from edge_infer.bench.ik_llama import format_ik_rows

    lines += format_ik_rows(res)
    return "\n".join(lines)
