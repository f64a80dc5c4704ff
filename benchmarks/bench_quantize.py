"""Quantization quality below the source's precision: qwen2.5-coder-1.5b (Q4_K_M) dequantized to
F32 is the source; each variant is quantized from it, by us (round-to-nearest, and with an
importance matrix from calibration) and by llama.cpp's llama-quantize (without and with an
imatrix from llama-imatrix), and scored against the source's own distributions: file size,
bits per weight, perplexity, mean KL(source || variant) and top-1 agreement, all computed by
edge-infer on the same windows. Our files are also scored by llama.cpp (llama-cpp-python) for
the round trip: both perplexities must agree within 1%.

    python benchmarks/llama_cpp_build.py --tools      # llama-quantize, llama-imatrix (once)
    python benchmarks/bench_quantize.py [--types q4_0,q3_k,q2_k,q3_k_m] [--chunks 4] [--json FILE]

Text: calibration on GPL-3 + Apache-2.0 (/usr/share/common-licenses), evaluation on MPL-2.0
plus a Python standard-library file (fractions.py): disjoint. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_cpp_build  # noqa: E402

from edge_infer import hub  # noqa: E402
from edge_infer.bench.kl_divergence import KLResult, add_window  # noqa: E402
from edge_infer.bench.perplexity import scoring_windows  # noqa: E402
from edge_infer.formats.gguf import GGUFFile  # noqa: E402
from edge_infer.formats.quant_policy import MIXES, PLAIN  # noqa: E402
from edge_infer.llm import LLM  # noqa: E402

LICENSES = Path("/usr/share/common-licenses")
ROUND_TRIP = ("q8_0", "q6_k")  # ours only: the round trip, no quality table entry needed
PURE_K = {"q2_k", "q3_k", "q4_k", "q5_k"}  # llama-quantize --pure with a Q6_K output for these


def texts(tmp: Path) -> tuple[Path, str]:
    calib = tmp / "calibration.txt"
    calib.write_text((LICENSES / "GPL-3").read_text() + "\n" + (LICENSES / "Apache-2.0").read_text())
    stdlib = Path(sysconfig.get_paths()["stdlib"]) / "fractions.py"
    return calib, (LICENSES / "MPL-2.0").read_text() + "\n" + stdlib.read_text()


def run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t0


def ours_cmd(src: Path, out: Path, t: str, imatrix: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "edge_infer.cli", "-q", "quantize", str(src), str(out), "--type", t, "--force"]
    return cmd + (["--imatrix", str(imatrix)] if imatrix else [])


def llama_cmd(bindir: Path, src: Path, out: Path, t: str, imatrix: Path | None) -> list[str]:
    ft = (MIXES.get(t) or PLAIN[t])[1].name.replace("MOSTLY_", "")
    cmd = [str(bindir / "llama-quantize")]
    if t in PURE_K:
        cmd += ["--pure", "--output-tensor-type", "q6_k"]
    if imatrix:
        cmd += ["--imatrix", str(imatrix)]
    return cmd + [str(src), str(out), ft, "2"]


def score(path: Path, wins: list[list[int]], base_rows: list[np.ndarray], ctx: int) -> KLResult:
    res = KLResult(ctx=ctx, chunks=len(wins))
    with LLM(str(path), n_threads=2, device="cpu", max_model_len=ctx + 1, kv_cache_memory="256MiB") as llm:
        for w, b in zip(wins, base_rows):
            add_window(res, b, llm.prompt_logits(w)[ctx // 2 : ctx - 1], w[ctx // 2 + 1 : ctx])
    return res


def llama_ppl(path: Path, wins: list[list[int]], ctx: int) -> float:
    """llama.cpp's perplexity over the same windows and positions (llama-cpp-python)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
    from llama_oracle import LlamaCpp

    ref = LlamaCpp(path, n_ctx=ctx)
    try:
        nll, n = 0.0, 0
        for w in wins:
            z = ref.logits(w)[ctx // 2 : ctx - 1].astype(np.float64)
            z -= z.max(axis=1, keepdims=True)
            tgt = np.asarray(w[ctx // 2 + 1 : ctx])
            nll += float((np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(tgt)), tgt]).sum())
            n += len(tgt)
    finally:
        ref.close()
    return float(np.exp(nll / n))


def bits_per_weight(path: Path) -> float:
    with GGUFFile(path) as f:
        n = sum(t.n_elements for t in f.tensors.values())
        return 8 * sum(t.nbytes for t in f.tensors.values()) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--types", default="q4_0,q3_k,q2_k,q3_k_m")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4, help="evaluation windows")
    ap.add_argument("--calib-chunks", type=int, default=-1, help="calibration windows, -1 = all")
    ap.add_argument("--dir", help="working folder (default: a temporary one)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    bindir = llama_cpp_build.cache_dir(llama_cpp_build.host_cmake_flags()) / "bin"
    if not (bindir / "llama-quantize").exists():
        raise SystemExit(f"no llama-quantize in {bindir}: run python benchmarks/llama_cpp_build.py --tools")
    import llama_cpp

    print("llama.cpp:", llama_cpp.llama_print_system_info().decode().strip())
    base = Path(hub.resolve_model(args.model))
    tmpd = tempfile.TemporaryDirectory(dir=args.dir) if not args.dir else None
    work = Path(tmpd.name if tmpd else args.dir)
    calib, eval_text = texts(work)
    src = work / "source-f32.gguf"
    if not src.exists():
        run(ours_cmd(base, src, "f32", None))
    ours_im, llama_im = work / "ours.imatrix.gguf", work / "llama.imatrix.gguf"
    t_cal = run([sys.executable, "-m", "edge_infer.cli", "-q", "quantize", str(base), str(work / "scratch.gguf"),
                 "--type", "q8_0", "--force", "--calibrate", str(calib), "--ctx", str(args.ctx), "--chunks",
                 str(args.calib_chunks), "--save-imatrix", str(ours_im)])
    t_lcal = run([str(bindir / "llama-imatrix"), "-m", str(base), "-f", str(calib), "-o", str(llama_im), "-c",
                  str(args.ctx), "-t", "2", "--no-ppl"] + (["--chunks", str(args.calib_chunks)] if args.calib_chunks > 0 else []))
    print(f"calibration: ours {t_cal:.0f} s (with a q8_0 write), llama-imatrix {t_lcal:.0f} s")
    with LLM(str(base), n_threads=2, device="cpu", max_model_len=args.ctx + 1, kv_cache_memory="256MiB") as llm:
        wins = scoring_windows(llm, llm.tokenizer.encode(eval_text, add_special=True), args.ctx, args.chunks)
        base_rows = [llm.prompt_logits(w)[args.ctx // 2 : args.ctx - 1].copy() for w in wins]
    rows: list[dict[str, Any]] = []
    variants = [(t, who, im) for t in args.types.split(",") for who, im in
                (("ours", None), ("ours+imatrix", ours_im), ("llama.cpp", None), ("llama.cpp+imatrix", llama_im))]
    variants += [(t, "ours", None) for t in ROUND_TRIP]
    for t, who, im in variants:
        out = work / f"{t}-{who}.gguf"
        cmd = ours_cmd(src, out, t, im) if who.startswith("ours") else llama_cmd(bindir, src, out, t, im)
        secs = run(cmd)
        r = score(out, wins, base_rows, args.ctx)
        row = {"type": t, "by": who, "MB": out.stat().st_size / 1e6, "bpw": bits_per_weight(out), "seconds": secs,
               "ppl": r.ppl, "ppl_source": r.ppl_base, "kl": r.mean_kl, "kl_std": r.kl_std, "top1": r.top1}
        if who.startswith("ours"):
            row["ppl_llama_cpp"] = llama_ppl(out, wins, args.ctx)
        rows.append(row)
        lp = f"  llama.cpp ppl {row['ppl_llama_cpp']:.4f}" if "ppl_llama_cpp" in row else ""
        print(f"{t:<7} {who:<18} {row['MB']:>7.1f} MB {row['bpw']:.3f} bpw  ppl {r.ppl:.4f} (source {r.ppl_base:.4f})  "
              f"KL {r.mean_kl:.5f} +/- {r.kl_std:.5f}  top1 {100 * r.top1:.2f}%  {secs:.0f} s{lp}", flush=True)
        out.unlink()
    print("\n| type | by | MB | bits/weight | PPL | KL vs source | top-1 | quantize s |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['type']} | {r['by']} | {r['MB']:.1f} | {r['bpw']:.3f} | {r['ppl']:.4f} | {r['kl']:.5f} | "
              f"{100 * r['top1']:.2f}% | {r['seconds']:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if tmpd:
        tmpd.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
