"""Hugging Face folder -> GGUF, writing what llama.cpp's convert_hf_to_gguf.py writes.

Five architectures: `bert` (BertModel, BertForMaskedLM, BertForSequenceClassification, as
sentence-transformers ships them; bert.py over bert_map.py's tensor names), `nomic-bert`
(NomicBertModel: nomic.py), `modern-bert` (ModernBertModel, ModernBertForSequenceClassification:
modernbert.py), `jina-bert-v2` (JinaBertModel: jina.py) and `gemma-embedding` (Gemma3TextModel,
EmbeddingGemma: gemma_embedding.py), each a Converter (model_base.py). Shared pieces: the
folder's config, tensors and pooling (hf_folder), the hyper-parameters every text model and
encoder gets (text_params), the WordPiece or BPE vocabulary (vocab, with llama.cpp's
pre-tokenizer hashes in bpe_pre) or the SentencePiece one (spm_vocab) and its special tokens and
merges (special_vocab), sentence-transformers' Dense modules (st_dense), and the writer that puts
them in one file (writer). This module stays free of numpy and gguf so
that the hub can read CONVERTER_VERSION without paying for them.
"""

from __future__ import annotations

import os
from pathlib import Path

# Bump whenever the bytes convert_hf writes for the same folder would change: the hub names
# the cached converted files with it, so a new converter never reuses an old conversion.
CONVERTER_VERSION = 1

OUT_TYPES = ("f32", "f16", "q8_0")  # llama.cpp's --outtype names we write

__all__ = ["CONVERTER_VERSION", "OUT_TYPES", "convert_hf"]


def convert_hf(src_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], out_type: str = "f16",
               dense_modules: bool = True) -> Path:
    """Convert the Hugging Face folder `src_dir` to the GGUF file `out_path` (written beside it
    under a temporary name and renamed when complete; an existing file is replaced).

    out_type: "f16" (default), "f32" or "q8_0", as llama.cpp's --outtype. dense_modules: include
    sentence-transformers' Dense projections after pooling (EmbeddingGemma's 2_Dense, 3_Dense),
    as llama.cpp's --sentence-transformers-dense-modules. On by default, unlike llama.cpp's
    converter: with them the embeddings are the ones sentence-transformers computes for the
    model; off gives llama.cpp's default file (the pooled hidden states). Other architectures
    have none in llama.cpp and ignore it. Raises ConversionError naming the file or tensor at
    fault, InvalidRequest for a bad out_type or an output that cannot be written. Returns out_path.
    """
    from edge_infer.convert.writer import write_gguf  # numpy, gguf, safetensors: only to convert

    return write_gguf(Path(src_dir), Path(out_path), out_type, dense_modules)
