"""A newcomer's first minute: `run` answers an instruction on an instruct model (its chat
template by default, `--raw` for completion, no template means no wrapping), an empty answer is
explained, the first compile says so once (-q silences it), and `doctor` explains the machine."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numba
import numpy as np
import pytest
from cli_helpers import run, without_compile_note

from edge_infer.chat import chat_by_default
from edge_infer.cli.common import COMPILE_NOTE, compile_notice
from edge_infer.cli.run import explain_empty
from edge_infer.kernels_cpu import jit_cache, ops

INSTRUCTION = "Write one sentence about the sea."
GREEDY = ["--temp", "0", "-n", "32"]


def _cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "edge_infer.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


# -- run: chat template by default ---------------------------------------------------------------
@pytest.mark.slow
def test_run_answers_an_instruction_on_the_default_model(
    capsys: pytest.CaptureFixture[str], smollm2_path: Path
) -> None:
    rc, out, err = run(capsys, "run", "-v", "-m", str(smollm2_path), *GREEDY, INSTRUCTION)
    assert rc == 0, err
    assert len(out.split()) >= 5, out  # an answer, not the empty line of plain completion
    assert "chat mode (the model has a chat template; --raw for plain completion)" in err, err
    rc, explicit, _ = run(capsys, "run", "--chat", "-m", str(smollm2_path), *GREEDY, INSTRUCTION)
    assert rc == 0 and explicit == out  # the default is exactly --chat

    # The same instruction as plain completion: SmolLM2 ends at once, and says what to try.
    rc, raw, err = run(capsys, "run", "--raw", "-m", str(smollm2_path), *GREEDY, INSTRUCTION)
    assert rc == 0 and raw.strip() == ""
    assert "edge-infer: the model ended at once: try --chat (the model has a chat template)" in err, err


@pytest.mark.slow
def test_a_model_without_a_template_is_not_wrapped(capsys: pytest.CaptureFixture[str], gemma3_path: Path) -> None:
    args = ["-m", str(gemma3_path), "--temp", "0", "-n", "6", "The capital of France is"]
    rc, out, err = run(capsys, "run", "-v", *args)
    assert rc == 0, err
    assert "plain completion (the model has no chat template)" in err, err
    rc, raw, _ = run(capsys, "run", "--raw", *args)
    assert rc == 0 and raw == out and out.strip()  # the text continued as it is


@pytest.mark.slow
def test_a_second_run_is_silent_on_stderr(smollm2_path: Path) -> None:
    argv = ("run", "-m", str(smollm2_path), *GREEDY, INSTRUCTION)
    first = _cli(*argv)  # compiles or loads the kernels
    assert first.returncode == 0, first.stderr
    assert without_compile_note(first.stderr) == ""
    second = _cli(*argv)
    assert second.returncode == 0 and second.stderr == "" and second.stdout == first.stdout


def test_chat_by_default_reads_the_template_and_the_name() -> None:
    t = {"tokenizer.chat_template": "{{ messages }}"}
    assert chat_by_default({}) == (False, "the model has no chat template")
    assert chat_by_default({"tokenizer.chat_template": "  "})[0] is False
    assert chat_by_default(t) == (True, "the model has a chat template")
    assert chat_by_default({**t, "general.name": "Qwen2.5 Coder 1.5B Instruct"})[0] is True
    assert chat_by_default({**t, "general.name": "Database Helper"})[0] is True  # "base" inside a word
    ok, why = chat_by_default({**t, "general.name": "Llama 3.1 8B Base"})
    assert not ok and "base model" in why and "general.name" in why
    assert chat_by_default({**t, "general.finetune": "base"})[0] is False


def test_an_empty_answer_is_explained(capsys: pytest.CaptureFixture[str], gemma3_path: Path) -> None:
    def output(n: int, reason: str) -> SimpleNamespace:
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0] * n)], finish_reason=reason)

    explain_empty(output(1, "stop"), True, gemma3_path)
    assert capsys.readouterr().err == "edge-infer: the model ended at once: try --raw for plain completion, or rephrase the prompt\n"
    explain_empty(output(5, "length"), False, gemma3_path)  # no template to suggest
    err = capsys.readouterr().err
    assert "wrote only whitespace (5 tokens, length)" in err and "try a longer or different prompt" in err


def test_mode_flag_mistakes(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "run", "--chat", "--raw", "hi")
    assert rc == 2 and "not allowed with argument" in err  # argparse's usage error


# -- the first compile ---------------------------------------------------------------------------
def test_the_first_compile_prints_one_note_and_quiet_silences_it(capsys: pytest.CaptureFixture[str]) -> None:
    x = np.ones((2, 3), np.float32)

    def fresh_compile() -> None:  # a new dispatcher of a package kernel: nothing cached, so it compiles
        numba.njit(ops.scale_kernel.py_func)(x, np.float32(2))

    remove = compile_notice(argparse.Namespace(quiet=False))
    try:
        numba.njit(lambda a: a + 1)(1)  # not one of our kernels: no note
        assert capsys.readouterr().err == ""
        fresh_compile()
        fresh_compile()
    finally:
        remove()
    err = capsys.readouterr().err
    assert err == COMPILE_NOTE.format(cpu=jit_cache_cpu()) + "\n", err
    fresh_compile()  # the hook removed
    remove = compile_notice(argparse.Namespace(quiet=True))
    try:
        fresh_compile()
    finally:
        remove()
    assert capsys.readouterr().err == ""


def jit_cache_cpu() -> str:
    from edge_infer.kernels_cpu.target import cpu_name

    return cpu_name()


def test_cache_status_counts_compiled_kernels() -> None:
    ops.scale_kernel(np.ones((1, 4), np.float32), np.float32(1))  # compiled or loaded: cached now
    s = jit_cache.jit_cache_status()
    assert s.error is None and s.location is not None
    done, total = s.kernels["ops"]
    assert 1 <= done <= total and total >= 5
    assert set(s.kernels) == set(jit_cache.KERNEL_MODULES)
    assert s.state in ("warm", "partly warm")


# -- doctor --------------------------------------------------------------------------------------
def _doctor_json(env: dict[str, str] | None = None, *extra: str) -> dict:
    p = _cli("doctor", "--json", *extra, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    return json.loads(p.stdout)


def test_doctor_reports_the_machine(capsys: pytest.CaptureFixture[str]) -> None:
    r = _doctor_json()
    cpu = r["cpu"]
    assert cpu["model"] and cpu["llvm_name"] and cpu["default_threads"] >= 1
    assert set(cpu["features"]) >= {"avx2", "avx512vnni", "f16c"} or set(cpu["features"]) >= {"neon", "dotprod"}
    paths = r["matmul_paths"]
    assert set(paths) >= {"F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}
    assert paths["Q4_0"] == f"int8 {r['int8_isa']}" and paths["F16"].startswith("float")
    assert r["numba"]["numba"] == numba.__version__ and r["numba"]["llvm"].count(".") == 2
    assert r["numba"]["layer"] in ("tbb", "omp", "workqueue")
    jc = r["jit_cache"]
    assert jc["location"] and jc["state"] in ("warm", "partly warm", "cold") and jc["total"] >= 40
    mem = r["memory"]
    assert 0 < mem["available_bytes"] <= mem["total_bytes"] and 0 < mem["default_kv_pool_bytes"] <= 4 * 2**30
    assert mem["read_bandwidth_gbps"] > 0
    assert {"cache_dir", "cached"} <= set(r["models"])
    assert r["cuda"]["usable"] is False and r["cuda"]["reason"]  # this machine has no GPU
    lc = r["llama_cpp"]
    assert lc["installed"] is False or ("system_info" in lc and isinstance(lc["amx"], bool))
    blas = r["numpy_blas"]  # NumPy's wheels ship OpenBLAS: its kernels and threads named
    assert blas is None or (blas["api"] and blas["threads"] >= 1)

    rc, out, _ = run(capsys, "doctor", "--no-bandwidth")
    assert rc == 0
    for label in ("CPU", "features", "weight types", "numba", "NumPy BLAS", "JIT cache", "memory", "models", "CUDA", "llama.cpp"):
        assert any(line.startswith(label) for line in out.splitlines()), (label, out)


def test_doctor_on_a_generic_cpu_and_a_cold_cache(tmp_path: Path) -> None:
    r = _doctor_json({"NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path)}, "--no-bandwidth")
    assert r["cpu"]["llvm_name"] == "generic" and r["int8_isa"] == "generic"
    assert r["matmul_paths"]["Q8_0"] == "int8 generic" and not any(r["cpu"]["features"].values())
    assert r["jit_cache"]["state"] == "cold" and r["jit_cache"]["compiled"] == 0
    assert r["jit_cache"]["location"].startswith(str(tmp_path))
    assert r["memory"]["read_bandwidth_gbps"] is None


@pytest.mark.slow
def test_doctor_reports_a_models_matrices(capsys: pytest.CaptureFixture[str], smollm2_path: Path) -> None:
    rc, out, err = run(capsys, "doctor", "--json", "--no-bandwidth", "-m", str(smollm2_path))
    assert rc == 0, err
    m = json.loads(out)["model"]
    assert m["arch"] == "llama" and m["size"] == smollm2_path.stat().st_size
    by_type = {g["type"]: g for g in m["matrices"]}
    assert by_type["Q4_1"]["count"] == 210 and by_type["Q4_1"]["path"].startswith("int8 ")
    assert by_type["Q8_0"]["count"] == 1  # the tied embedding as the output matrix, on the int8 kernel
    rc, _, err = run(capsys, "doctor", "-m", "/no/such/model.gguf")
    assert rc == 1 and err.startswith("edge-infer: error: /no/such/model.gguf: no such file"), err
