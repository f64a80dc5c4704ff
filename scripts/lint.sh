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
mypy | sed 's#^build/mypy/edge_infer/##'
