"""Paged KV cache: utilisation under a mixed workload, and prefix caching.

    python benchmarks/bench_kv.py [-m MODEL] [--requests 64] [--scale 0.25] [--prefix 1000] [--json]

(a) KV utilisation: the `mixed` workload (64 requests by default) runs through the engine;
    after every step we record live tokens / token slots of the allocated blocks (paged), and
    what the same moment would cost with a contiguous per-sequence reservation of
    max_model_len tokens, as llama.cpp's server slots do (live tokens / (running x max_len)).
(b) Prefix caching: two requests share a long prefix (--prefix tokens) and differ in their last
    few tokens. The second one's time to first token is compared with the first's, and the KV
    blocks in use while both run are compared with what two private copies would need.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from edge_infer import SamplingParams, hub
from edge_infer.bench.workloads import make_workload
from edge_infer.config import EngineConfig
from edge_infer.engine.engine import LLMEngine


def utilisation(engine: LLMEngine, n_requests: int, scale: float) -> dict:
    reqs = make_workload("mixed", n_requests, engine.model_config.vocab_size, scale=scale)
    for r in reqs:
        engine.add_request(r.request_id, r.prompt_token_ids,
                           SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True))
    paged, contiguous, running = [], [], []
    bs, max_len = engine.block_manager.block_size, engine.plan.max_model_len
    while engine.has_unfinished_requests():
        engine.step()
        seqs = engine.scheduler.running
        if not seqs:
            continue
        live = sum(s.num_computed_tokens for s in seqs)
        slots = sum(len(s.block_table) for s in seqs) * bs
        paged.append(live / slots if slots else 1.0)
        contiguous.append(live / (len(seqs) * max_len))
        running.append(len(seqs))
    return {"requests": n_requests, "steps": len(paged), "paged_mean": float(np.mean(paged)),
            "paged_min": float(np.min(paged)), "contiguous_mean": float(np.mean(contiguous)),
            "max_model_len": max_len, "mean_running": float(np.mean(running)),
            "preemptions": engine.scheduler.num_preemptions}


def prefix_sharing(engine: LLMEngine, prefix_len: int) -> dict:
    rng = np.random.default_rng(7)
    prefix = [int(t) for t in rng.integers(100, min(20000, engine.model_config.vocab_size), prefix_len)]
    a, b = prefix + [1001, 1002, 1003], prefix + [2001, 2002]
    bm = engine.block_manager
    base_used = bm.num_used_blocks
    ttft = {}
    engine.add_request("first", a, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while True:  # run the first alone until its first token
        outs = engine.step()
        if any(o.outputs[0].token_ids for o in outs if o.request_id == "first"):
            break
    m = engine.requests["first"].metrics
    ttft["first"] = m.first_token_time - m.arrival_time  # type: ignore[operator]
    engine.add_request("second", b, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    used_both = None
    while engine.has_unfinished_requests():
        engine.step()
        if "second" in engine.requests and used_both is None and engine.requests["second"].seqs[0].output_token_ids:
            m2 = engine.requests["second"].metrics
            ttft["second"] = m2.first_token_time - m2.arrival_time  # type: ignore[operator]
            used_both = bm.num_used_blocks - base_used
    private = bm.blocks_needed(len(a) + 1) + bm.blocks_needed(len(b) + 1)
    return {"prefix_tokens": prefix_len, "ttft_first_s": ttft["first"], "ttft_second_s": ttft["second"],
            "speedup": ttft["first"] / ttft["second"], "blocks_in_use_both": used_both,
            "blocks_if_private": private, "block_size": bm.block_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=hub.DEFAULT_MODEL)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--scale", type=float, default=0.25, help="shrinks prompt/output lengths (1 = the issue's)")
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = str(hub.resolve_model(args.model))
    engine = LLMEngine(EngineConfig(model=path, n_threads=args.threads, kv_cache_memory=2 * 2**30, max_num_seqs=64,
                                    max_model_len=2048))
    res = {"model": args.model, "utilisation": utilisation(engine, args.requests, args.scale),
           "prefix": prefix_sharing(engine, args.prefix)}
    if args.json:
        print(json.dumps(res, indent=2))
        return
    u, p = res["utilisation"], res["prefix"]
    print(f"{args.model}: mixed workload, {u['requests']} requests, {u['steps']} steps, "
          f"{u['mean_running']:.1f} running on average")
    print(f"  KV utilisation, paged blocks:            mean {u['paged_mean']:.1%}  min {u['paged_min']:.1%}")
    print(f"  KV utilisation, contiguous max_len={u['max_model_len']}:  mean {u['contiguous_mean']:.1%}")
    print(f"prefix sharing, {p['prefix_tokens']}-token prefix:")
    print(f"  TTFT first {p['ttft_first_s']:.3f}s, second {p['ttft_second_s']:.3f}s -> {p['speedup']:.1f}x faster")
    print(f"  KV blocks in use with both running: {p['blocks_in_use_both']} (private copies: {p['blocks_if_private']})")


if __name__ == "__main__":
    main()
