"""`edge-infer quantize` and `perplexity --kl-base` on the real default model: calibration
collects an importance matrix that lowers the error, the file is reusable and in llama.cpp's
format, the same inputs give the same bytes, and every user mistake is one clear error that
leaves the output as it was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, run
from gguf import GGUFReader

from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.imatrix import Imatrix, ImatrixError
from edge_infer.llm import LLM
from edge_infer.quantize.calibrate import collect_imatrix

CALIB = "/usr/share/common-licenses/GPL-3"
EVAL = "/usr/share/common-licenses/MPL-2.0"


@pytest.fixture(scope="module")
def calibrated(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """smollm2 at q4_0 with calibration (2 windows), and the importance matrix it saved."""
    d = tmp_path_factory.mktemp("q")
    out, im = d / "cal.gguf", d / "im.gguf"
    from edge_infer.cli import main

    assert main(["-q", "quantize", str(smollm2_path), str(out), "--type", "q4_0", "--calibrate", CALIB,
                 "--chunks", "2", "--save-imatrix", str(im), "--json"]) == 0
    return out, im


def test_the_imatrix_is_llama_cpp_s_format(calibrated: tuple[Path, Path], smollm2_path: Path) -> None:
    _, im_path = calibrated
    r = GGUFReader(str(im_path))
    assert bytes(r.fields["general.type"].parts[-1]).decode() == "imatrix"
    assert int(r.fields["imatrix.chunk_count"].parts[-1][0]) == 2 and int(r.fields["imatrix.chunk_size"].parts[-1][0]) == 512
    names = {t.name for t in r.tensors}
    assert "blk.0.ffn_down.weight.in_sum2" in names and "blk.0.ffn_down.weight.counts" in names
    im = Imatrix.load(im_path)
    with GGUFFile(smollm2_path) as f:
        mats = {n for n, t in f.tensors.items() if len(t.shape) == 2 and n not in ("output.weight", "token_embd.weight")}
    assert set(im.sums) == mats  # every matrix multiplied with, but the output (tied: token_embd), as llama-imatrix
    assert all(c[0] == 1024 for c in im.counts.values())  # 2 windows of 512 tokens
    assert im.sums["blk.0.ffn_down.weight"].shape == (1, 1536) and (im.sums["blk.0.ffn_down.weight"] > 0).all()


def test_calibration_lowers_kl_and_the_imatrix_is_reusable(calibrated: tuple[Path, Path], smollm2_path: Path,
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal, im = calibrated
    rtn, again = tmp_path / "rtn.gguf", tmp_path / "again.gguf"
    assert run(capsys, "-q", "quantize", str(smollm2_path), str(rtn), "--type", "q4_0")[0] == 0
    assert run(capsys, "-q", "quantize", str(smollm2_path), str(again), "--type", "q4_0", "--imatrix", str(im))[0] == 0
    assert again.read_bytes() == cal.read_bytes()  # same statistics, same bytes
    kl = {}
    for name, path in (("rtn", rtn), ("cal", cal)):
        rc, out, err = run(capsys, "-q", "perplexity", "-m", str(path), "-f", EVAL, "--kl-base", str(smollm2_path),
                           "--chunks", "2", "--json", "-t", "2")
        assert rc == 0, err
        kl[name] = json.loads(out)
    assert kl["cal"]["mean_kl"] < 0.8 * kl["rtn"]["mean_kl"], kl
    assert kl["cal"]["top1_agreement"] > kl["rtn"]["top1_agreement"]
    with GGUFFile(cal) as f:
        assert f.metadata["quantize.imatrix.chunks_count"] == 2 and f.metadata["general.file_type"] == 2


def test_kl_against_itself_is_zero_and_matches_a_direct_computation(smollm2_path: Path, calibrated: tuple[Path, Path]) -> None:
    from support.llama_oracle import kl_rows

    from edge_infer.bench.kl_divergence import kl_divergence

    cal, _ = calibrated
    text = Path(EVAL).read_text()
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="64MiB") as base, \
            LLM(str(cal), n_threads=2, kv_cache_memory="64MiB") as q:
        toks = base.tokenizer.encode(text, add_special=True)
        same = kl_divergence(base, base, toks, 256, 2)
        assert same.mean_kl == pytest.approx(0, abs=1e-9) and same.top1 == 1 and same.ppl_ratio == pytest.approx(1)
        r = kl_divergence(q, base, toks, 256, 1)
        w = toks[:256]
        w[0] = base.tokenizer.bos_id if base.tokenizer.add_bos else w[0]
        direct = kl_rows(base.prompt_logits(w)[128:255], q.prompt_logits(w)[128:255]).mean()
    assert r.mean_kl == pytest.approx(direct, rel=1e-6) and r.tokens_scored == 127


@pytest.mark.parametrize("argv, needles", [
    (["--type", "q4_x"], ["unknown --type 'q4_x'"]),
    (["--type", "q8_0", "--keep", "blk.0.*"], ["expected PATTERN=TYPE"]),
    (["--type", "q8_0", "--keep", "layer.*=q8_0"], ["matches no tensor"]),
    (["--type", "q8_0", "--save-imatrix", "x.gguf"], ["--save-imatrix needs --calibrate"]),
    (["--type", "q8_0", "--imatrix", EVAL], ["bad magic"]),
    (["--type", "q8_0", "--calibrate", "/nonexistent.txt"], ["/nonexistent.txt: no such file"]),
    (["--type", "iq2_xs"], ["--type iq2_xs: IQ2_XS needs an importance matrix", "--imatrix FILE"]),
    (["--type", "q8_0", "--keep", "blk.0.*=iq2_xxs"], ["IQ2_XXS needs an importance matrix"]),
])
def test_mistakes_are_one_clear_error(smollm2_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      argv: list[str], needles: list[str]) -> None:
    out = tmp_path / "o.gguf"
    rc, _, err = run(capsys, "quantize", str(smollm2_path), str(out), *argv)
    assert_one_line_error(rc, err, *needles)
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temporary file


def test_an_existing_output_is_kept_without_force(smollm2_path: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.gguf"
    out.write_bytes(b"mine")
    rc, _, err = run(capsys, "quantize", str(smollm2_path), str(out), "--type", "q8_0")
    assert_one_line_error(rc, err, "already exists", "--force")
    assert out.read_bytes() == b"mine"
    rc, stdout, err = run(capsys, "-q", "quantize", str(smollm2_path), str(out), "--type", "q8_0", "--force",
                          "--keep", "blk.0.*=f16")
    assert rc == 0, err
    assert "F16" in stdout and "bits per weight" in stdout
    with GGUFFile(out) as f:
        assert f.tensors["blk.0.attn_q.weight"].type.name == "F16" and f.tensors["blk.1.attn_q.weight"].type.name == "Q8_0"


def test_a_non_imatrix_gguf_is_refused(smollm2_path: Path) -> None:
    with pytest.raises(ImatrixError, match="not an importance matrix"):
        Imatrix.load(smollm2_path)


def test_expert_stacks_get_per_expert_statistics(tmp_path: Path) -> None:
    from support.arch_models import write_arch_model

    path = write_arch_model(tmp_path / "moe.gguf", "qwen2moe", experts=(4, 2, 64), shared_ffn=64)
    with LLM(str(path), n_threads=2, kv_cache_memory="16MiB") as llm:
        im = collect_imatrix(llm, list(np.random.default_rng(0).integers(3, 200, 128)), ctx=64)
    gate = im.counts["blk.0.ffn_gate_exps.weight"]
    assert gate.shape == (4,) and gate.sum() == 2 * 128  # each of the 128 tokens chose 2 experts
    assert im.counts["blk.0.ffn_down_exps.weight"].sum() == 256 and im.counts["blk.0.attn_q.weight"][0] == 128


@pytest.mark.parametrize("bad", ["counts_f16", "sum2_q8_0"])
def test_an_imatrix_tensor_of_another_type_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              bad: str) -> None:
    """llama-imatrix writes F32 only: other bytes are refused naming the tensor and its type, not a
    numpy traceback (the old reader viewed any bytes as float32)."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from tiny_models import write_tiny_llama

    model = write_tiny_llama(tmp_path / "m.gguf", n_layers=1)
    im = tmp_path / "im.gguf"
    w = GGUFWriter(str(im), arch="", use_temp_file=False)
    w.kv_data[0].pop("general.architecture", None)
    w.add_type("imatrix")
    sums = np.ones((1, 64), np.float32)
    if bad == "sum2_q8_0":  # 64 values as two Q8_0 blocks (2 x 34 bytes)
        w.add_tensor("blk.0.attn_q.weight.in_sum2", np.zeros((1, 68), np.uint8), raw_dtype=GGMLQuantizationType.Q8_0)
    else:
        w.add_tensor("blk.0.attn_q.weight.in_sum2", sums)
    counts = np.ones((1, 1), np.float16 if bad == "counts_f16" else np.float32)
    w.add_tensor("blk.0.attn_q.weight.counts", counts)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "o.gguf"
    rc, _, err = run(capsys, "quantize", str(model), str(out), "--type", "q8_0", "--imatrix", str(im))
    name, kind = ("counts", "F16") if bad == "counts_f16" else ("in_sum2", "Q8_0")
    assert_one_line_error(rc, err, f"tensor blk.0.attn_q.weight.{name} has type {kind}, expected F32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["im.gguf", "m.gguf"]  # no output, no temporary file


def test_the_help_lists_every_type_it_takes() -> None:
    from edge_infer.cli.quantize import TYPES_HELP
    from edge_infer.formats.quant_policy import MIXES, PLAIN

    assert set(TYPES_HELP.replace(";", " ").split()) >= set(PLAIN) | set(MIXES)
