"""The baseline build script derives llama.cpp's CMake flags from the CPU's own flags: every
extension the CPU has, none it lacks, AMX always off, no -march=native."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "llama_cpp_build.py"
spec = importlib.util.spec_from_file_location("llama_cpp_build", SCRIPT)
assert spec is not None and spec.loader is not None
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)

ZEN4 = ("fma avx f16c bmi1 avx2 bmi2 avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 "
        "avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg")
SAPPHIRE = ZEN4 + " avx_vnni amx_bf16 amx_tile amx_int8"


def _options(flags: list[str]) -> dict[str, str]:
    return dict(f[2:].split("=") for f in flags)


def test_flags_follow_the_cpu_and_amx_stays_off() -> None:
    zen4 = _options(build.cmake_flags(build.cpu_flags(f"processor: 0\nflags\t\t: {ZEN4}\n"), "x86_64"))
    assert zen4["GGML_NATIVE"] == "OFF" and zen4["GGML_AMX_INT8"] == zen4["GGML_AMX_TILE"] == "OFF"
    for on in ("GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX512", "GGML_AVX512_VBMI",
               "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert zen4[on] == "ON", on
    assert zen4["GGML_AVX_VNNI"] == "OFF"  # Zen 4 has AVX512-VNNI, not the VEX-coded AVX-VNNI
    sapphire = _options(build.cmake_flags(build.cpu_flags(f"flags : {SAPPHIRE}\n"), "x86_64"))
    assert sapphire["GGML_AVX_VNNI"] == "ON" and sapphire["GGML_AMX_INT8"] == "OFF"


def test_avx512_needs_all_of_its_base_extensions_and_old_cpus_get_none() -> None:
    partial = _options(build.cmake_flags({"avx", "avx2", "avx512f"}, "x86_64"))
    assert partial["GGML_AVX512"] == "OFF" and partial["GGML_AVX2"] == "ON"
    old = _options(build.cmake_flags({"sse4_2"}, "x86_64"))
    assert all(v == "OFF" for v in old.values())


def test_other_architectures_get_the_compilers_defaults() -> None:
    arm = build.cmake_flags(build.cpu_flags("Features\t: fp asimd evtstrm aes crc32 asimddp\n"), "aarch64")
    assert arm == list(build.ALWAYS)


def test_the_cache_folder_is_keyed_by_the_flags(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EDGE_INFER_CACHE", str(tmp_path))
    a = build.cache_dir(build.cmake_flags(build.cpu_flags(f"flags: {ZEN4}"), "x86_64"))
    b = build.cache_dir(build.cmake_flags(build.cpu_flags(f"flags: {SAPPHIRE}"), "x86_64"))
    assert a != b and a.parent == b.parent == tmp_path / "llama-cpp" and build.VERSION in a.name
