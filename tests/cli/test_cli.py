"""The edge-infer command line: pull, models, inspect; one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, run
from gguf import GGUFWriter

from edge_infer import hub

CHAT_TEMPLATE = (
    "{% for message in messages %}\n" + "{{ message['content'] }} " * 40 + "{% endfor %}END-OF-TEMPLATE"
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGE_INFER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny model")
    w.add_uint32("llama.block_count", 1)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_token_list([f"tok{i}" for i in range(100)])
    w.add_array("llama.rope.sections", [1, 2, 3])
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_tensor("token_embd.weight", np.zeros((100, 32), dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_models_lists_known_models_and_cache(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache.mkdir(parents=True)
    (cache / "smollm2-135m.gguf").write_bytes(b"x")  # wrong size
    (cache / "mine.gguf").write_bytes(b"y" * 2048)
    rc, out, err = run(capsys, "models")
    assert rc == 0 and err == ""
    assert f"cache: {cache}" in out
    for m in hub.KNOWN_MODELS.values():
        line = next(ln for ln in out.splitlines() if ln.startswith(m.name + " "))
        assert m.license in line
    assert "Gemma Terms of Use" in out and "93.8 MiB" in out and "wrong size" in out
    assert "mine.gguf  2.0 KiB" in out

    rc, out, _ = run(capsys, "models", "--json")
    data = json.loads(out)
    assert rc == 0 and data["cache_dir"] == str(cache) and data["default"] == hub.DEFAULT_MODEL
    assert [m["name"] for m in data["models"]] == list(hub.KNOWN_MODELS)
    assert {m["cached"] for m in data["models"]} == {"no", "wrong size"}
    assert data["other_files"] == [{"path": str(cache / "mine.gguf"), "size": 2048}]


def test_inspect_text(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "inspect", str(tiny_gguf))
    assert rc == 0 and err == ""
    assert out.startswith(str(tiny_gguf) + "\n  GGUF v3")
    assert "[100 strings]" in out and "[1, 2, 3]" in out and "1e-05" in out
    assert '"tiny model"' in out
    template_line = next(ln for ln in out.splitlines() if "tokenizer.chat_template" in ln)
    assert f"({len(CHAT_TEMPLATE):,} chars)" in template_line and "END-OF-TEMPLATE" not in out
    assert "token_embd.weight" in out and "32 x 100" in out and "12,800" in out
    assert (
        out.splitlines()[-1]
        == "total: 2 tensors, 3.2K parameters, 12.6 KiB of tensor data (F32 x 1, F16 x 1)"
    )


def test_inspect_json(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(tiny_gguf), "--json")
    r = json.loads(out)
    assert rc == 0 and r["version"] == 3 and r["path"] == str(tiny_gguf)
    md = r["metadata"]
    assert md["tokenizer.ggml.tokens"] == {"type": "array[string]", "length": 100}
    assert md["llama.rope.sections"] == {"type": "array[int32]", "length": 3, "values": [1, 2, 3]}
    assert md["tokenizer.chat_template"] == CHAT_TEMPLATE  # JSON keeps strings whole
    assert md["general.architecture"] == "llama" and r["metadata_types"]["llama.block_count"] == "uint32"
    assert r["tensors"][0] == {
        "name": "token_embd.weight",
        "type": "F32",
        "shape": [32, 100],
        "offset": 0,
        "nbytes": 12800,
    }
    assert r["totals"]["tensors"] == 2 and r["totals"]["parameters"] == 3232
    assert r["totals"]["by_type"]["F16"] == {"tensors": 1, "nbytes": 64}


def test_inspect_real_default_model(smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = time.perf_counter()
    rc, out, _ = run(capsys, "inspect", str(smollm2_path))
    elapsed = time.perf_counter() - t
    assert rc == 0 and "[49152 strings]" in out and '"llama"' in out
    assert out.splitlines()[-1].startswith("total: 272 tensors, 134.5M parameters")
    assert elapsed < 1.5  # about 0.3 s; generous because the CI box is shared
    rc, out, _ = run(capsys, "inspect", str(smollm2_path), "--json")
    r = json.loads(out)
    assert r["metadata"]["tokenizer.ggml.merges"]["length"] == 48900
    assert len(r["tensors"]) == r["totals"]["tensors"] == 272


def test_inspect_missing_corrupt_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "inspect", str(tmp_path / "nope.gguf"))
    assert_one_line_error(rc, err, "nope.gguf", "no such file")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all, just some bytes")
    rc, _, err = run(capsys, "inspect", str(bad))
    assert_one_line_error(rc, err, "bad.gguf", "bad magic")
    rc, _, err = run(capsys, "inspect", str(tmp_path))
    assert_one_line_error(rc, err, "directory")


def test_unknown_model_lists_known_names(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "inspect", "llama-7b")
    assert_one_line_error(rc, err, "unknown model 'llama-7b'", *hub.KNOWN_MODELS)
    rc, _, err = run(capsys, "pull", "llama-7b")
    assert_one_line_error(rc, err, "unknown model 'llama-7b'")


def test_inspect_known_model_not_pulled(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "inspect", "gemma3-270m")
    assert_one_line_error(rc, err, "edge-infer pull gemma3-270m")


def test_pull_prints_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = {}

    def fake_pull(name: str, *, sha256: str | None = None, progress: bool | None = None) -> Path:
        seen.update(name=name, sha256=sha256)
        return tmp_path / "x.gguf"

    monkeypatch.setattr(hub, "pull", fake_pull)
    rc, out, err = run(capsys, "-v", "pull", "http://h/x.gguf", "--sha256", "ab" * 32)
    assert (rc, out, err) == (0, f"{tmp_path / 'x.gguf'}\n", "")
    assert seen == {"name": "http://h/x.gguf", "sha256": "ab" * 32}


def test_ctrl_c_exits_130_without_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*a: object, **k: object) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(hub, "pull", interrupted)
    rc, out, err = run(capsys, "pull", "smollm2-135m", "-v")
    assert rc == 130 and out == "" and err == "edge-infer: interrupted\n"


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(
            capsys,
        )[0]
        == 2
    )
    assert run(capsys, "frobnicate")[0] == 2
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "pull" in out and "inspect" in out and "models" in out


def _cli_process(*argv: str) -> list[str]:
    return [sys.executable, "-m", "edge_infer.cli", *argv]


def test_real_process_prints_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    p = subprocess.run(_cli_process("inspect", str(bad)), capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("edge-infer: error: ") and p.stderr.count("\n") == 1, p.stderr


def test_broken_pipe_is_quiet(smollm2_path: Path) -> None:
    p = subprocess.Popen(
        _cli_process("inspect", str(smollm2_path)), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # like `| head` exiting before we write
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141
    assert err == ""


def test_verbose_counts_before_and_after_the_subcommand() -> None:
    from edge_infer.cli import build_parser

    p = build_parser()
    for argv, want in ((["-vv", "models"], 2), (["models", "-vv"], 2), (["-v", "models", "-v"], 2), (["models"], 0)):
        a = p.parse_args(argv)
        assert a.verbose + a.verbose_before == want, argv


def test_inspect_names_layer_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hybrid_models import write_falcon_h1, write_granitehybrid, write_lfm2, write_nemotron_h, write_qwen35

    rc, out, _ = run(capsys, "inspect", str(write_nemotron_h(tmp_path / "nemotron.gguf")))
    assert rc == 0 and "layers: 10 (4 mamba2, 4 ffn, 2 attention)" in out
    rc, out, _ = run(capsys, "inspect", str(write_falcon_h1(tmp_path / "falcon.gguf")))
    assert rc == 0 and "layers: 4 (4 attention+mamba2)" in out
    rc, out, _ = run(capsys, "inspect", str(write_granitehybrid(tmp_path / "granite.gguf")))
    assert rc == 0 and "layers: 6 (4 mamba2, 2 attention); recurrent state 41.0 KiB per sequence" in out
    rc, out, _ = run(capsys, "inspect", str(write_qwen35(tmp_path / "qwen35.gguf")))
    assert rc == 0 and "layers: 8 (6 gated_deltanet, 2 attention); recurrent state 33.0 KiB per sequence" in out
    path = write_lfm2(tmp_path / "lfm2.gguf")
    rc, out, _ = run(capsys, "inspect", str(path))
    assert rc == 0 and "layers: 6 (4 short_conv, 2 attention); recurrent state 2.0 KiB per sequence" in out
    rc, out, _ = run(capsys, "inspect", str(path), "--json")
    assert json.loads(out)["layers"] == {"kinds": ["short_conv", "attention", "short_conv", "short_conv", "attention",
                                                   "short_conv"], "state_bytes_per_sequence": 2048}


def test_inspect_describes_a_projector(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An mmproj file is described as one (not "not runnable"); a refused projector says why."""
    from tiny_qwen_vl import write_tiny_qwen_vl_mmproj

    mm = write_tiny_qwen_vl_mmproj(tmp_path / "mm.gguf")
    rc, out, _ = run(capsys, "inspect", str(mm))
    assert rc == 0 and "a multimodal projector: qwen2.5vl_merger, a vision tower of 4 blocks 32 wide" in out
    assert "--mmproj FILE" in out
    rc, out, _ = run(capsys, "inspect", str(mm), "--json")
    assert rc == 0 and json.loads(out)["layers"]["projector"]["text_width"] == 64
