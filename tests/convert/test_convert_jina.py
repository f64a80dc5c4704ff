"""`convert_hf` on tiny JinaBertModel folders (jina-embeddings-v2's config keys and tensor names:
ALiBi, a fused GeGLU MLP) with a WordPiece (BertTokenizer) or a byte-level BPE (RobertaTokenizer)
vocabulary: the keys and tensors llama.cpp's converter writes; llama.cpp and edge-infer load the
file and agree (tokens, embeddings) with each other and with a NumPy forward of the safetensors;
what llama.cpp's converter cannot convert is refused.

Checked against llama.cpp's own convert_hf_to_gguf.py (JinaBertV2Model, run out of tree with
torch and transformers 4.57.6): the same bytes for the WordPiece folder at F32, F16 and Q8_0 and
for the BPE folder at F16 (its pre-tokenizer hash answered with "jina-v2-es" there, as here).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from convert_checks import both_engines, cosine, fields, refused, tensors
from tiny_bert import SENTENCES, VOCAB
from tiny_jina import JinaReference, jina_config, jina_tensors, write_tiny_jina
from tokenizers import Tokenizer

from edge_infer.convert import bpe_pre, convert_hf
from edge_infer.convert.jina import gguf_name

J = "jina-bert-v2."
PARAMS = ["general.architecture", "general.type", "general.name", "general.size_label", J + "block_count",
          J + "context_length", J + "embedding_length", J + "feed_forward_length", J + "attention.head_count",
          J + "attention.layer_norm_epsilon", "general.file_type", J + "attention.causal", J + "pooling_type",
          "general.quantization_version"]
SPECIAL_KEYS = ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.mask_token_id",
                "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token"]
WORDPIECE_KEYS = PARAMS + ["tokenizer.ggml.token_type_count", "tokenizer.ggml.model", "tokenizer.ggml.pre",
                           "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"] + SPECIAL_KEYS + [
                           "tokenizer.ggml.normalizer.lowercase"]
# RobertaTokenizer: the gpt2 vocabulary with merges, then two token types
BPE_KEYS = PARAMS + ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                     "tokenizer.ggml.merges"] + SPECIAL_KEYS + ["tokenizer.ggml.token_type_count"]
VALUES = {"general.architecture": "jina-bert-v2", J + "block_count": 2, J + "context_length": 8192,
          J + "embedding_length": 64, J + "feed_forward_length": 96, J + "attention.head_count": 4,
          J + "attention.causal": False, J + "pooling_type": 1, "tokenizer.ggml.token_type_count": 2}
LAYER = [("attn_output_norm.bias", [64]), ("attn_output_norm.weight", [64]), ("attn_output.bias", [64]),
         ("attn_output.weight", [64, 64]), ("attn_k.bias", [64]), ("attn_k.weight", [64, 64]), ("attn_q.bias", [64]),
         ("attn_q.weight", [64, 64]), ("attn_v.bias", [64]), ("attn_v.weight", [64, 64]), ("ffn_up.weight", [64, 192]),
         ("layer_output_norm.bias", [64]), ("layer_output_norm.weight", [64]), ("ffn_down.bias", [64]),
         ("ffn_down.weight", [96, 64])]
TENSORS = [("token_embd_norm.bias", [64]), ("token_embd_norm.weight", [64]), ("token_types.weight", [64, 2]),
           ("token_embd.weight", [64, len(VOCAB)])] + [(f"blk.{i}.{n}", s) for i in range(2) for n, s in LAYER]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_jina(tmp_path_factory.mktemp("hf") / "tiny-jina")


@pytest.fixture(scope="module")
def converted(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf")
    return {t: convert_hf(tiny, out / f"jina-{t}.gguf", t) for t in ("f32", "q8_0")}


def test_keys_and_tensors_are_llama_cpp_s(converted: dict[str, Path]) -> None:
    for t, matrix in (("f32", "F32"), ("q8_0", "Q8_0")):
        f = fields(converted[t])
        assert list(f) == WORDPIECE_KEYS and {k: f[k] for k in VALUES} == VALUES
        assert f["tokenizer.ggml.model"] == "bert" and f["tokenizer.ggml.pre"] == "default"
        got = tensors(converted[t])
        assert [(n, s) for n, _, s in got] == TENSORS  # the pooler dropped
        for name, qtype, shape in got:
            assert qtype == ("F32" if len(shape) == 1 or name == "token_types.weight" else matrix), name


def test_tensor_map_is_gguf_py_s() -> None:
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.JINA_BERT_V2, 2)
    for hf in jina_tensors(jina_config()):
        if not hf.startswith("pooler."):
            assert gguf_name(hf) == tmap.get_name(hf, try_suffixes=(".weight", ".bias")), hf
    for hf in ("encoder.layer.0.attention.self.layer_norm_q.weight", "encoder.layer.1.layer_norm_1.bias",
               "encoder.layer.0.mlp.up_gated_layer.weight", "encoder.layer.0.mlp.down_layer.weight",
               "encoder.layer.0.mlp.gated_layers_w.weight", "encoder.layer.0.layer_norm_2.weight", "classifier.weight"):
        assert gguf_name(hf) == tmap.get_name(hf, try_suffixes=(".weight", ".bias")), hf
    assert gguf_name("pooler.dense.weight") is None
    assert gguf_name("bert.embeddings.LayerNorm.gamma") == "token_embd_norm.weight"


def test_llama_cpp_edge_infer_and_reference_agree(tiny: Path, converted: dict[str, Path]) -> None:
    """Same tokens as the tokenizer; embeddings at cosine >= 0.9999 of each other and of the
    NumPy forward (about 1 - 1e-7 at F32), which without ALiBi would be visibly off."""
    theirs, ours = both_engines(converted["f32"], SENTENCES)
    ref, tok = JinaReference(tiny), Tokenizer.from_file(str(tiny / "tokenizer.json"))
    for s in SENTENCES:
        ids = tok.encode(s).ids
        assert theirs[s][0] == ids and ours[s][0] == ids, s
        assert cosine(ours[s][1], theirs[s][1]) >= 0.9999, s
        assert cosine(theirs[s][1], ref.embed(ids)) >= 0.9999, s
        assert cosine(theirs[s][1], ref.embed(ids, alibi=False)) < 0.999, s


def test_bpe_vocabulary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RobertaTokenizer: gpt2 tokens with merges, two token types after them; with a hash llama.cpp
    knows (jina-v2-es's, patched in for the tiny tokenizer) the files agree as for WordPiece."""
    src = write_tiny_jina(tmp_path / "tiny-jina-bpe", bpe=True)
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    (tmp_path / "out").mkdir()
    refused(src, tmp_path / "out" / "m.gguf", "pre-tokenizer", "not one llama.cpp knows")
    monkeypatch.setitem(bpe_pre.KNOWN_PRE, bpe_pre.pre_hash(tok), "jina-v2-es")
    out = convert_hf(src, tmp_path / "bpe.gguf", "f16")
    f = fields(out)
    assert list(f) == BPE_KEYS and f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "jina-v2-es"
    assert f["tokenizer.ggml.add_sep_token"] is True and f["tokenizer.ggml.token_type"][:5] == [3] * 5  # type: ignore[index]
    theirs, ours = both_engines(out, SENTENCES)
    ref = JinaReference(src)
    for s in SENTENCES:
        ids = tok.encode(s).ids
        assert theirs[s][0] == ids and ours[s][0] == ids, s
        assert cosine(ours[s][1], theirs[s][1]) >= 0.9999, s
        assert cosine(theirs[s][1], ref.embed(ids)) >= 0.9999, s


def test_refusals(tmp_path: Path) -> None:
    refused(write_tiny_jina(tmp_path / "a", config=jina_config(position_embedding_type="absolute")), tmp_path / "m.gguf",
            "position_embedding_type 'absolute'", "alibi")
    src = write_tiny_jina(tmp_path / "b")
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
    refused(src, tmp_path / "m.gguf", "tokenizer_class 'XLMRobertaTokenizer'")
    (src / "tokenizer_config.json").unlink()
    refused(src, tmp_path / "m.gguf", "tokenizer_class None")
    refused(write_tiny_jina(tmp_path / "c", config=jina_config(id2label={"0": "relevant"})), tmp_path / "m.gguf",
            "classifier labels", "no classifier output")
    t = jina_tensors(jina_config())
    t["encoder.layer.1.mlp.gated_layers.weight"] = np.zeros((96, 64), np.float32)  # neither fused nor with a gate
    refused(write_tiny_jina(tmp_path / "d", tensors=t), tmp_path / "m.gguf", "'encoder.layer.1.mlp.gated_layers.weight'",
            "[96, 64]", "expected [192, 64]")
    t = jina_tensors(jina_config())
    t["embeddings.position_embeddings.weight"] = np.zeros((8, 64), np.float32)
    refused(write_tiny_jina(tmp_path / "e", tensors=t), tmp_path / "m.gguf", "position_embeddings", "jina-bert-v2")
    t = jina_tensors(jina_config())
    del t["encoder.layer.0.attention.output.dense.bias"]
    refused(write_tiny_jina(tmp_path / "f", tensors=t), tmp_path / "m.gguf",
            "missing tensor 'encoder.layer.0.attention.output.dense.bias'")
