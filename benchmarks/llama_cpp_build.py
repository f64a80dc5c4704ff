#!/usr/bin/env python3
"""Builds llama.cpp at its best for this host: the fair baseline and correctness oracle.

`GGML_NATIVE=OFF` with every SIMD extension the host's CPU reports (x86: AVX2, FMA, F16C, BMI2,
AVX-VNNI, AVX-512 F/BW/VL/VNNI/VBMI/BF16, each only if present) and AMX off, so the build
neither crashes in the AMX path nor uses an instruction another CPU lacks (the flags are
derived from /proc/cpuinfo). It builds:
  - the llama-cpp-python wheel, kept in a cache folder of its own keyed by version and flags
    (pip's wheel cache ignores CMAKE_ARGS and would hand back a build with other flags):
    $EDGE_INFER_CACHE/llama-cpp/<version>-<key>/ (default ~/.cache/edge-infer/...);
  - with --tools, llama-server, llama-bench, llama-quantize, llama-imatrix and llama-perplexity
    from the vendor/llama.cpp of the same sdist, into that folder's bin/.

    python benchmarks/llama_cpp_build.py --install     # build once (a few minutes), install
    python benchmarks/llama_cpp_build.py --tools       # also the command-line tools (TOOLS)
    python benchmarks/llama_cpp_build.py --print       # the flags and the cache folder

Standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # the llama-cpp-python release pinned by pyproject.toml's [test] extra
# (cpuinfo flag, GGML CMake option); an option is ON only when the CPU has every listed flag
X86_OPTIONS = (
    (("avx",), "GGML_AVX"),
    (("avx2",), "GGML_AVX2"),
    (("fma",), "GGML_FMA"),
    (("f16c",), "GGML_F16C"),
    (("bmi2",), "GGML_BMI2"),
    (("avx_vnni",), "GGML_AVX_VNNI"),
    (("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"), "GGML_AVX512"),
    (("avx512vbmi",), "GGML_AVX512_VBMI"),
    (("avx512_vnni",), "GGML_AVX512_VNNI"),
    (("avx512_bf16",), "GGML_AVX512_BF16"),
)
TOOLS = ("llama-server", "llama-bench", "llama-quantize", "llama-imatrix", "llama-perplexity")
ALWAYS = ("-DGGML_NATIVE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_BF16=OFF")


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first CPU in /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cmake_flags(flags: set[str], machine: str) -> list[str]:
    """CMake options for a host with these CPU flags; on a non-x86 host, the compiler's
    defaults for the architecture (GGML_NATIVE=OFF still: no -march=native)."""
    out = list(ALWAYS)
    if machine in ("x86_64", "AMD64", "i686"):
        for needs, option in X86_OPTIONS:
            out.append(f"-D{option}={'ON' if all(f in flags for f in needs) else 'OFF'}")
    return out


def host_cmake_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    return cmake_flags(cpu_flags(text), platform.machine())


def cache_dir(flags: list[str]) -> Path:
    root = os.environ.get("EDGE_INFER_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "edge-infer"
    key = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
    return base / "llama-cpp" / f"{VERSION}-{platform.machine()}-py{sys.version_info[0]}{sys.version_info[1]}-{key}"


def _run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=cwd)


def build_wheel(flags: list[str], dest: Path) -> Path:
    """The cached wheel, built first if the folder has none. Built in a temporary folder and
    moved in whole, so an interrupted build leaves nothing half-written."""
    have = sorted(dest.glob("llama_cpp_python-*.whl"))
    if have:
        return have[-1]
    dest.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CMAKE_ARGS=" ".join(flags), FORCE_CMAKE="1",
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
              "-w", tmp, f"llama-cpp-python=={VERSION}"], env=env)
        built = sorted(Path(tmp).glob("llama_cpp_python-*.whl"))
        if not built:
            raise SystemExit("llama_cpp_build: pip built no llama_cpp_python wheel")
        final = dest / built[-1].name
        os.replace(built[-1], final)
    (dest / "cmake-flags.txt").write_text(" ".join(flags) + "\n")
    return final


def install(wheel: Path) -> None:
    """This wheel in place of any llama-cpp-python there (another build), then its dependencies."""
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", "--quiet", str(wheel)])
    _run([sys.executable, "-m", "pip", "install", "--quiet", str(wheel)])


def build_tools(flags: list[str], dest: Path) -> Path:
    """TOOLS from the same sdist's vendor/llama.cpp, into dest/bin."""
    bindir = dest / "bin"
    if all((bindir / name).exists() for name in TOOLS):
        return bindir
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        t = Path(tmp)
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python", "-d", str(t),
              f"llama-cpp-python=={VERSION}"])
        sdist = next(t.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            try:
                tar.extractall(t, filter="data")
            except TypeError:  # a Python without extraction filters (before 3.10.12 / 3.11.4)
                tar.extractall(t)
        src = next(t.glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = t / "build"
        _run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
              "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF", *flags])
        _run(["cmake", "--build", str(build), "--target", *TOOLS, "-j", str(os.cpu_count() or 1)])
        staged = t / "bin"
        staged.mkdir()
        for name in TOOLS:
            shutil.copy2(build / "bin" / name, staged / name)
        if bindir.exists():
            shutil.rmtree(bindir)
        os.replace(staged, bindir)
    return bindir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--install", action="store_true", help="install the wheel into this Python")
    ap.add_argument("--tools", action="store_true", help="also build " + ", ".join(TOOLS))
    ap.add_argument("--print", action="store_true", help="print the CMake flags and the cache folder, build nothing")
    args = ap.parse_args(argv)
    flags = host_cmake_flags()
    dest = cache_dir(flags)
    if args.print:
        print(" ".join(flags))
        print(dest)
        return 0
    try:
        wheel = build_wheel(flags, dest)
        print(f"llama-cpp-python {VERSION} wheel: {wheel}")
        if args.install:
            install(wheel)
        if args.tools:
            print(f"{', '.join(TOOLS)}: {build_tools(flags, dest)}")
    except subprocess.CalledProcessError as e:
        print(f"llama_cpp_build: {' '.join(map(str, e.cmd[:4]))} ... failed with exit code {e.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
