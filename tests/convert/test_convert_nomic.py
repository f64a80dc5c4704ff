"""`convert_hf` on tiny NomicBertModel folders (nomic-embed-text v1.5's config and tensor names):
the keys, tensor names, shapes and types llama.cpp's converter writes; llama.cpp and edge-infer
load the file and agree (tokens, embeddings) with each other and with a NumPy forward of the
safetensors; what llama.cpp's converter asserts away is refused.

The expected keys below were checked against llama.cpp's own convert_hf_to_gguf.py (its
NomicBertModel, run out of tree with torch and transformers 4.57.6): our files were the same
bytes at F32, F16 and Q8_0. It cannot run here (torch), so the keys are spelled out.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from convert_checks import both_engines, cosine, fields, refused, tensors
from tiny_bert import SENTENCES, VOCAB
from tiny_nomic import NomicReference, nomic_config, nomic_tensors, write_tiny_nomic
from tokenizers import Tokenizer

from edge_infer.convert import convert_hf
from edge_infer.convert.nomic import gguf_name

KEYS = [
    "general.architecture", "general.type", "general.name", "general.size_label", "nomic-bert.block_count",
    "nomic-bert.context_length", "nomic-bert.embedding_length", "nomic-bert.feed_forward_length",
    "nomic-bert.attention.head_count", "nomic-bert.rope.freq_base", "nomic-bert.attention.layer_norm_epsilon",
    "general.file_type", "nomic-bert.attention.causal", "nomic-bert.pooling_type", "general.quantization_version",
    "tokenizer.ggml.token_type_count", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.mask_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_sep_token", "tokenizer.ggml.normalizer.lowercase",
]
VALUES = {
    "general.architecture": "nomic-bert", "general.name": "Tiny Nomic", "nomic-bert.block_count": 2,
    "nomic-bert.context_length": 2048, "nomic-bert.embedding_length": 64, "nomic-bert.feed_forward_length": 96,
    "nomic-bert.attention.head_count": 4, "nomic-bert.rope.freq_base": 1000.0, "nomic-bert.attention.causal": False,
    "nomic-bert.pooling_type": 1, "tokenizer.ggml.token_type_count": 2, "tokenizer.ggml.model": "bert",
    "tokenizer.ggml.pre": "default", "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.add_sep_token": False,
}
LAYER = [("attn_qkv.weight", [64, 192]), ("attn_output.weight", [64, 64]), ("ffn_up.weight", [64, 96]),
         ("ffn_gate.weight", [64, 96]), ("ffn_down.weight", [96, 64]), ("attn_output_norm.bias", [64]),
         ("attn_output_norm.weight", [64]), ("layer_output_norm.bias", [64]), ("layer_output_norm.weight", [64])]
TENSORS = [("token_embd_norm.bias", [64]), ("token_embd_norm.weight", [64]), ("token_types.weight", [64, 2]),
           ("token_embd.weight", [64, 128])] + [(f"blk.{i}.{n}", s) for i in range(2) for n, s in LAYER]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_nomic(tmp_path_factory.mktemp("hf") / "tiny-nomic")


@pytest.fixture(scope="module")
def converted(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf")
    return {t: convert_hf(tiny, out / f"nomic-{t}.gguf", t) for t in ("f32", "f16", "q8_0")}


def test_keys_and_tensors_are_llama_cpp_s(converted: dict[str, Path]) -> None:
    for t, ftype, matrix in (("f32", 0, "F32"), ("f16", 1, "F16"), ("q8_0", 7, "Q8_0")):
        f = fields(converted[t])
        assert list(f) == KEYS and {k: f[k] for k in VALUES} == VALUES and f["general.file_type"] == ftype
        assert f["nomic-bert.attention.layer_norm_epsilon"] == pytest.approx(1e-12)
        got = tensors(converted[t])
        assert [(n, s) for n, _, s in got] == TENSORS
        for name, qtype, shape in got:
            assert qtype == ("F32" if len(shape) == 1 or name == "token_types.weight" else matrix), name
    # vocab_size 128 pads the 109 tokens with unused ones, phantom-spaced like any non-control token
    f = fields(converted["f16"])
    pads = range(len(VOCAB), 128)
    assert f["tokenizer.ggml.tokens"][len(VOCAB):] == [f"\u2581[PAD{i}]" for i in pads]  # type: ignore[index]
    assert f["tokenizer.ggml.token_type"][len(VOCAB):] == [5] * len(pads)  # type: ignore[index]


def test_tensor_map_is_gguf_py_s(tiny: Path) -> None:
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.NOMIC_BERT, 2)
    for hf in nomic_tensors(nomic_config()):
        assert gguf_name(hf) == tmap.get_name(hf, try_suffixes=(".weight", ".bias")), hf
    assert gguf_name("bert.encoder.layers.1.norm2.gamma") == "blk.1.layer_output_norm.weight"
    assert gguf_name("encoder.layers.0.attn.rotary_emb.inv_freq") is None


def test_llama_cpp_edge_infer_and_reference_agree(tiny: Path, converted: dict[str, Path]) -> None:
    """Same tokens as the tokenizer; embeddings at cosine >= 0.9999 of each other and of the
    NumPy forward (about 1 - 1e-13 at F32), which without RoPE would be visibly off."""
    theirs, ours = both_engines(converted["f32"], SENTENCES)
    ref, tok = NomicReference(tiny), Tokenizer.from_file(str(tiny / "tokenizer.json"))
    for s in SENTENCES:
        ids = tok.encode(s).ids
        assert theirs[s][0] == ids and ours[s][0] == ids, s
        assert cosine(ours[s][1], theirs[s][1]) >= 0.9999, s
        assert cosine(theirs[s][1], ref.embed(ids)) >= 0.9999, s
        if len(ids) > 8:
            assert cosine(theirs[s][1], ref.embed(ids, rope=False)) < 0.999, s


def test_q8_0_close(converted: dict[str, Path]) -> None:
    theirs, ours = both_engines(converted["q8_0"], SENTENCES[:2])
    for s in SENTENCES[:2]:
        assert cosine(ours[s][1], theirs[s][1]) >= 0.999, s


def folder(tmp_path: Path, **over: object) -> Path:
    return write_tiny_nomic(tmp_path / "hf", config=nomic_config(**over))


@pytest.mark.parametrize("over, needles", [
    ({"moe_every_n_layers": 2}, ("mixture-of-experts",)),
    ({"activation_function": "gelu"}, ("activation_function 'gelu'", "'swiglu'")),
    ({"qkv_proj_bias": True}, ("qkv_proj_bias True",)),
    ({"prenorm": True}, ("prenorm True",)),
    ({"rotary_emb_interleaved": True}, ("rotary_emb_interleaved",)),
    ({"n_positions": 4096}, ("n_positions 4096", "max_trained_positions 2048")),
    ({"n_head": 5}, ("n_embd 64 is not a multiple of n_head 5",)),
    ({"rotary_scaling_factor": None, "rope_scaling": {"type": "yarn", "factor": 2.0}}, ("rope scaling 'yarn'",)),
])
def test_unsupported_configs(tmp_path: Path, over: dict[str, object], needles: tuple[str, ...]) -> None:
    refused(folder(tmp_path, **over), tmp_path / "m.gguf", "config.json", *needles)


def test_missing_config_key(tmp_path: Path) -> None:
    src = folder(tmp_path)
    c = nomic_config()
    del c["causal"]
    (src / "config.json").write_text(json.dumps(c))
    refused(src, tmp_path / "m.gguf", "causal is missing")


def test_tokenizer_refusals(tmp_path: Path) -> None:
    src = folder(tmp_path)
    (src / "tokenizer.json").unlink()
    refused(src, tmp_path / "m.gguf", "no tokenizer.json")
    (src / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram", "vocab": [["<unk>", 0.0]]}}))
    refused(src, tmp_path / "m.gguf", "Unigram", "WordPiece")


def test_tensor_refusals(tmp_path: Path) -> None:
    c = nomic_config()
    t = nomic_tensors(c)
    t["encoder.layers.1.mlp.fc12.weight"] = np.zeros((64, 64), np.float32)
    refused(write_tiny_nomic(tmp_path / "a", tensors=t), tmp_path / "m.gguf", "'encoder.layers.1.mlp.fc12.weight'",
            "blk.1.ffn_gate.weight", "[64, 64]", "expected [96, 64]")
    t = nomic_tensors(c)
    t["encoder.layers.0.attn.out_proj.bias"] = np.zeros(64, np.float32)
    refused(write_tiny_nomic(tmp_path / "b", tensors=t), tmp_path / "m.gguf", "out_proj.bias", "no biases")
    t = nomic_tensors(c)
    del t["encoder.layers.1.norm1.bias"]
    refused(write_tiny_nomic(tmp_path / "c", tensors=t), tmp_path / "m.gguf", "missing tensor 'encoder.layers.1.norm1.bias'")
    t = nomic_tensors(c)
    t["encoder.layers.0.attn.dense.weight"] = np.zeros((64, 64), np.float32)
    refused(write_tiny_nomic(tmp_path / "d", tensors=t), tmp_path / "m.gguf", "attn.dense.weight", "nomic-bert")
