#!/bin/bash
# The bounded aarch64 CI job (run by .ci/run after the native tests): under qemu user-mode as a
# Cortex-A76 (scripts/arm_env.sh), the int8 kernels against their NumPy twins, the asm check
# that they compile to sdot, and tiny models' greedy generation equal to this host's.
# The environment and numba's cache for it live in ~/.cache/edge-infer/arm (EDGE_INFER_ARM_DIR):
# a warm cache takes a few minutes; a cold one (first download, first compile) took 14 + 14 minutes
# for the two steps on 2026-12-07, after the GEMM pair tiles added code to compile; on a slower
# 2-core AVX2 Zen 3 the first step took 25 minutes (bounded at 40 each).
set -euo pipefail
cd "$(dirname "$0")/.."
D=${EDGE_INFER_ARM_DIR:-$HOME/.cache/edge-infer/arm}
PYTHON=${PYTHON:-python} scripts/arm_env.sh "$D"
${PYTHON:-python} scripts/arm_parity.py --write "$D/expected.json"
cd "$D/repo"
timeout 2400 "$D/py" -m pytest -q -p no:cacheprovider -rs tests/kernels_cpu/test_asm_arm.py \
  tests/kernels_cpu/test_matmul_i8.py::test_int8_matmul_against_twin_and_invariance \
  tests/kernels_cpu/test_matmul_k.py::test_k_quant_matmul_against_twin_and_invariance
timeout 2400 "$D/py" scripts/arm_parity.py --check "$D/expected.json"
