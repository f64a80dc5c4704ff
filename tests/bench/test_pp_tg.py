"""`edge-infer bench` (pp/tg): llama.cpp is measured before and after us, its figures combined,
its build printed beside them."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import write_tiny_llama

from edge_infer.bench.pp_tg import BenchConfig, combine_baseline, format_table, run


def test_the_baseline_is_the_median_of_both_runs() -> None:
    before = {"pp_tps": 10.0, "tg_tps": 5.0, "pp_all": [9.0, 10.0, 11.0], "tg_all": [5.0, 5.0, 5.0], "extra_buffers": True}
    after = {"pp_tps": 20.0, "tg_tps": 4.0, "pp_all": [19.0, 20.0, 21.0], "tg_all": [4.0, 4.0, 4.0], "extra_buffers": True}
    got = combine_baseline(before, after)
    assert got is not None
    assert got["pp_tps"] == 15.0 and got["tg_tps"] == 4.5 and got["extra_buffers"]
    assert got["before"] == {"pp_tps": 10.0, "tg_tps": 5.0} and got["after"] == {"pp_tps": 20.0, "tg_tps": 4.0}
    failed = {"error": "llama.cpp exited with code -11"}
    assert combine_baseline(failed, None) is failed and combine_baseline(None, None) is None
    assert combine_baseline(before, failed) is before  # the run after ours failed: the one before stands


def test_bench_against_llama_cpp_on_a_tiny_model(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    path = write_tiny_llama(tmp_path / "tiny.gguf", qtype="Q8_0")
    res = run(BenchConfig(str(path), threads=1, n_prompt=16, n_gen=4, repetitions=1))
    ref = res["llama_cpp"]
    assert ref["pp_tps"] > 0 and ref["before"]["tg_tps"] > 0 and ref["after"]["tg_tps"] > 0
    assert res["ratio"]["pp"] == res["edge"]["pp_tps"] / ref["pp_tps"]
    build = res["llama_cpp_build"]
    assert "AVX" in build["system_info"] or "NEON" in build["system_info"] or "CPU" in build["system_info"]
    lim = res["decode_limit"]
    assert lim["bytes_per_token"] > 0 and lim["read_gbps"] > 0.1
    assert lim["edge_frac"] == pytest.approx(res["edge"]["tg_tps"] / lim["limit_tps"])
    table = format_table(res)
    assert "MiB of weights per token" in table and "before us" in table and "after us" in table and build["system_info"] in table


_FAKE_LLAMA_BENCH = """#!/bin/sh
# stands in for ik_llama.cpp's llama-bench: checks the flags edge-infer passes, prints its JSON
case "$*" in *"-p 16 -n 0 -gp 16,4"*"-rtr 1"*"-o json"*) ;; *) echo "unexpected flags: $*" >&2; exit 2;; esac
echo '[{"n_prompt": 16, "n_gen": 0, "avg_ts": 400.0, "cpu_info": "Test CPU", "build_commit": "abc1234",
  "flash_attn": true, "repack": true},
 {"n_prompt": 16, "n_gen": 4, "avg_ts": 50.0, "cpu_info": "Test CPU", "build_commit": "abc1234",
  "flash_attn": true, "repack": true}]'
"""


def test_ik_llama_bench_row_and_ratio(tmp_path: Path) -> None:
    fake = tmp_path / "llama-bench"
    fake.write_text(_FAKE_LLAMA_BENCH)
    fake.chmod(0o755)
    path = write_tiny_llama(tmp_path / "tiny.gguf", qtype="Q8_0")
    res = run(BenchConfig(str(path), threads=1, n_prompt=16, n_gen=4, repetitions=1, llama_cpp=False,
                          ik_llama_bench=str(fake)))
    ik = res["ik_llama"]
    assert ik["pp_tps"] == 400.0 and ik["tg_tps"] == 50.0 and ik["build_commit"] == "abc1234"
    table = format_table(res)
    assert "ik_llama.cpp           400.0            50.0" in table
    assert f"{res['edge']['pp_tps'] / 400.0:.2f}x" in table and "Test CPU" in table and "-rtr 1" in table
    fake.write_text("#!/bin/sh\necho 'no such model' >&2\nexit 1\n")
    res = run(BenchConfig(str(path), threads=1, n_prompt=16, n_gen=4, repetitions=1, llama_cpp=False,
                          ik_llama_bench=str(fake)))
    assert "exited with code 1: no such model" in res["ik_llama"]["error"]
    assert "ik_llama.cpp: ik_llama.cpp's llama-bench exited" in format_table(res)


def test_ik_llama_bench_path_is_checked(tmp_path: Path) -> None:
    from edge_infer.bench.ik_llama import check_llama_bench
    from edge_infer.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="no file at"):
        check_llama_bench(str(tmp_path / "missing"))
    plain = tmp_path / "llama-bench"
    plain.write_text("not a program")
    with pytest.raises(InvalidRequest, match="not executable"):
        check_llama_bench(str(plain))


def test_the_kv_types_asked_for_are_the_ones_we_run(tmp_path: Path) -> None:
    # the model path resolved, every other field kept: q4_0 KV was once run as f16 against
    # llama.cpp's q4_0
    path = write_tiny_llama(tmp_path / "tiny.gguf", qtype="Q8_0", d_model=128, n_heads=4)  # head size 32
    res = run(BenchConfig(str(path), threads=1, n_prompt=16, n_gen=4, repetitions=1, llama_cpp=False,
                          kv_cache_dtype="q4_0", kv_cache_dtype_v="q8_0"))
    assert res["kv"]["types"] == "q4_0/q8_0", res["kv"]
