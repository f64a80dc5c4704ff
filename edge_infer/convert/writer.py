"""Write one GGUF file from a Hugging Face folder, in the order llama.cpp's converter adds things
(so the keys come out in its order too): the tensors, then general.*, the hyper-parameters, the
quantization version, the vocabulary and its special tokens. The architecture's Converter
(chosen by config.json's `architectures[0]`) says what each of those is. Into a temporary file
beside the output, renamed on success."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFType, GGUFWriter, LlamaFileType, Metadata, size_label

from edge_infer.convert.bert import BertConverter
from edge_infer.convert.gemma_embedding import GemmaEmbeddingConverter
from edge_infer.convert.hf_folder import HFFolder, SafetensorParts, read_config
from edge_infer.convert.jina import JinaBertConverter
from edge_infer.convert.model_base import OUT_TYPES, Converter, tensor_type
from edge_infer.convert.modernbert import ModernBertConverter
from edge_infer.convert.nomic import NomicBertConverter
from edge_infer.errors import ConversionError, InvalidRequest
from edge_infer.formats.atomic import commit, temp_beside
from edge_infer.formats.quants import quantize

log = logging.getLogger(__name__)

CONVERTERS: tuple[type[Converter], ...] = (BertConverter, NomicBertConverter, ModernBertConverter, JinaBertConverter,
                                           GemmaEmbeddingConverter)
BY_ARCHITECTURE = {a: c for c in CONVERTERS for a in c.hf_architectures}
SUPPORTED_ARCHITECTURES = tuple(BY_ARCHITECTURE)
FILE_TYPES = {"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16, "q8_0": LlamaFileType.MOSTLY_Q8_0}
GGML_QUANT_VERSION = 2  # gguf.GGML_QUANT_VERSION, which the converter writes


def converter_for(src: Path) -> Converter:
    """The converter of the folder `src`, its config checked; a ConversionError for an
    architecture we do not convert, naming those we do."""
    raw, arch = read_config(src)
    if arch not in BY_ARCHITECTURE:
        raise ConversionError(f"{src / 'config.json'}: architecture {arch!r} is not supported; "
                              f"edge-infer convert supports {', '.join(SUPPORTED_ARCHITECTURES)}")
    return BY_ARCHITECTURE[arch].from_config(src, raw, arch)


def write_gguf(src: Path, out: Path, out_type: str, dense_modules: bool = True) -> Path:
    """See edge_infer.convert.convert_hf."""
    if out_type not in OUT_TYPES:
        raise InvalidRequest(f"output type {out_type!r} is not supported; use one of {', '.join(OUT_TYPES)}")
    conv = converter_for(src.resolve())
    conv.dense_modules = dense_modules
    parts = SafetensorParts(conv.folder.path)
    # everything that can be refused is read before a tensor's data is, or a file is made
    conv.prepare()
    plan = conv.plan(parts)
    if out.is_dir():
        raise InvalidRequest(f"{out}: is a folder; give the path of the .gguf file to write")
    if not out.parent.is_dir():
        raise InvalidRequest(f"{out}: the folder {out.parent} does not exist")
    try:
        tmp = temp_beside(out)
    except OSError as e:
        raise InvalidRequest(f"{out}: cannot write in {out.parent} ({e.strerror or e})") from None
    try:
        w = GGUFWriter(path=None, arch=conv.arch)
        for p in plan:
            _add_tensor(w, p.name, p.read(), p.shape, OUT_TYPES[out_type])
        _add_general(w, conv.folder)
        conv.add_parameters(w, FILE_TYPES[out_type])
        w.add_quantization_version(GGML_QUANT_VERSION)
        conv.add_vocab(w)
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


def _add_tensor(w: GGUFWriter, name: str, data: np.ndarray, shape: tuple[int, ...], out: T) -> None:
    """One tensor in llama.cpp's type for it (tensor_type), quantized as gguf-py would."""
    qtype = tensor_type(name, shape, out)
    if qtype == T.F32:
        data = data.astype(np.float32, copy=False)
    elif qtype == T.F16:
        data = data.astype(np.float16, copy=False)
    else:
        data = quantize(data.astype(np.float32, copy=False), qtype)
    w.add_tensor(name, data, raw_dtype=qtype)


def _add_general(w: GGUFWriter, folder: HFFolder) -> None:
    """general.*: the type, then gguf-py's Metadata heuristics over the folder (its name, the size
    label from the parameter count)."""
    total, shared, expert, n_experts = w.get_total_parameter_count()
    meta = Metadata.load(None, folder.path, None, total)
    if meta.name is None:
        meta.name = folder.path.name
    if meta.size_label is None and total > 0:
        meta.size_label = size_label(total, shared, expert, n_experts)
    w.add_type(GGUFType.MODEL)
    meta.set_gguf_meta_model(w)
