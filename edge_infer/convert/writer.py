"""Write one GGUF file from a BERT folder, in the order llama.cpp's converter adds things (so the
keys come out in its order too): the tensors, then general.*, the hyper-parameters, the
vocabulary and its special tokens. Into a temporary file beside the output, renamed on success."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFType, GGUFWriter, LlamaFileType, Metadata, PoolingType, size_label

from edge_infer.convert import bert_map
from edge_infer.convert.hf_folder import (
    HFFolder,
    SafetensorParts,
    classifier_labels,
    classifier_pooling,
    pooling_type,
    read_folder,
)
from edge_infer.convert.special_vocab import Specials, read_specials
from edge_infer.convert.vocab import Vocab, read_vocab
from edge_infer.errors import InvalidRequest
from edge_infer.formats.atomic import commit, temp_beside
from edge_infer.formats.quants import quantize

log = logging.getLogger(__name__)

ARCH = "bert"
FILE_TYPES = {"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16, "q8_0": LlamaFileType.MOSTLY_Q8_0}
GGML_QUANT_VERSION = 2  # gguf.GGML_QUANT_VERSION, which the converter writes


def write_gguf(src: Path, out: Path, out_type: str) -> Path:
    """See edge_infer.convert.convert_hf."""
    if out_type not in bert_map.OUT_TYPES:
        raise InvalidRequest(f"output type {out_type!r} is not supported; use one of {', '.join(bert_map.OUT_TYPES)}")
    folder = read_folder(src.resolve())
    labels = classifier_labels(folder)
    parts = SafetensorParts(folder.path)
    # everything that can be refused is read before a tensor's data is, or a file is made
    vocab = read_vocab(folder.path, folder.int("vocab_size"))
    specials = read_specials(folder.path, len(vocab.tokens))
    pooling = pooling_type(folder), classifier_pooling(folder)
    if out.is_dir():
        raise InvalidRequest(f"{out}: is a folder; give the path of the .gguf file to write")
    if not out.parent.is_dir():
        raise InvalidRequest(f"{out}: the folder {out.parent} does not exist")
    try:
        tmp = temp_beside(out)
    except OSError as e:
        raise InvalidRequest(f"{out}: cannot write in {out.parent} ({e.strerror or e})") from None
    try:
        w = GGUFWriter(path=None, arch=ARCH)
        _add_tensors(w, folder, parts, labels, bert_map.OUT_TYPES[out_type])
        _add_metadata(w, folder, labels, FILE_TYPES[out_type], pooling)
        _add_vocab(w, folder, vocab, specials)
        w.write_header_to_file(path=tmp)
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        commit(tmp, out)
    except OSError as e:
        raise InvalidRequest(f"{out}: writing failed ({e.strerror or e})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _dims(folder: HFFolder, labels: list[str] | None) -> bert_map.BertDims:
    return bert_map.BertDims(
        vocab=folder.int("vocab_size"), hidden=folder.int("hidden_size"), layers=folder.int("num_hidden_layers"),
        ffn=folder.int("intermediate_size"), positions=folder.int("max_position_embeddings"),
        token_types=folder.int("type_vocab_size"), labels=len(labels or ()))


def _add_tensors(w: GGUFWriter, folder: HFFolder, parts: SafetensorParts, labels: list[str] | None, out: T) -> None:
    """Every kept tensor, checked first (names and shapes from the headers, before any data is
    read), then read, typed and added in the safetensors order."""
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for hf in parts.names():
        name = bert_map.gguf_name(hf, labels is not None)
        if name is not None:
            found[name] = (hf, parts.shape(hf))
    bert_map.check_tensors(found, _dims(folder, labels))
    for name, (hf, shape) in found.items():
        data = parts.get(hf)
        qtype = bert_map.tensor_type(name, shape, out)
        if qtype == T.F32:
            data = data.astype(np.float32, copy=False)
        elif qtype == T.F16:
            data = data.astype(np.float16, copy=False)
        else:
            data = quantize(data.astype(np.float32, copy=False), qtype)
        w.add_tensor(name, data, raw_dtype=qtype)


def _add_metadata(w: GGUFWriter, folder: HFFolder, labels: list[str] | None, ftype: LlamaFileType,
                  pooling: tuple[PoolingType | None, PoolingType | None]) -> None:
    """general.* and the hyper-parameters, each as the converter adds it."""
    c = folder.config
    total, shared, expert, n_experts = w.get_total_parameter_count()
    meta = Metadata.load(None, folder.path, None, total)
    if meta.name is None:
        meta.name = folder.path.name
    if meta.size_label is None and total > 0:
        meta.size_label = size_label(total, shared, expert, n_experts)
    w.add_type(GGUFType.MODEL)
    meta.set_gguf_meta_model(w)
    # TextModel.set_gguf_parameters, for the keys a BERT config can have
    w.add_block_count(folder.int("num_hidden_layers"))
    w.add_context_length(folder.int("max_position_embeddings"))
    w.add_embedding_length(folder.int("hidden_size"))
    w.add_feed_forward_length(folder.int("intermediate_size"))
    w.add_head_count(folder.int("num_attention_heads"))
    if (n_kv := c.get("num_key_value_heads", c.get("n_kv_heads"))) is not None:
        w.add_head_count_kv(n_kv)
    w.add_layer_norm_eps(c["layer_norm_eps"])
    if (head_dim := c.get("head_dim")) is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(ftype)
    # BertModel.set_gguf_parameters
    w.add_causal_attention(False)
    if pooling[0] is not None:
        w.add_pooling_type(pooling[0])
    if pooling[1] is not None:
        w.add_uint32(f"{ARCH}.classifier.pooling_type", pooling[1].value)
    if labels:
        w.add_classifier_output_labels(labels)
    w.add_quantization_version(GGML_QUANT_VERSION)


def _add_vocab(w: GGUFWriter, folder: HFFolder, vocab: Vocab, specials: Specials) -> None:
    """BertModel.set_vocab: token types, the WordPiece vocabulary, the special tokens."""
    w.add_token_type_count(folder.int("type_vocab_size"))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    specials.write(w)
