"""The CUDA backend on a GPU: agreement with the CPU backend and speed, on a random model of a
real shape and quant mix (written here as random valid Q4_0 blocks: the real files cannot
travel to the GPU machine). Run by scripts/cuda_check.sh; needs an NVIDIA GPU and numba-cuda.

    python benchmarks/bench_cuda.py [--shape 1.5b|8b] [--no-cpu] [--json FILE]

Reports: top-1 agreement and mean KL of next-token distributions against the CPU backend over
a 64-token prompt (not for --no-cpu), prefill of 512 tokens (tokens/s), decode at batch 1
eager (every kernel launched) and replayed from CUDA graphs, decode at batch 32, n-gram
speculative decoding at batch 1 (its verification steps replayed too), the weight traffic of
batch-1 decode in GB/s (the file's weight bytes, and the device form's, per token x tokens/s)
beside the card's name,
and the launch floor: one replay of a graph of as many empty kernels as a decode step has.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from tiny_models import _add_tokenizer  # noqa: E402  (the byte-level test vocabulary)

SHAPES = {"1.5b": (28, 1536, 12, 2, 8960), "8b": (32, 4096, 32, 8, 14336),  # layers, width, heads, kv, ffn
          "tiny": (1, 64, 2, 1, 128)}  # a smoke test (it runs under the simulator too)


def q4_0_rows(rng: np.random.Generator, rows: int, cols: int, std: float) -> np.ndarray:
    """uint8 [rows, cols / 32 * 18]: random nibbles, f16 scales giving weights of about `std`."""
    raw = rng.integers(0, 256, (rows, cols // 32, 18), dtype=np.uint8)
    d = np.full((rows, cols // 32), std / 4.6, np.float16)
    raw[:, :, 0:2] = d.view(np.uint8).reshape(rows, cols // 32, 2)
    return raw.reshape(rows, -1)


def write_model(path: Path, shape: str) -> Path:
    layers, d, heads, kv, ffn = SHAPES[shape]
    hd = d // heads
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(4096)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    _add_tokenizer(w, add_bos=False)
    q4 = GGMLQuantizationType.Q4_0

    def mat(name: str, rows: int, cols: int, std: float) -> None:
        w.add_tensor(name, q4_0_rows(rng, rows, cols, std), raw_shape=(rows, cols // 32 * 18), raw_dtype=q4)

    vocab = 267
    w.add_tensor("token_embd.weight", rng.normal(0, 1, (vocab, d)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    mat("output.weight", vocab, d, d**-0.5)
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(d, np.float32))
        for name, rows, cols in (("attn_q", d, d), ("attn_k", kv * hd, d), ("attn_v", kv * hd, d),
                                 ("attn_output", d, d), ("ffn_gate", ffn, d), ("ffn_up", ffn, d),
                                 ("ffn_down", d, ffn)):
            mat(p + name + ".weight", rows, cols, cols**-0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _decode_rate(llm: object, batch: int, n: int) -> float:
    from edge_infer import SamplingParams

    prompts = [[(7 * i + j) % 250 for j in range(8)] for i in range(batch)]
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    llm.generate(prompts, params)  # type: ignore[attr-defined]
    return batch * n / (time.perf_counter() - t0)


def _launch_floor(nodes: int) -> float:
    """Microseconds per replay of a CUDA graph of `nodes` empty kernels (what replaying a decode
    step's graph costs before any work)."""
    from numba import cuda

    from edge_infer.kernels_cuda.graphs import PackedInputs, StepGraph

    @cuda.jit
    def empty(x):  # type: ignore[no-untyped-def]
        pass

    x = cuda.device_array(1, np.float32)
    g = StepGraph(1, 1, PackedInputs(1, 1, 1, 1, pinned=False), launches=[(empty, 1, 32, (x,))] * nodes)
    g.build()
    stream = cuda.stream()
    for _ in range(10):
        g.replay(stream)
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        g.replay(stream)
    stream.synchronize()
    return (time.perf_counter() - t0) / 200 * 1e6


def _speed(path: Path, row: dict[str, object]) -> None:
    from edge_infer import LLM

    with LLM(str(path), device="cuda", max_model_len=2048, max_num_seqs=32, enforce_eager=True) as llm:
        row["decode_b1_eager_tok_s"] = _decode_rate(llm, 1, 32)
    with LLM(str(path), device="cuda", max_model_len=2048, max_num_seqs=32) as llm:
        wbytes = llm.plan.decode_weight_bytes
        long = [(3 * j) % 250 for j in range(512)]
        llm.prompt_logits(long[:16])
        t0 = time.perf_counter()
        llm.prompt_logits(long)
        row["prefill_512_tok_s"] = 512 / (time.perf_counter() - t0)
        row["decode_b1_tok_s"] = _decode_rate(llm, 1, 32)
        row["decode_b32_tok_s"] = _decode_rate(llm, 32, 16)
        backend = llm.worker.engine.runner.backend  # type: ignore[union-attr]
        row["graph_replays"] = backend.graph_replays
        row["device_weight_bytes"] = backend.weight_bytes
        b1 = backend._steps.graphs.get((1, 1))
        row["decode_graph_nodes"] = len(b1.launches) if b1 is not None else 0
    row["weight_gb_s_b1"] = wbytes * row["decode_b1_tok_s"] / 1e9  # type: ignore[operator]  # the file's bytes
    row["device_gb_s_b1"] = row["device_weight_bytes"] * row["decode_b1_tok_s"] / 1e9  # type: ignore[operator]
    row["b32_over_b1"] = row["decode_b32_tok_s"] / row["decode_b1_tok_s"]  # type: ignore[operator]
    spec = {"method": "ngram", "k": 4, "n": 1}
    with LLM(str(path), device="cuda", max_model_len=2048, max_num_seqs=32, speculative=spec) as llm:
        row["spec_b1_tok_s"] = _decode_rate(llm, 1, 32)
        m = llm.metrics()
        row["spec_tokens_per_step"] = m["spec_tokens_per_step"]
    if row["decode_graph_nodes"]:
        row["launch_floor_us"] = _launch_floor(int(row["decode_graph_nodes"]))  # type: ignore[arg-type]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.5b")
    ap.add_argument("--no-cpu", action="store_true", help="skip the agreement check against the CPU backend")
    ap.add_argument("--dir", default="/tmp/edge-infer-cuda-bench")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    from numba import cuda

    from edge_infer import LLM

    Path(args.dir).mkdir(parents=True, exist_ok=True)
    path = Path(args.dir) / f"random-llama-{args.shape}-q4_0.gguf"
    if not path.exists():
        write_model(path, args.shape)
    row: dict[str, object] = {"shape": args.shape, "file_bytes": path.stat().st_size,
                              "device": str(getattr(cuda.get_current_device(), "name", b"simulator").decode()), "date": time.strftime("%Y-%m-%d")}
    _speed(path, row)
    if not args.no_cpu:
        prompt = [(11 * j) % 250 for j in range(64)]
        with LLM(str(path), device="cuda", max_model_len=2048) as llm:
            gpu_logits = llm.prompt_logits(prompt)
        with LLM(str(path), device="cpu", max_model_len=2048) as llm:
            cpu_logits = llm.prompt_logits(prompt)
        p = np.exp(cpu_logits - cpu_logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        lq = gpu_logits - gpu_logits.max(1, keepdims=True)
        lq -= np.log(np.exp(lq).sum(1, keepdims=True))
        lp = np.log(p)
        row["top1_agreement"] = float((cpu_logits.argmax(1) == gpu_logits.argmax(1)).mean())
        row["mean_kl"] = float((p * (lp - lq)).sum(1).mean())
    for k, v in row.items():
        print(f"{k:>22}: {v:.4g}" if isinstance(v, float) else f"{k:>22}: {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
