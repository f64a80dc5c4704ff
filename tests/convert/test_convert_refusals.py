"""What `convert_hf` refuses: each a one-line EdgeInferError naming the file, field or tensor at
fault, raised before anything is written, and never a file (or a temporary one) left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from convert_checks import refused
from tiny_bert import bert_config, bert_tensors, classifier_folder, write_tiny_bert

from edge_infer.errors import InvalidRequest


def folder(tmp_path: Path, **kw: Any) -> Path:
    return write_tiny_bert(tmp_path / "hf", **kw)


def test_not_a_model_folder(tmp_path: Path) -> None:
    out = tmp_path / "out" / "m.gguf"
    out.parent.mkdir()
    refused(tmp_path / "nope", out, "nope", "no such folder")
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", out, "empty", "no config.json")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    refused(tmp_path / "bad", out, "config.json", "cannot read it as JSON")


def test_unsupported_architecture_names_the_supported(tmp_path: Path) -> None:
    src = folder(tmp_path, config=bert_config(architectures=["GPT2LMHeadModel"]))
    refused(src, tmp_path / "m.gguf", "'GPT2LMHeadModel'", "BertModel", "BertForSequenceClassification")
    (src / "config.json").write_text(json.dumps({"hidden_size": 64}))
    refused(src, tmp_path / "m.gguf", "architecture None")


def test_bad_config_values(tmp_path: Path) -> None:
    src = folder(tmp_path, config=bert_config(hidden_act="relu"))
    refused(src, tmp_path / "m.gguf", "hidden_act 'relu'")
    (src / "config.json").write_text(json.dumps(bert_config(hidden_size="64")))
    refused(src, tmp_path / "m.gguf", "hidden_size must be a positive integer")
    (src / "config.json").write_text(json.dumps(bert_config(num_attention_heads=5)))
    refused(src, tmp_path / "m.gguf", "not a multiple of num_attention_heads 5")


def test_wrong_shape_names_the_tensor(tmp_path: Path) -> None:
    c = bert_config()
    t = bert_tensors(c)
    t["encoder.layer.1.intermediate.dense.weight"] = np.zeros((96, 64), np.float32)
    refused(folder(tmp_path, tensors=t), tmp_path / "m.gguf", "'encoder.layer.1.intermediate.dense.weight'",
            "blk.1.ffn_up.weight", "[96, 64]", "expected [128, 64]")


def test_missing_and_unexpected_tensors(tmp_path: Path) -> None:
    t = bert_tensors(bert_config())
    del t["encoder.layer.0.output.dense.bias"]
    refused(folder(tmp_path, tensors=t), tmp_path / "m.gguf", "missing tensor 'encoder.layer.0.output.dense.bias'")
    t = bert_tensors(bert_config(num_hidden_layers=3))
    refused(folder(tmp_path, tensors=t), tmp_path / "m.gguf", "'encoder.layer.2.", "beyond the 2 layers")
    t = bert_tensors(bert_config())
    t["encoder.layer.0.attention.self.distance_embedding.weight"] = np.zeros((8, 64), np.float32)
    refused(folder(tmp_path, tensors=t), tmp_path / "m.gguf", "distance_embedding", "not a BERT tensor")


def test_placeholder_labels_classifier(tmp_path: Path) -> None:
    """llama.cpp's converter names it `cls`, a tensor its bert loads only as [hidden, hidden]."""
    src = classifier_folder(tmp_path / "clf", {"0": "LABEL_0", "1": "LABEL_1"})
    refused(src, tmp_path / "m.gguf", "'classifier.bias'", "LABEL_0", "id2label")


def test_no_weights_or_tokenizer(tmp_path: Path) -> None:
    src = folder(tmp_path)
    (src / "tokenizer.json").unlink()
    (src / "vocab.txt").unlink()
    refused(src, tmp_path / "m.gguf", "no tokenizer.json or vocab.txt")
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    refused(src, tmp_path / "m.gguf", "no model.safetensors", "pytorch_model.bin")
    (src / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    refused(src, tmp_path / "m.gguf", "model.safetensors", "not a readable safetensors file")


def test_unknown_pooling_mode(tmp_path: Path) -> None:
    refused(folder(tmp_path, pooling="max"), tmp_path / "m.gguf", "1_Pooling", "mean, cls and lasttoken")


def test_output_that_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = folder(tmp_path)
    refused(src, tmp_path / "missing" / "m.gguf", "does not exist", kind=InvalidRequest)
    (tmp_path / "file").write_text("x")
    refused(src, tmp_path / "file" / "m.gguf", "does not exist", kind=InvalidRequest)
    refused(src, tmp_path, "is a folder", kind=InvalidRequest)
    refused(src, tmp_path / "m.gguf", "'f8'", "f32, f16, q8_0", kind=InvalidRequest, out_type="f8")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root writes anyway: the folder refuses as it would anyone else
            from edge_infer.convert import writer

            def denied(dest: Path) -> Path:
                raise PermissionError(13, "Permission denied", str(dest))

            monkeypatch.setattr(writer, "temp_beside", denied)
        refused(src, ro / "m.gguf", "cannot write in", "Permission denied", kind=InvalidRequest)
    finally:
        ro.chmod(0o700)


def test_a_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while writing removes the temporary file and keeps what OUT was."""
    import gguf

    src, out = folder(tmp_path), tmp_path / "m.gguf"
    out.write_bytes(b"old")

    def boom(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", boom)
    refused(src, out, "No space left on device", kind=InvalidRequest)
    assert out.read_bytes() == b"old"
