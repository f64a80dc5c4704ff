#!/usr/bin/env bash
# Lint and type checks, run by .ci/run before the tests (both pinned in the [test] extras):
# ruff over the repo, then mypy over the package as installed. mypy cannot follow setuptools'
# package-dir mapping (formats/ -> edge_infer.formats, ...), so the three root folders are
# linked under build/mypy/edge_infer/ (pyproject's mypy_path) and its paths mapped back.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
mkdir -p build/mypy/edge_infer
ln -sfn ../../../formats ../../../kernels_cpu ../../../kernels_cuda build/mypy/edge_infer/
# mypy's incremental cache outside the clone (as numba's is), so that a clean clone checks in ~1 s
# what takes ~40 s cold; entries are validated by each source's hash, whatever the clone's path
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-$HOME/.cache/edge-infer/mypy}"
mypy | sed 's#^build/mypy/edge_infer/##'
