#!/bin/bash
# The bounded aarch64 CI job (.ci/run runs it after the native tests): under qemu user-mode as a
# Cortex-A76 (scripts/arm_env.sh), the int8 kernels against their NumPy twins, the asm check
# that they compile to sdot, and tiny models' greedy generation, then this host's generation of
# the same models compared with it token for token.
# The environment and numba's cache for the emulated Python live in ~/.cache/edge-infer/arm
# (EDGE_INFER_ARM_DIR); the native step uses the caller's NUMBA_CACHE_DIR (CI's x86 cache, which the
# native tests fill). A warm cache takes a few minutes; a cold one (every kernel source changed)
# took 17 + 14 minutes for the two emulated steps one after the other on a 2-core AVX2 Zen 3
# (bounded at 40 each; they now run at once).
set -euo pipefail
cd "$(dirname "$0")/.."
D=${EDGE_INFER_ARM_DIR:-$HOME/.cache/edge-infer/arm}
PYTHON=${PYTHON:-python} scripts/arm_env.sh "$D"
REPO=$PWD
rm -f "$D/aarch64.json"
cd "$D/repo"
# The two emulated steps run at once, one core each (emulated Python is one thread; cold, they
# took 17 and 14 minutes one after the other). numba's cache saves are locked
# (edge_infer/numba_cache.py), so the two processes can fill one cache folder.
NUMBA_CACHE_DIR="$D/numba-cache" timeout 2400 "$D/py" scripts/arm_parity.py --write "$D/aarch64.json" > "$D/parity.log" 2>&1 &
parity=$!
tests=0
NUMBA_CACHE_DIR="$D/numba-cache" timeout 2400 "$D/py" -m pytest -q -p no:cacheprovider -rs tests/kernels_cpu/test_asm_arm.py \
  tests/kernels_cpu/test_matmul_i8.py::test_int8_matmul_against_twin_and_invariance \
  tests/kernels_cpu/test_matmul_k.py::test_k_quant_matmul_against_twin_and_invariance || tests=$?
written=0
wait "$parity" || written=$?
cat "$D/parity.log"
if [ "$tests" -ne 0 ] || [ "$written" -ne 0 ]; then
  echo "aarch64 job: kernel tests exit $tests, greedy tokens exit $written" >&2
  exit 1
fi
cd "$REPO"
${PYTHON:-python} scripts/arm_parity.py --check "$D/aarch64.json"
