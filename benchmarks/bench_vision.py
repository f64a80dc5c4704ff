"""Images: encode time and time to first token for one image on a SmolVLM-256M-shaped projector
(random weights in llama.cpp's layout: a SigLIP-B/16 tower at 512 px, 12 layers x 768, pixel
shuffle by 4, a SmolLM2-135M-shaped llama text model), ours and llama.cpp's libmtmd in the same
run, same threads. `--projector qwen2.5vl`: Qwen2.5-VL-3B's vision tower shape (1280 wide, 16
heads, SwiGLU 3420, 14 px patches, 112 px windows, a full-attention block every 8th) cut to
--vision-layers blocks (32 in the real one), beside a 2-layer qwen2vl text model 2048 wide.

    python benchmarks/bench_vision.py [--projector smolvlm|qwen2.5vl] [--vision-layers 8] [--threads 2]
        [--size 512] [--longest-edge 512] [--reps 3] [--json]

Rows: preprocessing + encoding every tile of the image (ours: the engine thread's vision tower;
llama.cpp: mtmd_tokenize + mtmd_encode_chunk per tile), and TTFT of "<image> Describe it."
(encode + prefill + the first token; llama.cpp: mtmd_helper_eval_chunks) with nothing cached;
then our TTFT for the same image again (the prefix cache serves the image's blocks: no
encoding, no prefill of them). Both sides are measured as a server holds them: loaded once and
warmed up on another image first, so neither pays its first-touch costs in the figures (ours
maps the weights lazily: a first encode in a fresh process also pages them in). Medians of --reps. One row set per --types: the projector's
matrices in F32, F16 (what SmolVLM's mmproj-f16 ships) or Q8_0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

SHAPE = {"image_size": 512, "patch_size": 16, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_ff": 3072, "n_merge": 4,
         "text_embd": 576}
TEXT = {"n_layers": 30, "d_model": 576, "n_heads": 9, "n_kv_heads": 3, "ffn": 1536}
PROMPT = "<__media__> Describe it."


QWEN_SHAPE = {"n_embd": 1280, "n_head": 16, "n_ff": 3420, "text_embd": 2048, "mm_hidden": 5120, "n_wa_pattern": 8}
QWEN_TEXT = {"n_layers": 2, "d_model": 2048, "n_heads": 16, "n_kv_heads": 2, "ffn": 4096, "sections": (16, 24, 24, 0)}


def write_files(folder: Path, longest_edge: int, linear_type: str = "F32", projector: str = "smolvlm",
                vision_layers: int = 8) -> tuple[Path, Path]:
    from tiny_vlm import write_tiny_mmproj, write_tiny_vlm_text

    if projector == "qwen2.5vl":
        from tiny_qwen_vl import write_tiny_qwen_vl_mmproj, write_tiny_qwen_vl_text

        mm = write_tiny_qwen_vl_mmproj(folder / "qwen2.5vl-3b-shaped-mmproj.gguf", linear_type=linear_type,
                                       n_layer=vision_layers, **QWEN_SHAPE)  # type: ignore[arg-type]
        return write_tiny_qwen_vl_text(folder / "qwen2.5vl-shaped-text.gguf", **QWEN_TEXT), mm  # type: ignore[arg-type]

    mm = write_tiny_mmproj(folder / "smolvlm-256m-shaped-mmproj.gguf", "idefics3", preproc_image_size=longest_edge,
                           linear_type=linear_type, **SHAPE)
    text = write_tiny_vlm_text(folder / "smolvlm-256m-shaped-text.gguf", "idefics3", **TEXT)
    return text, mm


def warm_up_image(img: Any) -> Any:
    """Another image of img's size: both sides warm up on it before the measures."""
    from tiny_vlm import test_image

    return test_image(img.shape[1], img.shape[0], seed=11)


def ours(text: Path, mm: Path, img: Any, threads: int, reps: int) -> dict[str, Any]:
    """One engine, as a server holds it (libmtmd's context is loaded once too): warmed up on
    another image (the weights paged in, the kernels loaded), then per repetition the image's
    embeddings and prefix blocks dropped before the cold measures."""
    from edge_infer import LLM, SamplingParams

    enc, cold, warm, tokens = [], [], [], 0
    params = SamplingParams(max_tokens=1, temperature=0.0)

    def forget(e: Any) -> None:
        e.vision.embeddings._cache.clear()
        e.block_manager.reset_prefix_cache()

    with LLM(str(text), mmproj=str(mm), n_threads=threads, kv_cache_memory="256MiB",
             max_num_batched_tokens=512) as llm:
        llm.generate([llm.image_prompt(PROMPT, [warm_up_image(img)])], params)
        for _ in range(reps):
            llm.worker.call(forget)
            t0 = time.perf_counter()
            prompt = llm.image_prompt(PROMPT, [img])
            tiles = list(prompt.spans[0].tiles)
            llm.worker.call(lambda e, t=tiles: e.vision.tower.encode(t))  # type: ignore[misc]
            enc.append(time.perf_counter() - t0)
            tokens = len(prompt.ids)
            for times in (cold, warm):  # nothing cached, then the same image again
                if times is cold:
                    llm.worker.call(forget)
                out = llm.generate([llm.image_prompt(PROMPT, [img])], params)[0]
                m = out.metrics
                times.append(m.first_token_time - m.arrival_time)  # type: ignore[union-attr,operator]
    return {"encode_s": statistics.median(enc), "ttft_cold_s": statistics.median(cold),
            "ttft_warm_s": statistics.median(warm), "prompt_tokens": tokens, "tiles": len(tiles),
            "encode_all": enc, "ttft_cold_all": cold}


def llama_cpp(text: Path, mm: Path, img: Any, threads: int, reps: int) -> dict[str, Any]:
    from mtmd_oracle import MtmdOracle

    enc, ttft = [], []
    with MtmdOracle(text, mm, n_threads=threads, n_ctx=4096, capture=False) as o:
        prompt = PROMPT.replace("<__media__>", o.marker)
        o.helper_logits_after(prompt, [warm_up_image(img)])  # warm, as ours
        for _ in range(reps):
            t0 = time.perf_counter()
            o.chunks(prompt, [img])
            enc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            o.helper_logits_after(prompt, [img])
            ttft.append(time.perf_counter() - t0)
    return {"encode_s": statistics.median(enc), "ttft_cold_s": statistics.median(ttft), "encode_all": enc,
            "ttft_cold_all": ttft}


def main() -> int:
    from tiny_vlm import test_image

    from edge_infer.bench.baseline import baseline_info, format_baseline

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--projector", choices=("smolvlm", "qwen2.5vl"), default="smolvlm")
    p.add_argument("--vision-layers", type=int, default=8, help="qwen2.5vl: the tower's blocks (32 in the 3B)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--size", type=int, default=512, help="the image's width and height (px)")
    p.add_argument("--longest-edge", type=int, default=512, help="the projector's preproc_image_size")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--types", default="F32,F16,Q8_0", help="the projector's matrix types, one row set each")
    p.add_argument("--no-llama-cpp", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    img = test_image(a.size, a.size, seed=3)
    rows = []
    for qtype in a.types.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            text, mm = write_files(Path(tmp), a.longest_edge, qtype, a.projector, a.vision_layers)
            mine = ours(text, mm, img, a.threads, a.reps)
            ref = None if a.no_llama_cpp else llama_cpp(text, mm, img, a.threads, a.reps)
        rows.append({"type": qtype, "ours": mine, "llama_cpp": ref})
    from edge_infer.kernels_cpu.target import format_numpy_blas, numpy_blas

    res = {"projector": a.projector, "vision_layers": a.vision_layers if a.projector == "qwen2.5vl" else None,
           "threads": a.threads, "image": f"{a.size}x{a.size}", "longest_edge": a.longest_edge, "rows": rows,
           "numpy_blas": numpy_blas(),
           "llama_cpp_build": None if a.no_llama_cpp else baseline_info()}
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    first = rows[0]["ours"]
    shape = ("SmolVLM-256M-shaped projector" if a.projector == "smolvlm" else
             f"Qwen2.5-VL-3B-shaped projector ({a.vision_layers} of its 32 blocks)")
    print(f"{shape}, {a.size}x{a.size} image -> {first['tiles']} tiles, "
          f"{first['prompt_tokens']} prompt tokens; {a.threads} threads, median of {a.reps}")
    print(f"{'type':6}{'':28}{'ours':>9}{'llama.cpp':>11}{'ratio':>8}")
    for row in rows:
        mine, ref = row["ours"], row["llama_cpp"]
        for key, label in (("encode_s", "preprocess + encode (s)"), ("ttft_cold_s", "TTFT, nothing cached (s)")):
            r = ref[key] if ref else None
            print(f"{row['type']:6}{label:28}{mine[key]:>9.3f}{(f'{r:.3f}' if r else '-'):>11}"
                  f"{(f'{r / mine[key]:.2f}x' if r else '-'):>8}")
        print(f"{row['type']:6}{'TTFT, same image again (s)':28}{mine['ttft_warm_s']:>9.3f}{'-':>11}"
              f"{mine['ttft_cold_s'] / mine['ttft_warm_s']:>7.1f}x (vs our cold)")
    print(f"ours: NumPy's BLAS {format_numpy_blas(res['numpy_blas'])}")
    if res["llama_cpp_build"]:
        print(format_baseline(res["llama_cpp_build"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
