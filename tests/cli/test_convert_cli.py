"""`edge-infer convert HF_DIR OUT [--type T] [--force]`: writes the GGUF and says so; a user
mistake is one clear error line with exit code 1 and nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run
from gguf import GGUFReader
from tiny_bert import bert_config, write_tiny_bert


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_bert(tmp_path / "tiny-bert")


def test_convert_writes_the_file(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.gguf"
    rc, stdout, err = run(capsys, "convert", str(tiny), str(out), "--type", "q8_0")
    assert rc == 0 and err == ""
    assert stdout.startswith(f"wrote {out} (") and "Q8_0" in stdout
    r = GGUFReader(str(out))
    assert r.fields["general.architecture"].contents() == "bert"
    assert {t.tensor_type.name for t in r.tensors} == {"F32", "Q8_0"}
    rc, stdout, _ = run(capsys, "convert", str(tiny), str(tmp_path / "d.gguf"))  # f16 by default
    assert rc == 0 and "F16" in stdout


def test_existing_output_needs_force(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.gguf"
    out.write_bytes(b"mine")
    rc, _, err = run(capsys, "convert", str(tiny), str(out))
    assert_one_line_error(rc, err, str(out), "already exists", "--force")
    assert out.read_bytes() == b"mine"
    rc, _, _ = run(capsys, "convert", str(tiny), str(out), "--force")
    assert rc == 0 and out.read_bytes()[:4] == b"GGUF"


def test_user_mistakes_are_one_line(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(os.listdir(tmp_path))
    rc, _, err = run(capsys, "convert", str(tmp_path / "nope"), str(tmp_path / "o.gguf"))
    assert_one_line_error(rc, err, "nope", "no such folder")
    rc, _, err = run(capsys, "convert", str(tiny), str(tmp_path / "o.gguf"), "--type", "q4_0")
    assert_one_line_error(rc, err, "--type q4_0", "f32, f16, q8_0")
    write_tiny_bert(tiny, config=bert_config(architectures=["LlamaForCausalLM"]))
    rc, _, err = run(capsys, "convert", str(tiny), str(tmp_path / "o.gguf"))
    assert_one_line_error(rc, err, "'LlamaForCausalLM'", "BertModel")
    rc, _, err = run(capsys, "convert", str(tiny), str(tmp_path / "no" / "o.gguf"))
    assert_one_line_error(rc, err)
    assert sorted(os.listdir(tmp_path)) == before


def test_dense_modules_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """EmbeddingGemma's sentence-transformers Dense projections are written by default and left
    out with --no-sentence-transformers-dense-modules (llama.cpp's default file)."""
    from tiny_gemma_embedding import write_tiny_gemma_embedding

    folder = write_tiny_gemma_embedding(tmp_path / "eg")
    for flag, dense in ((), True), (("--no-sentence-transformers-dense-modules",), False):
        out = tmp_path / f"eg-{dense}.gguf"
        rc, _, err = run(capsys, "convert", str(folder), str(out), "--type", "f32", *flag)
        assert rc == 0 and err == ""
        names = {t.name for t in GGUFReader(str(out)).tensors}
        assert ("dense_2.weight" in names and "dense_3.weight" in names) == dense, flag
