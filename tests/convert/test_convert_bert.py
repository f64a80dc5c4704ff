"""`convert_hf` on tiny random-weight BERT folders: llama.cpp loads what we write and computes
the embeddings of a NumPy BERT forward over the safetensors (F32, F16, Q8_0, mean and CLS
pooling, a classifier); the keys, tensor names, shapes and types are those llama.cpp's
converter writes.

llama.cpp's convert_hf_to_gguf.py cannot run here (it imports torch and transformers), so the
expected keys and tensors below are spelled out from reading its conversion/bert.py and
base.py (TextModel.set_gguf_parameters, prepare_tensors' type rules, get_vocab_base) and from
the gguf-py it calls: gguf-py's tensor map and SpecialVocab are the checks' second source.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from bert_reference import BertReference, cosine
from gguf import GGUFReader
from llama_bert import LlamaBert
from tiny_bert import (
    PIECES,
    SENTENCES,
    SPECIALS,
    VOCAB,
    WORDS,
    bert_config,
    bert_tensors,
    classifier_folder,
    write_tiny_bert,
)

from edge_infer.convert import convert_hf
from edge_infer.convert.bert_map import gguf_name

# what llama.cpp's converter writes for the tiny folder, in its order (general.* by gguf-py's
# Metadata heuristics on the folder's name "tiny-bert")
EXPECTED_KEYS = [
    "general.architecture", "general.type", "general.name", "general.size_label",
    "bert.block_count", "bert.context_length", "bert.embedding_length", "bert.feed_forward_length",
    "bert.attention.head_count", "bert.attention.layer_norm_epsilon", "general.file_type",
    "bert.attention.causal", "bert.pooling_type", "general.quantization_version",
    "tokenizer.ggml.token_type_count", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.mask_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_sep_token", "tokenizer.ggml.normalizer.lowercase",
]
EXPECTED_VALUES = {
    "general.architecture": "bert", "general.type": "model", "general.name": "Tiny Bert", "bert.block_count": 2,
    "bert.context_length": 64, "bert.embedding_length": 64, "bert.feed_forward_length": 128,
    "bert.attention.head_count": 4, "bert.attention.causal": False, "bert.pooling_type": 1,
    "general.quantization_version": 2, "tokenizer.ggml.token_type_count": 2, "tokenizer.ggml.model": "bert",
    "tokenizer.ggml.pre": "default", "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 3,
    "tokenizer.ggml.unknown_token_id": 1, "tokenizer.ggml.seperator_token_id": 3,
    "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.mask_token_id": 4, "tokenizer.ggml.add_bos_token": True,
    "tokenizer.ggml.add_eos_token": True, "tokenizer.ggml.add_sep_token": False,
    "tokenizer.ggml.normalizer.lowercase": True,
}
# the safetensors' names sorted (llama.cpp's order), mapped; position_ids and the pooler dropped
LAYER_ORDER = ["attn_output_norm.bias", "attn_output_norm.weight", "attn_output.bias", "attn_output.weight",
               "attn_k.bias", "attn_k.weight", "attn_q.bias", "attn_q.weight", "attn_v.bias", "attn_v.weight",
               "ffn_up.bias", "ffn_up.weight", "layer_output_norm.bias", "layer_output_norm.weight",
               "ffn_down.bias", "ffn_down.weight"]
EXPECTED_TENSORS = ["token_embd_norm.bias", "token_embd_norm.weight", "position_embd.weight", "token_types.weight",
                    "token_embd.weight"] + [f"blk.{i}.{n}" for i in range(2) for n in LAYER_ORDER]
# ggml shapes (ne0 first) of the tiny model
SHAPES = {"token_embd.weight": [64, len(VOCAB)], "position_embd.weight": [64, 64], "token_types.weight": [64, 2],
          "ffn_up.weight": [64, 128], "ffn_up.bias": [128], "ffn_down.weight": [128, 64]}
MATRICES = ("token_embd.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
            "ffn_up.weight", "ffn_down.weight")


def fields(path: Path) -> dict[str, object]:
    r = GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("hf") / "tiny-bert")


@pytest.fixture(scope="module")
def converted(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf")
    return {t: convert_hf(tiny, out / f"tiny-{t}.gguf", t) for t in ("f32", "f16", "q8_0")}


def test_keys_and_values_are_llama_cpp_s(converted: dict[str, Path]) -> None:
    for t, ftype in (("f32", 0), ("f16", 1), ("q8_0", 7)):
        f = fields(converted[t])
        assert list(f) == EXPECTED_KEYS
        assert {k: f[k] for k in EXPECTED_VALUES} == EXPECTED_VALUES
        assert f["general.file_type"] == ftype
        assert f["bert.attention.layer_norm_epsilon"] == pytest.approx(1e-12)
    f = fields(converted["f16"])
    phantom = SPECIALS + ["\u2581" + w for w in WORDS] + [p[2:] for p in PIECES]
    assert f["tokenizer.ggml.tokens"] == phantom
    assert f["tokenizer.ggml.token_type"] == [3] * len(SPECIALS) + [1] * (len(VOCAB) - len(SPECIALS))


def test_tensor_names_shapes_and_types(converted: dict[str, Path]) -> None:
    for t, matrix_type in (("f32", "F32"), ("f16", "F16"), ("q8_0", "Q8_0")):
        tensors = GGUFReader(str(converted[t])).tensors
        assert [x.name for x in tensors] == EXPECTED_TENSORS
        for x in tensors:
            short = x.name.split(".", 2)[-1] if x.name.startswith("blk.") else x.name
            want = SHAPES.get(short, [64, 64] if short.endswith("weight") and short in MATRICES else [64])
            assert [int(n) for n in x.shape] == want, x.name
            assert x.tensor_type.name == (matrix_type if short in MATRICES else "F32"), x.name


def test_q8_0_bytes_are_gguf_py_s(tiny: Path, converted: dict[str, Path]) -> None:
    """llama.cpp's converter quantizes with gguf-py: our quantizer gives its bytes."""
    from safetensors.numpy import load_file

    w = load_file(str(tiny / "model.safetensors"))
    tensors = {x.name: x for x in GGUFReader(str(converted["q8_0"])).tensors}
    for hf in ("embeddings.word_embeddings.weight", "encoder.layer.1.output.dense.weight"):
        want = gguf.quants.quantize(w[hf], gguf.GGMLQuantizationType.Q8_0)
        got = np.asarray(tensors[str(gguf_name(hf, False))].data)
        assert np.array_equal(got.reshape(want.shape), want)


def test_tensor_map_is_gguf_py_s(tiny: Path) -> None:
    """Every name we map is what gguf-py's BERT tensor map (the converter's) gives it."""
    from safetensors import safe_open

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, 2)
    with safe_open(str(tiny / "model.safetensors"), framework="numpy") as f:
        names = list(f.keys())
    for hf in names:
        ours = gguf_name(hf, False)
        if ours is not None:
            assert ours == tmap.get_name(hf, try_suffixes=(".weight", ".bias")), hf
    assert gguf_name("bert.encoder.layer.1.attention.output.LayerNorm.gamma", False) == "blk.1.attn_output_norm.weight"
    assert gguf_name("cls.predictions.transform.dense.weight", False) is None
    assert gguf_name("classifier.weight", True) == "cls.output.weight"


def test_special_tokens_agree_with_gguf_py(tiny: Path, converted: dict[str, Path]) -> None:
    """gguf-py's SpecialVocab (the released one: it lacks the normalizer flags llama.cpp's copy
    adds) finds the same ids and add-flags."""
    sv = gguf.SpecialVocab(tiny, n_vocab=len(VOCAB))
    f = fields(converted["f16"])
    key = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
           "pad": "padding_token_id", "mask": "mask_token_id"}
    assert {k: v for k, v in sv.special_token_ids.items() if k in key} == {
        k: f[f"tokenizer.ggml.{key[k]}"] for k in key}
    assert sv.add_special_token == {k: f[f"tokenizer.ggml.add_{k}_token"] for k in ("bos", "eos", "sep")}


@pytest.mark.parametrize("out_type, tol", [("f32", 1e-6), ("f16", 1e-5), ("q8_0", 1e-3)])
def test_llama_cpp_embeds_as_the_reference(tiny: Path, converted: dict[str, Path], out_type: str, tol: float) -> None:
    """llama.cpp's tokens are the tokenizer's, its mean-pooled embeddings the reference's."""
    from tokenizers import Tokenizer

    llm = LlamaBert(converted[out_type], n_ctx=64)
    try:  # llama.cpp first, the reference after: their thread pools spin-wait on each other's cores
        got = {s: (llm.tokens(s), llm.embed(s)) for s in SENTENCES}
    finally:
        llm.close()
    ref, tok = BertReference(tiny), Tokenizer.from_file(str(tiny / "tokenizer.json"))
    for s, (tokens, emb) in got.items():
        ids = tok.encode(s).ids
        assert tokens == ids, s
        assert 1 - cosine(emb, ref.embed(ids)) < tol, (out_type, s)


def test_cls_pooling(tmp_path: Path) -> None:
    folder = write_tiny_bert(tmp_path / "cls-bert", pooling="cls", seed=3)
    out = convert_hf(folder, tmp_path / "cls.gguf", "f32")
    assert fields(out)["bert.pooling_type"] == 2
    from tokenizers import Tokenizer

    llm = LlamaBert(out, 64)
    try:
        got = {s: llm.embed(s) for s in SENTENCES[:3]}
    finally:
        llm.close()
    ref, tok = BertReference(folder), Tokenizer.from_file(str(folder / "tokenizer.json"))
    for s, emb in got.items():
        assert 1 - cosine(emb, ref.embed(tok.encode(s).ids, pooling="cls")) < 1e-6


def test_classifier_becomes_cls_output(tmp_path: Path) -> None:
    """BertForSequenceClassification: "bert." prefix and pooler dropped, the classifier written
    as cls.output with its labels; llama.cpp's rank pooling applies it to the [CLS] state."""
    folder = classifier_folder(tmp_path / "clf", {"0": "negative", "1": "positive"})
    out = convert_hf(folder, tmp_path / "clf.gguf", "f32")
    f = fields(out)
    assert f["bert.classifier.output_labels"] == ["negative", "positive"] and "bert.pooling_type" not in f
    names = [x.name for x in GGUFReader(str(out)).tensors]
    assert names[-2:] == ["cls.output.bias", "cls.output.weight"] and names[:-2] == EXPECTED_TENSORS
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    llm = LlamaBert(out, 64, pooling=4)  # LLAMA_POOLING_TYPE_RANK
    try:
        got = {s: llm.scores(s, 2) for s in SENTENCES[:2]}
    finally:
        llm.close()
    w = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
    ref, tok = BertReference(folder), Tokenizer.from_file(str(folder / "tokenizer.json"))
    for s, scores in got.items():
        want = ref.hidden(tok.encode(s).ids)[0] @ w["classifier.weight"].T + w["classifier.bias"]
        np.testing.assert_allclose(scores, want, rtol=1e-3, atol=1e-3)


def test_masked_lm_heads_are_dropped(tmp_path: Path) -> None:
    c = bert_config(architectures=["BertForMaskedLM"])
    t = bert_tensors(c, prefix="bert.")
    t["cls.predictions.bias"] = np.zeros(len(VOCAB), np.float32)
    t["cls.predictions.transform.dense.weight"] = np.zeros((64, 64), np.float32)
    out = convert_hf(write_tiny_bert(tmp_path / "mlm", config=c, tensors=t), tmp_path / "mlm.gguf", "f16")
    assert [x.name for x in GGUFReader(str(out)).tensors] == EXPECTED_TENSORS


def test_vocab_txt_without_tokenizer_json(tmp_path: Path, converted: dict[str, Path]) -> None:
    """The same tokens from vocab.txt; special ids only from config.json, as gguf-py finds them."""
    folder = write_tiny_bert(tmp_path / "tiny-bert", tokenizer=False)
    f = fields(convert_hf(folder, tmp_path / "v.gguf", "f16"))
    g = fields(converted["f16"])
    assert f["tokenizer.ggml.tokens"] == g["tokenizer.ggml.tokens"]
    assert f["tokenizer.ggml.token_type"] == g["tokenizer.ggml.token_type"]
    assert f["tokenizer.ggml.pre"] == g["tokenizer.ggml.pre"]
    assert gguf.SpecialVocab(folder, n_vocab=len(VOCAB)).special_token_ids == {"pad": 0}
    assert [k for k in f if k.startswith("tokenizer.ggml.") and k.endswith("_id")] == ["tokenizer.ggml.padding_token_id"]


def test_same_folder_same_bytes(tiny: Path, converted: dict[str, Path], tmp_path: Path) -> None:
    again = convert_hf(tiny, tmp_path / "again.gguf", "q8_0")
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (again, converted["q8_0"])]
    assert digest[0] == digest[1]


def test_real_labels_and_config_defaults(tmp_path: Path) -> None:
    """Omitted config fields take BertConfig's defaults (as AutoConfig gives them to llama.cpp's
    converter); a BertModel config naming real labels gets them written."""
    c = bert_config(id2label={"0": "x"})
    del c["type_vocab_size"], c["layer_norm_eps"]
    folder = write_tiny_bert(tmp_path / "d", config=c, tensors=bert_tensors({**c, "type_vocab_size": 2}))
    f = fields(convert_hf(folder, tmp_path / "d.gguf", "f32"))
    assert f["tokenizer.ggml.token_type_count"] == 2 and f["bert.classifier.output_labels"] == ["x"]
    assert f["bert.attention.layer_norm_epsilon"] == pytest.approx(1e-12)
    json.loads((folder / "config.json").read_text())  # still the file we wrote
