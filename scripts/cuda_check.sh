#!/usr/bin/env bash
# The CUDA backend on a real GPU (the device tool's machine: Python 3.12, numba, numba-cuda and
# the CUDA toolkit already installed; carry only what is missing). Stages with their own
# timeouts, each writing a log (and the benchmarks JSON) under $OUT; about 8 minutes in all:
#   1. the CUDA kernel and engine tests, un-simulated (tests/kernels_cuda)
#   2. agreement with the CPU backend and speed on a 1.5B-shaped random Q4_0 model
#   3. speed on an 8B-shaped one (32 layers, width 4096, GQA 32/8; ~4.3 GB)
# Usage (from the repo root): OUT=/some/dir scripts/cuda_check.sh
set -uo pipefail
OUT="${OUT:-/tmp/cuda-check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

stage() {  # name seconds command...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: rc $rc in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
    tail -n 15 "$OUT/$name.log"
}

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
"$PY" -m pip install --quiet --no-deps -e . >"$OUT/install.log" 2>&1 || echo "install: see install.log"
stage kernels 180 "$PY" -m pytest -q -p no:cacheprovider tests/kernels_cuda
stage bench_1p5b 200 "$PY" benchmarks/bench_cuda.py --shape 1.5b --json "$OUT/bench_1p5b.json"
stage bench_8b 220 "$PY" benchmarks/bench_cuda.py --shape 8b --no-cpu --json "$OUT/bench_8b.json"
cat "$OUT/summary.txt"
