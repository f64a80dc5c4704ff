"""`convert_hf` on tiny EmbeddingGemma folders (Gemma3TextModel, embeddinggemma-300m's layout):
the keys, tensors, types and SentencePiece vocabulary llama.cpp's converter writes, the norms
shifted by 1, sentence-transformers' Dense modules included or not; llama.cpp and edge-infer
load the file and agree (tokens, embeddings); what llama.cpp's gemma-embedding cannot compute
is refused.

The expected keys below were checked against llama.cpp's own convert_hf_to_gguf.py (its
EmbeddingGemma, run out of tree with torch and transformers 4.57.6): our files were the same
bytes at F32, F16 and Q8_0, with and without --sentence-transformers-dense-modules, and for
float16 weights, config defaults, added tokens and a chat template. transformers' Gemma3TextModel
with mean pooling and the Dense projections gave llama.cpp's embeddings of our F32 file at cosine
>= 0.99999998 (0.82 with the sliding window left out). Neither can run here, so the keys are
spelled out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import sentencepiece as spm
from convert_checks import both_engines, cosine, fields, refused, tensors
from gguf import GGUFReader
from tiny_gemma_embedding import (
    BOS,
    DENSE,
    EOS,
    N_VOCAB,
    SENTENCES,
    SPM_SIZE,
    dense_weights,
    gemma_config,
    gemma_tensors,
    modules,
    spm_model,
    write_dense,
    write_tiny_gemma_embedding,
)

from edge_infer.convert import convert_hf
from edge_infer.convert.gemma_embedding import gguf_name

A = "gemma-embedding"
DENSE_KEYS = [f"{A}.dense_2_feat_in", f"{A}.dense_2_feat_out", f"{A}.dense_3_feat_in", f"{A}.dense_3_feat_out"]


def keys(dense: bool) -> list[str]:
    """The keys in llama.cpp's order: TextModel's (Gemma3Model rewrites them in place), the
    soft-capping and sliding window Gemma3Model adds, the Dense features, the pooling."""
    return [
        "general.architecture", "general.type", "general.name", "general.size_label", f"{A}.block_count",
        f"{A}.context_length", f"{A}.embedding_length", f"{A}.feed_forward_length", f"{A}.attention.head_count",
        f"{A}.attention.head_count_kv", f"{A}.rope.freq_base", f"{A}.rope.freq_base_swa",
        f"{A}.attention.layer_norm_rms_epsilon", f"{A}.attention.key_length", f"{A}.attention.value_length",
        "general.file_type", f"{A}.attention.sliding_window", *(DENSE_KEYS if dense else []), f"{A}.pooling_type",
        "general.quantization_version", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
        "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token",
        "tokenizer.ggml.add_space_prefix",
    ]


VALUES: dict[str, Any] = {
    "general.architecture": A, "general.name": "Tiny Embeddinggemma", f"{A}.block_count": 6,
    f"{A}.context_length": 2048, f"{A}.embedding_length": 64, f"{A}.feed_forward_length": 96,
    f"{A}.attention.head_count": 2, f"{A}.attention.head_count_kv": 1, f"{A}.rope.freq_base": 1e6,
    f"{A}.rope.freq_base_swa": 1e4, f"{A}.attention.key_length": 32, f"{A}.attention.value_length": 32,
    f"{A}.attention.sliding_window": 8,  # config.json's, not transformers' halved 5
    f"{A}.pooling_type": 1, "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
    "tokenizer.ggml.bos_token_id": BOS, "tokenizer.ggml.eos_token_id": EOS, "tokenizer.ggml.unknown_token_id": 3,
    "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True,
    "tokenizer.ggml.add_sep_token": False, "tokenizer.ggml.add_space_prefix": False,
}
# each layer's tensors in llama.cpp's order (by Hugging Face name), ggml shapes
LAYER = [("attn_norm.weight", [64]), ("ffn_down.weight", [96, 64]), ("ffn_gate.weight", [64, 96]),
         ("ffn_up.weight", [64, 96]), ("post_attention_norm.weight", [64]), ("post_ffw_norm.weight", [64]),
         ("ffn_norm.weight", [64]), ("attn_k_norm.weight", [32]), ("attn_k.weight", [64, 32]),
         ("attn_output.weight", [64, 64]), ("attn_q_norm.weight", [32]), ("attn_q.weight", [64, 64]),
         ("attn_v.weight", [64, 32])]
MODEL_TENSORS = [("token_embd.weight", [64, N_VOCAB])] + [(f"blk.{i}.{n}", s) for i in range(6) for n, s in LAYER] + [
    ("output_norm.weight", [64])]
DENSE_TENSORS = [("dense_2.weight", [64, DENSE]), ("dense_3.weight", [DENSE, 64])]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gemma_embedding(tmp_path_factory.mktemp("hf") / "tiny-embeddinggemma")


@pytest.fixture(scope="module")
def converted(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf")
    files = {t: convert_hf(tiny, out / f"eg-{t}.gguf", t) for t in ("f32", "f16", "q8_0")}
    files["no-dense"] = convert_hf(tiny, out / "eg-no-dense.gguf", "f16", dense_modules=False)
    return files


def test_keys_and_tensors_are_llama_cpp_s(converted: dict[str, Path]) -> None:
    for t, ftype, matrix, dense in (("f32", 0, "F32", True), ("f16", 1, "F16", True), ("q8_0", 7, "Q8_0", True),
                                    ("no-dense", 1, "F16", False)):
        f = fields(converted[t])
        assert list(f) == keys(dense), t
        assert {k: f[k] for k in VALUES} == VALUES and f["general.file_type"] == ftype
        assert f[f"{A}.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
        if dense:
            assert [f[k] for k in DENSE_KEYS] == [64, DENSE, DENSE, 64]
        got = tensors(converted[t])
        assert [(n, s) for n, _, s in got] == (DENSE_TENSORS if dense else []) + MODEL_TENSORS, t
        for name, qtype, shape in got:
            assert qtype == ("F32" if len(shape) == 1 else matrix), name


def test_vocabulary_is_the_sentencepiece_model_s(converted: dict[str, Path]) -> None:
    """Pieces, scores and types from tokenizer.model; tokenizer_config's added tokens (control
    when special or looking special as <mask> does, else user-defined) at score -1000; the
    embedding table's extra rows as unused [PAD<id>] at -10000."""
    sp = spm.SentencePieceProcessor(model_proto=spm_model())
    f = fields(converted["f16"])
    toks, scores, types = (f[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores", "token_type"))
    assert isinstance(toks, list) and isinstance(scores, list) and isinstance(types, list)
    assert toks[:SPM_SIZE] == [sp.id_to_piece(i) for i in range(SPM_SIZE)]
    assert toks[SPM_SIZE:] == [f"[PAD{i}]" for i in range(SPM_SIZE, N_VOCAB)]
    assert types[:8] == [3, 3, 3, 3, 3, 4, 3, 3] and scores[:8] == [-1000.0] * 8
    assert types[8:264] == [6] * 256 and all(t == 1 for t in types[264:SPM_SIZE])
    assert scores[264:SPM_SIZE] == [sp.get_score(i) for i in range(264, SPM_SIZE)]
    assert types[SPM_SIZE:] == [5] * 4 and scores[SPM_SIZE:] == [-10000.0] * 4


def test_norms_gain_one_and_the_rest_is_copied(tiny: Path, converted: dict[str, Path]) -> None:
    """Gemma3RMSNorm scales by 1 + w: every norm weight is stored shifted, nothing else is."""
    hf = gemma_tensors(gemma_config())
    got = {t.name: np.asarray(t.data) for t in GGUFReader(str(converted["f32"])).tensors}
    for name, w in hf.items():
        ours = got[gguf_name(name) or ""].reshape(w.shape)
        assert np.array_equal(ours, w + np.float32(1) if name.endswith("norm.weight") else w), name
    for prefix, w in zip(("dense_2", "dense_3"), dense_weights(gemma_config()).values()):
        assert np.array_equal(got[f"{prefix}.weight"].reshape(w.shape), w)


def test_tensor_map_is_gguf_py_s() -> None:
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA_EMBEDDING, 6)
    for hf in gemma_tensors(gemma_config()):
        assert gguf_name(hf) == tmap.get_name(hf, try_suffixes=(".weight", ".bias")), hf
        assert gguf_name("model." + hf) == gguf_name(hf)
    assert gguf_name("layers.0.self_attn.rotary_emb.inv_freq") is None


def test_llama_cpp_and_edge_infer_agree(converted: dict[str, Path]) -> None:
    """Same tokens (BOS and EOS around SentencePiece's pieces and bytes); embeddings at cosine
    >= 0.9999, with the Dense projections and without (which give other vectors)."""
    sp = spm.SentencePieceProcessor(model_proto=spm_model())
    theirs, ours = both_engines(converted["f32"], SENTENCES, n_ctx=128)
    plain_theirs, plain_ours = both_engines(converted["no-dense"], SENTENCES, n_ctx=128)
    for s in SENTENCES:
        ids = [BOS, *sp.encode(s), EOS]
        assert theirs[s][0] == ids and ours[s][0] == ids and plain_ours[s][0] == ids, s
        assert cosine(ours[s][1], theirs[s][1]) >= 0.9999, s
        assert cosine(plain_ours[s][1], plain_theirs[s][1]) >= 0.9999, s
        assert cosine(plain_theirs[s][1], theirs[s][1]) < 0.99, s


def test_q8_0_close(converted: dict[str, Path]) -> None:
    theirs, ours = both_engines(converted["q8_0"], SENTENCES[:2], n_ctx=128)
    for s in SENTENCES[:2]:
        assert cosine(ours[s][1], theirs[s][1]) >= 0.999, s


def folder(tmp_path: Path, **over: Any) -> Path:
    return write_tiny_gemma_embedding(tmp_path / "hf", config=gemma_config(**over))


@pytest.mark.parametrize("over, needles", [
    ({"use_bidirectional_attention": False}, ("use_bidirectional_attention is not true",)),
    ({"layer_types": ["full_attention"] * 6}, ("layer_types", "five sliding layers to one full")),
    ({"layer_types": None, "sliding_window_pattern": 2}, ("sliding_window_pattern",)),
    ({"query_pre_attn_scalar": 64}, ("query_pre_attn_scalar 64 is not head_dim 32",)),
    ({"attention_bias": True}, ("attention_bias true",)),
    ({"attn_logit_softcapping": 50.0}, ("attn_logit_softcapping 50.0",)),
    ({"hidden_activation": "silu"}, ("hidden_activation 'silu'", "GELU")),
    ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, ("rope scaling 'linear'",)),
    ({"num_key_value_heads": 3}, ("num_attention_heads 2 is not a multiple of num_key_value_heads 3",)),
    ({"vocab_size": SPM_SIZE - 1}, ("tokenizer.model", f"{SPM_SIZE} pieces", f"vocab_size {SPM_SIZE - 1}")),
])
def test_unsupported_configs(tmp_path: Path, over: dict[str, Any], needles: tuple[str, ...]) -> None:
    refused(folder(tmp_path, **over), tmp_path / "m.gguf", *needles)


def test_missing_sliding_window_and_tokenizer(tmp_path: Path) -> None:
    src = folder(tmp_path)
    c = gemma_config()
    del c["sliding_window"]
    (src / "config.json").write_text(json.dumps(c))
    refused(src, tmp_path / "m.gguf", "config.json", "sliding_window is missing")
    (src / "config.json").write_text(json.dumps(gemma_config()))
    (src / "tokenizer.model").write_bytes(b"not a model")
    refused(src, tmp_path / "m.gguf", "tokenizer.model", "not a readable SentencePiece model")
    (src / "tokenizer.model").unlink()
    refused(src, tmp_path / "m.gguf", "no tokenizer.model")


def test_tensor_refusals(tmp_path: Path) -> None:
    c = gemma_config()
    t = gemma_tensors(c)
    t["layers.2.mlp.up_proj.weight"] = np.zeros((64, 64), np.float32)
    refused(write_tiny_gemma_embedding(tmp_path / "a", tensors=t), tmp_path / "m.gguf",
            "'layers.2.mlp.up_proj.weight'", "blk.2.ffn_up.weight", "[64, 64]", "expected [96, 64]")
    t = gemma_tensors(c)
    t["lm_head.weight"] = t["embed_tokens.weight"]
    refused(write_tiny_gemma_embedding(tmp_path / "b", tensors=t), tmp_path / "m.gguf", "'lm_head.weight'",
            "language-model head")
    t = gemma_tensors(c)
    t["layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    refused(write_tiny_gemma_embedding(tmp_path / "c", tensors=t), tmp_path / "m.gguf", "q_proj.bias", "no biases")
    t = gemma_tensors(c)
    del t["layers.5.self_attn.k_norm.weight"]
    refused(write_tiny_gemma_embedding(tmp_path / "d", tensors=t), tmp_path / "m.gguf",
            "missing tensor 'layers.5.self_attn.k_norm.weight'")


def test_dense_module_refusals(tmp_path: Path) -> None:
    """What llama.cpp's converter would drop or skip silently, leaving other embeddings than
    sentence-transformers computes; dense_modules=False converts such a folder without them."""
    src = folder(tmp_path)
    w2, w3 = dense_weights(gemma_config()).values()
    write_dense(src, "2_Dense", w2, bias=True)
    refused(src, tmp_path / "m.gguf", "2_Dense/config.json", "with a bias")
    assert convert_hf(src, tmp_path / "plain.gguf", dense_modules=False).is_file()
    (tmp_path / "plain.gguf").unlink()
    write_dense(src, "2_Dense", w2, activation_function="torch.nn.modules.activation.Tanh")
    refused(src, tmp_path / "m.gguf", "activation_function 'torch.nn.modules.activation.Tanh'")
    write_dense(src, "2_Dense", w2[:, :32], in_features=32)
    refused(src, tmp_path / "m.gguf", "modules.json", "map 32 -> 128 -> 64", "hidden_size 64")
    write_dense(src, "2_Dense", w2)
    (src / "3_Dense" / "model.safetensors").unlink()
    refused(src, tmp_path / "m.gguf", "3_Dense: no model.safetensors")
    write_dense(src, "3_Dense", w3)
    mods = modules()
    mods[1], mods[2] = mods[2], mods[1]
    (src / "modules.json").write_text(json.dumps(mods))
    refused(src, tmp_path / "m.gguf", "modules.json", "after a Pooling module")
    mods = modules()
    mods[3]["path"] = "5_Dense"
    (src / "modules.json").write_text(json.dumps(mods))
    refused(src, tmp_path / "m.gguf", "Dense modules at ['2_Dense', '5_Dense']", "2_Dense and then 3_Dense")
