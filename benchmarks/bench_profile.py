"""Where prefill and decode spend their time: every CPU backend call timed (wall clock, summed
per method) over one prefill of --prompt tokens and --gen decode steps, plus the numba
parallel launches per decode token.

    python benchmarks/bench_profile.py --model qwen2.5-coder-1.5b [--json]

Each backend method is wrapped by a timer for the run (the engine thread calls it
synchronously); the figures include the wrapper's ~1 us per call. A launch is one call of a
numba kernel compiled with parallel=True (counted by wrapping each such dispatcher the CPU
backend reaches through its modules, after a warm-up has compiled them all).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

_TIMES: dict[str, float] = defaultdict(float)
_CALLS: dict[str, int] = defaultdict(int)
_LAUNCHES = [0]
_DETAIL = [False]  # matmuls split by weight type and shape (--detail)


def _matmul_key(a: tuple[Any, ...]) -> str:
    """matmuls(self, x, ws, ...): the weights' types and shapes, e.g. 'Q4_K 1536x1536 +2'."""
    from edge_infer.formats.weight_types import weight_type

    ws = a[2]
    w = ws[0]
    return f"matmuls {weight_type(w.qtype).name} {w.rows}x{w.cols}" + (f" +{len(ws) - 1}" if len(ws) > 1 else "")


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            key = _matmul_key(a) if name == "matmuls" and _DETAIL[0] else name
            _TIMES[key] += time.perf_counter() - t0
            _CALLS[key] += 1

    return wrapper


class _Counted:
    """A parallel dispatcher that counts its calls (module attribute replaced for the run)."""

    def __init__(self, disp: Any) -> None:
        self.disp = disp

    def __call__(self, *a: Any) -> Any:
        _LAUNCHES[0] += 1
        return self.disp(*a)


def _instrument() -> None:
    import numba

    from edge_infer.kernels_cpu import backend as cpu_backend

    cls = cpu_backend.CpuBackend
    for name, attr in list(vars(cls).items()):
        if name.startswith("_") or name in ("prepare_weights", "make_workspace", "make_kv_pool", "make_state_pool"):
            continue
        fn = attr.__func__ if isinstance(attr, staticmethod) else attr
        if callable(fn):
            wrapped = _timed(name, fn)
            setattr(cls, name, staticmethod(wrapped) if isinstance(attr, staticmethod) else wrapped)
    import sys

    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("edge_infer.kernels_cpu"):
            continue
        for k, v in list(vars(mod).items()):
            if isinstance(v, numba.core.registry.CPUDispatcher) and v.targetoptions.get("parallel"):
                setattr(mod, k, _Counted(v))


def _report(label: str, wall: float, tokens: int) -> dict[str, Any]:
    total = sum(t for n, t in _TIMES.items() if n != "run_step")  # run_step wraps the whole forward
    rows = sorted(_TIMES.items(), key=lambda kv: -kv[1])
    print(f"\n{label}: {tokens} tokens in {wall * 1e3:.1f} ms ({tokens / wall:.1f} tok/s); backend calls "
          f"{total * 1e3:.1f} ms, launches {_LAUNCHES[0]} ({_LAUNCHES[0] / max(1, tokens):.1f} per token)")
    print(f"{'method':<22}{'calls':>8}{'ms':>10}{'% wall':>8}{'us/call':>10}")
    for name, t in rows:
        print(f"{name:<22}{_CALLS[name]:>8}{t * 1e3:>10.1f}{100 * t / wall:>8.1f}{1e6 * t / _CALLS[name]:>10.1f}")
    print(f"{'(outside the backend)':<22}{'':>8}{(wall - total) * 1e3:>10.1f}{100 * (wall - total) / wall:>8.1f}")
    return {"label": label, "tokens": tokens, "wall_s": wall, "launches": _LAUNCHES[0],
            "methods": {n: {"calls": _CALLS[n], "s": t} for n, t in rows}}


def _reset() -> None:
    _TIMES.clear()
    _CALLS.clear()
    _LAUNCHES[0] = 0


def _subtract(times: dict[str, float], calls: dict[str, int], launches: int) -> None:
    """Take an earlier run's counts (the prefill alone) out of the current ones."""
    for name, t in times.items():
        _TIMES[name] -= t
        _CALLS[name] -= calls[name]
        if _CALLS[name] <= 0:
            del _TIMES[name], _CALLS[name]
    _LAUNCHES[0] -= launches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--detail", action="store_true", help="matmuls split by the first weight's type and shape")
    ap.add_argument("--streams", type=int, default=1, help="decode this many sequences at once (32-token prompts)")
    a = ap.parse_args()
    _DETAIL[0] = a.detail

    from edge_infer import hub
    from edge_infer.bench.pp_tg import bench_prompt
    from edge_infer.llm import LLM
    from edge_infer.sampling_params import SamplingParams

    path = str(hub.resolve_model(a.model))
    out = []
    with LLM(path, n_threads=a.threads, max_num_batched_tokens=max(a.prompt, 256), enable_prefix_caching=False,
             max_num_seqs=a.streams) as llm:
        prompt = bench_prompt(llm.model_config.vocab_size, a.prompt, 42)
        llm.generate([prompt[:16]], SamplingParams(max_tokens=4, temperature=0.0))  # compile / warm up
        llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        _instrument()  # after the warm-up: a kernel compiled now would see the counting wrappers
        _reset()
        r = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        m = r[0].metrics
        assert m is not None and m.first_token_time is not None and m.first_scheduled_time is not None
        out.append(_report(f"prefill {a.prompt}", m.first_token_time - m.first_scheduled_time, a.prompt))
        prompts = [bench_prompt(llm.model_config.vocab_size, 32, 43 + i) for i in range(a.streams)]
        # the decode counts are a run of gen + 1 tokens less a run of 1 token on the same prompts (no
        # prefix cache, so both prefill alike): the 32-token prefill is as long as ~10 decode steps of
        # the 1.5B and would otherwise inflate every matmul's time per call
        _reset()
        llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        prefill = (dict(_TIMES), dict(_CALLS), _LAUNCHES[0])
        _reset()
        r = llm.generate(prompts, SamplingParams(max_tokens=a.gen + 1, temperature=0.0, ignore_eos=True))
        _subtract(*prefill)
        times = [x.metrics.token_times for x in r if x.metrics is not None]
        wall = max(t[-1] for t in times) - max(t[0] for t in times)
        label = f"decode {a.gen}" + (f" x {a.streams} streams" if a.streams > 1 else "")
        out.append(_report(label, wall, a.gen * a.streams))
    if a.json:
        print(json.dumps({"model": a.model, "threads": a.threads, "runs": out}))


if __name__ == "__main__":
    main()
