"""`requantize`: every target type writes a file llama.cpp loads and computes like edge-infer
(the same next-token distributions, token by token), blocks bit-exact with gguf-py's quantizers where it has them, the
metadata and tokenizer carried over, and nothing half-written on failure."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf import quants as gq
from support.llama_oracle import LlamaCpp, kl_rows
from support.quant_helpers import nll
from support.tiny_models import VOCAB_SIZE, write_tiny_llama

from edge_infer.errors import InvalidRequest
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.quant_policy import PLAIN, parse_target
from edge_infer.formats.quants import dequantize
from edge_infer.formats.requantize import requantize
from edge_infer.llm import LLM

TYPES = [n for n in PLAIN if n != "f32"] + ["q4_k_m"]  # the other mixes only choose other types
IDS = list(np.random.default_rng(7).integers(3, VOCAB_SIZE - 8, 96))


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("rq") / "f32.gguf", n_layers=2, d_model=256, ffn=512,
                            n_heads=4, n_kv_heads=2)


def _nll_both(path: Path, windows: list[list[int]]) -> tuple[float, float]:
    """Mean NLL over the windows under edge-infer and under llama.cpp."""
    ref = LlamaCpp(path, n_ctx=max(map(len, windows)))
    try:
        theirs = float(np.mean([nll(ref.logits(w), w) for w in windows]))
    finally:
        ref.close()
    with LLM(str(path), n_threads=2, kv_cache_memory="128MiB") as llm:
        ours = float(np.mean([nll(llm.prompt_logits(w), w) for w in windows]))
    return ours, theirs


@pytest.fixture(scope="module")
def text_ids(smollm2_path: Path) -> list[int]:
    """The first 256 tokens of GPL-3."""
    text = Path("/usr/share/common-licenses/GPL-3").read_text()
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="64MiB") as llm:
        return llm.tokenizer.encode(text, add_special=True)[:256]


@pytest.mark.parametrize("name", TYPES)
def test_every_type_loads_in_llama_cpp_and_agrees(smollm2_path: Path, text_ids: list[int], name: str,
                                                  tmp_path: Path) -> None:
    """The real model (Q4_1) requantized to each type: llama.cpp's next-token distributions and
    ours agree token by token (measured: mean KL 0.000-0.018 nats, top-1 0.91-1.0 over these 256
    tokens; a wrong block, scale or layout is a KL of several tenths). (smollm2's 576-wide rows
    take the K-quants' fallbacks; its 1536-wide ffn_down takes the K-quants themselves.)"""
    out = tmp_path / f"{name}.gguf"
    steps = requantize(smollm2_path, out, parse_target(name))
    assert out.stat().st_size > sum(p.new_bytes for p in steps)  # header + data, nothing missing
    ref = LlamaCpp(out, n_ctx=len(text_ids))
    try:
        theirs = ref.logits(text_ids)
    finally:
        ref.close()
    with LLM(str(out), n_threads=2, kv_cache_memory="128MiB") as llm:
        ours = llm.prompt_logits(text_ids)
    kl = kl_rows(theirs, ours)
    top1 = float(np.mean(theirs.argmax(1) == ours.argmax(1)))
    assert kl.mean() < 0.05 and top1 >= 0.85, (name, float(kl.mean()), top1)


@pytest.mark.parametrize("name", ["q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "f16"])
def test_blocks_bit_exact_with_gguf_py(src: Path, name: str, tmp_path: Path) -> None:
    out = requantize(src, tmp_path / "o.gguf", parse_target(name)) and tmp_path / "o.gguf"
    with GGUFFile(src) as a, GGUFFile(out) as b:
        for tname, t in b.tensors.items():
            if t.type not in (T.Q8_0, T.Q5_1, T.Q5_0, T.Q4_1, T.Q4_0, T.F16):  # gguf-py quantizes only these
                continue
            x = dequantize(a.tensors[tname])
            want = gq.quantize(x, t.type).reshape(-1)
            assert np.array_equal(np.asarray(t.data).reshape(-1), want.view(np.uint8)), tname


def test_metadata_and_tokenizer_are_carried_over(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.gguf"
    requantize(src, out, parse_target("q4_k_m"))
    with GGUFFile(src) as a, GGUFFile(out) as b:
        assert b.metadata["general.file_type"] == 15 and b.metadata["general.quantization_version"] == 2
        for key, val in a.metadata.items():
            if key not in ("general.file_type", "general.quantization_version"):
                assert b.metadata[key] == val and b.metadata_types[key] == a.metadata_types[key], key
        assert list(a.tensors) == list(b.tensors)
    GGUFReader(str(out))  # gguf-py reads it too
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # a plain file's permissions, not the temporary's 0600


def test_k_quants_on_k_shaped_rows_load_in_llama_cpp(src: Path, tmp_path: Path) -> None:
    """A model whose every row fits the K-quants: llama.cpp computes what we compute."""
    for name in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k"):
        out = requantize(src, tmp_path / f"{name}.gguf", parse_target(name)) and tmp_path / f"{name}.gguf"
        ours, theirs = _nll_both(out, [[int(i) for i in IDS]])
        assert abs(ours - theirs) < 0.05 * max(1.0, theirs / 10), (name, ours, theirs)  # a random model: huge NLLs


def test_refusals_leave_everything_as_it_was(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(InvalidRequest, match="already exists"):
        requantize(src, out, parse_target("q8_0"))
    assert out.read_bytes() == b"keep me"
    with pytest.raises(InvalidRequest, match="is the input file"):
        requantize(src, src, parse_target("q8_0"), force=True)
    with pytest.raises(InvalidRequest, match="does not exist"):
        requantize(src, tmp_path / "no" / "o.gguf", parse_target("q8_0"))


def test_a_failure_midway_leaves_no_file(tmp_path: Path) -> None:
    src = write_tiny_llama(tmp_path / "bad.gguf", n_layers=2, d_model=256, ffn=512)
    with GGUFFile(src) as f:
        t = f.tensors["blk.1.ffn_down.weight"]
        at = f.data_offset + t.offset
    with open(src, "r+b") as fh:  # a NaN in a late tensor: the writer is well under way
        fh.seek(at)
        fh.write(np.float32(np.nan).tobytes())
    out = tmp_path / "out.gguf"
    with pytest.raises(InvalidRequest, match="non-finite values"):
        requantize(src, out, parse_target("q4_0"))
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["bad.gguf"]
