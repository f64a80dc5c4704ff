"""ik_llama.cpp's `llama-bench` as a second baseline for `edge-infer bench --ik-llama-bench
PATH`: the fastest CPU runtime we know, run on the same model file, prompt length, generated
length and threads, with its weights repacked at load (`-rtr 1`) and its defaults otherwise
(flash attention on). It is a separate build (never a dependency); its pp and tg are the
averages llama-bench reports over the repetitions. Its tg is generated after a prompt of
n_prompt tokens (`-gp n_prompt,n_gen`: "tg@pp"), as edge-infer's and llama.cpp's rows are:
llama-bench's own tg row starts from an empty context, where attention costs nothing (smollm2's
decode at 512 tokens of context ran 13% below that)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from edge_infer.errors import InvalidRequest


def check_llama_bench(path: str) -> str:
    """The absolute path of an executable llama-bench; InvalidRequest naming the problem."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise InvalidRequest(f"--ik-llama-bench: no file at {full} (give the llama-bench binary of an ik_llama.cpp build)")
    if not os.access(full, os.X_OK):
        raise InvalidRequest(f"--ik-llama-bench: {full} is not executable")
    return full


def run_ik_llama(path: str, model_path: str, threads: int, n_prompt: int, n_gen: int,
                 repetitions: int) -> dict[str, Any]:
    """pp_tps / tg_tps from one llama-bench run (JSON output), or {"error": ...}."""
    cmd = [path, "-m", model_path, "-t", str(threads), "-p", str(n_prompt), "-n", "0", "-gp", f"{n_prompt},{n_gen}",
           "-r", str(repetitions), "-rtr", "1", "-o", "json"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"ik_llama.cpp's llama-bench did not run: {e}"}
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"ik_llama.cpp's llama-bench exited with code {r.returncode}: {last}"}
    try:
        rows = json.loads(r.stdout)
        pp = next(x for x in rows if x["n_prompt"] == n_prompt and x["n_gen"] == 0)
        tg = next(x for x in rows if x["n_gen"] == n_gen and x["n_prompt"] == n_prompt)
    except (ValueError, KeyError, StopIteration, TypeError):
        return {"error": "ik_llama.cpp's llama-bench gave no pp and tg rows in its JSON output"}
    return {"pp_tps": float(pp["avg_ts"]), "tg_tps": float(tg["avg_ts"]), "cpu_info": pp.get("cpu_info", ""),
            "build_commit": pp.get("build_commit", ""), "flash_attn": pp.get("flash_attn"),
            "repack": pp.get("repack"), "path": path}


def format_ik_rows(res: dict[str, Any]) -> list[str]:
    """The table's ik_llama.cpp rows (figures, ratio, what ran)."""
    ik = res.get("ik_llama")
    if not ik:
        return []
    if "error" in ik:
        return [f"ik_llama.cpp: {ik['error']}"]
    e = res["edge"]
    return [f"{'ik_llama.cpp':12}{ik['pp_tps']:>16.1f}{ik['tg_tps']:>16.1f}",
            f"{'ratio (ik)':12}{e['pp_tps'] / ik['pp_tps']:>15.2f}x{e['tg_tps'] / ik['tg_tps']:>15.2f}x",
            f"ik_llama.cpp: {ik['path']} (build {ik['build_commit'] or 'unknown'}, -rtr 1, flash attention "
            f"{'on' if ik.get('flash_attn') else 'off'}; {ik['cpu_info']})"]
