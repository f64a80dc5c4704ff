"""`convert_hf` on tiny ModernBERT folders (ModernBERT-base's config keys and tensor names, a
byte-level BPE tokenizer): the keys, tensor names, shapes and types llama.cpp's converter writes;
llama.cpp and edge-infer load the file and agree (tokens, embeddings) with each other and with a
NumPy forward of the safetensors, whose sliding window shows; a sequence classifier's scores;
what llama.cpp's modern-bert cannot compute is refused.

The expected keys were checked against llama.cpp's own convert_hf_to_gguf.py (ModernBertModel,
run out of tree with torch and transformers 4.57.6, its unknown-hash refusal answered with
"modern-bert"): the same bytes at F32, F16 and Q8_0, and for the classifier at F32.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from convert_checks import both_engines, cosine, fields, refused, tensors
from llama_bert import LlamaBert
from tiny_bert import SENTENCES, write_tiny_bert
from tiny_bpe import bpe_tokenizer
from tiny_modernbert import (
    ModernBertReference,
    classifier_folder,
    modernbert_config,
    modernbert_tensors,
    write_tiny_modernbert,
)
from tokenizers import Tokenizer

from edge_infer.convert import bpe_pre, convert_hf
from edge_infer.convert.modernbert import gguf_name

A = "modern-bert."
KEYS = [
    "general.architecture", "general.type", "general.name", "general.size_label", A + "block_count",
    A + "context_length", A + "embedding_length", A + "feed_forward_length", A + "attention.head_count",
    A + "rope.freq_base", A + "rope.freq_base_swa", A + "attention.layer_norm_rms_epsilon",
    A + "attention.layer_norm_epsilon", "general.file_type", A + "attention.causal", A + "pooling_type",
    A + "classifier.pooling_type", A + "attention.sliding_window", A + "attention.sliding_window_pattern",
    A + "rope.scaling.type", A + "vocab_size", A + "hidden_activation", "general.quantization_version",
    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token",
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.mask_token_id",
]
VALUES = {
    "general.architecture": "modern-bert", "general.name": "Tiny Modernbert", A + "block_count": 3,
    A + "context_length": 512, A + "embedding_length": 64, A + "feed_forward_length": 96, A + "attention.head_count": 4,
    A + "rope.freq_base": 160000.0, A + "rope.freq_base_swa": 10000.0, A + "attention.causal": False,
    A + "pooling_type": 1, A + "classifier.pooling_type": 1, A + "attention.sliding_window": 8,
    A + "attention.sliding_window_pattern": 3, A + "rope.scaling.type": "none", A + "vocab_size": 407,
    A + "hidden_activation": "gelu", "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True,
    "tokenizer.ggml.add_sep_token": False, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "modern-bert",
    "tokenizer.ggml.bos_token_id": 401, "tokenizer.ggml.eos_token_id": 402, "tokenizer.ggml.unknown_token_id": 400,
    "tokenizer.ggml.seperator_token_id": 402, "tokenizer.ggml.padding_token_id": 403,
    "tokenizer.ggml.mask_token_id": 404,
}
LAYER = [("attn_output.weight", [64, 64]), ("attn_qkv.weight", [64, 192]), ("attn_norm.weight", [64]),
         ("ffn_up.weight", [64, 192]), ("ffn_down.weight", [96, 64]), ("ffn_norm.weight", [64])]
TENSORS = [("token_embd_norm.weight", [64]), ("token_embd.weight", [64, 407]), ("output_norm.weight", [64])] + [
    (f"blk.{i}.{n}", s) for i in range(3) for n, s in LAYER if (i, n) != (0, "attn_norm.weight")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_modernbert(tmp_path_factory.mktemp("hf") / "tiny-modernbert")


@pytest.fixture(scope="module")
def converted(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf")
    return {t: convert_hf(tiny, out / f"mb-{t}.gguf", t) for t in ("f32", "f16", "q8_0")}


def test_keys_and_tensors_are_llama_cpp_s(tiny: Path, converted: dict[str, Path]) -> None:
    for t, ftype, matrix in (("f32", 0, "F32"), ("f16", 1, "F16"), ("q8_0", 7, "Q8_0")):
        f = fields(converted[t])
        assert list(f) == KEYS and {k: f[k] for k in VALUES} == VALUES and f["general.file_type"] == ftype
        got = tensors(converted[t])
        assert [(n, s) for n, _, s in got] == TENSORS
        for name, qtype, shape in got:
            assert qtype == ("F32" if len(shape) == 1 else matrix), name
    f, tok = fields(converted["f16"]), json.loads((tiny / "tokenizer.json").read_text())
    vocab = {i: t for t, i in tok["model"]["vocab"].items()} | {a["id"]: a["content"] for a in tok["added_tokens"]}
    assert f["tokenizer.ggml.tokens"] == [vocab[i] for i in range(407)]  # byte-level spellings, no phantom space
    assert f["tokenizer.ggml.token_type"] == [1] * 400 + [3] * 5 + [4] * 2  # specials control, [unusedN] user-defined
    assert f["tokenizer.ggml.merges"] == [" ".join(m) for m in tok["model"]["merges"]]


def test_tensor_map_is_gguf_py_s() -> None:
    c = modernbert_config(bpe_tokenizer())
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MODERN_BERT, 3)
    names = list(modernbert_tensors(c, prefix="model.")) + ["head.dense.weight", "head.norm.weight"]
    for hf in names:
        assert gguf_name(hf, False) == tmap.get_name(hf.removeprefix("model."), try_suffixes=(".weight", ".bias")), hf
    assert gguf_name("classifier.bias", True) == "cls.output.bias"


def test_llama_cpp_edge_infer_and_reference_agree(tiny: Path, converted: dict[str, Path]) -> None:
    """Same tokens as the tokenizer ([CLS] ... [SEP]); embeddings at cosine >= 0.9999 of each
    other and of the NumPy forward (about 1 - 3e-8 at F32), which without the window would be off."""
    theirs, ours = both_engines(converted["f32"], SENTENCES)
    ref, tok = ModernBertReference(tiny), Tokenizer.from_file(str(tiny / "tokenizer.json"))
    for s in SENTENCES:
        ids = tok.encode(s).ids
        assert theirs[s][0] == ids and ours[s][0] == ids, s
        assert cosine(ours[s][1], theirs[s][1]) >= 0.9999, s
        assert cosine(theirs[s][1], ref.embed(ids)) >= 0.9999, s
        assert cosine(theirs[s][1], ref.embed(ids, window=False)) < 0.99, s


def test_q8_0_close(converted: dict[str, Path]) -> None:
    theirs, ours = both_engines(converted["q8_0"], SENTENCES[:2])
    for s in SENTENCES[:2]:
        assert cosine(ours[s][1], theirs[s][1]) >= 0.999, s


def test_classifier(tmp_path: Path) -> None:
    """ModernBertForSequenceClassification: "model." dropped, head.dense / head.norm as cls /
    cls.norm, the classifier as cls.output with its labels; llama.cpp's rank pooling gives the
    reference's scores (mean pooling, dense, GELU, norm, classifier)."""
    folder = classifier_folder(tmp_path / "clf", {"0": "negative", "1": "positive"})
    out = convert_hf(folder, tmp_path / "clf.gguf", "f32")
    f = fields(out)
    assert f[A + "classifier.output_labels"] == ["negative", "positive"] and A + "pooling_type" not in f
    assert [n for n, _, _ in tensors(out)][:6] == ["cls.output.bias", "cls.output.weight", "cls.weight",
                                                   "cls.norm.weight", "token_embd_norm.weight", "token_embd.weight"]
    llm = LlamaBert(out, 64, pooling=4)
    try:
        got = {s: llm.scores(s, 2) for s in SENTENCES[:3]}
    finally:
        llm.close()
    ref, tok = ModernBertReference(folder), Tokenizer.from_file(str(folder / "tokenizer.json"))
    for s, scores in got.items():
        np.testing.assert_allclose(scores, ref.scores(tok.encode(s).ids), atol=5e-3)


def test_known_pre_tokenizer_hash_wins(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hash in llama.cpp's table names the pre-tokenizer; only an unknown one gets "modern-bert"."""
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    monkeypatch.setitem(bpe_pre.KNOWN_PRE, bpe_pre.pre_hash(tok), "gpt-2")
    assert fields(convert_hf(tiny, tmp_path / "m.gguf", "f32"))["tokenizer.ggml.pre"] == "gpt-2"


def folder(tmp_path: Path, **over: object) -> Path:
    return write_tiny_modernbert(tmp_path / "hf", config=modernbert_config(bpe_tokenizer(), **over))


@pytest.mark.parametrize("over, needles", [
    ({"norm_bias": True}, ("norm_bias true",)),
    ({"mlp_bias": True}, ("mlp_bias true",)),
    ({"hidden_activation": "tanh"}, ("hidden_activation 'tanh'",)),
    ({"num_attention_heads": 5}, ("hidden_size 64 is not a multiple of num_attention_heads 5",)),
    ({"local_attention": 0}, ("local_attention must be a positive integer",)),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, ("rope scaling 'linear'",)),
    ({"layer_norm_eps": None}, ("no layer_norm_eps",)),
])
def test_unsupported_configs(tmp_path: Path, over: dict[str, object], needles: tuple[str, ...]) -> None:
    src = folder(tmp_path, **over)
    if over.get("layer_norm_eps", 0) is None:
        c = json.loads((src / "config.json").read_text())
        del c["layer_norm_eps"]
        (src / "config.json").write_text(json.dumps(c))
    refused(src, tmp_path / "m.gguf", "config.json", *needles)


def test_classifier_refusals(tmp_path: Path) -> None:
    src = classifier_folder(tmp_path / "a", {"0": "LABEL_0", "1": "LABEL_1"})
    refused(src, tmp_path / "m.gguf", "'classifier.bias'", "LABEL_0", "id2label")
    src = classifier_folder(tmp_path / "b", {"0": "yes"})
    c = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**c, "classifier_activation": "tanh"}))
    refused(src, tmp_path / "m.gguf", "classifier_activation 'tanh'")


def test_tensor_and_tokenizer_refusals(tmp_path: Path) -> None:
    c = modernbert_config(bpe_tokenizer(), architectures=["ModernBertForMaskedLM"])
    t = modernbert_tensors(c, prefix="model.")
    t["decoder.bias"] = np.zeros(c["vocab_size"], np.float32)
    refused(write_tiny_modernbert(tmp_path / "a", config=c, tensors=t), tmp_path / "m.gguf", "'decoder.bias'",
            "masked-LM decoder")
    t = modernbert_tensors(modernbert_config(bpe_tokenizer()))
    t["layers.2.mlp.Wi.weight"] = np.zeros((96, 64), np.float32)
    refused(write_tiny_modernbert(tmp_path / "b", tensors=t), tmp_path / "m.gguf", "'layers.2.mlp.Wi.weight'",
            "blk.2.ffn_up.weight", "[96, 64]", "expected [192, 64]")
    t = modernbert_tensors(modernbert_config(bpe_tokenizer()))
    del t["layers.1.attn_norm.weight"]
    refused(write_tiny_modernbert(tmp_path / "c", tensors=t), tmp_path / "m.gguf",
            "missing tensor 'layers.1.attn_norm.weight'")
    src = write_tiny_bert(tmp_path / "d")  # a WordPiece tokenizer.json beside a ModernBERT config
    (src / "config.json").write_text(json.dumps(modernbert_config(bpe_tokenizer())))
    refused(src, tmp_path / "m.gguf", "a WordPiece tokenizer; modern-bert needs BPE")
