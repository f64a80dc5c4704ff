"""A Hugging Face model folder as the converter reads it: config.json and its checks,
sentence-transformers' pooling (modules.json + its Pooling module's config), the classifier's
labels, and the safetensors tensors in llama.cpp's order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import PoolingType

from edge_infer.convert.special_vocab import read_json
from edge_infer.errors import ConversionError

FLOAT_DTYPES = ("F32", "F16", "F64")  # what safetensors.numpy reads as floats (BF16 it cannot)
POOLING_MODES = {"mean": PoolingType.MEAN, "cls": PoolingType.CLS, "lasttoken": PoolingType.LAST}


@dataclass(frozen=True, slots=True)
class HFFolder:
    """A folder and its config.json (with the defaults transformers' AutoConfig fills in, where
    llama.cpp's converter gets them from it), checked by its architecture's module."""

    path: Path
    config: dict[str, Any]
    architecture: str

    def int(self, key: str) -> int:
        """A size from the config (its architecture's check made it a positive integer)."""
        return int(self.config[key])

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"


def read_config(src: Path) -> tuple[dict[str, Any], str | None]:
    """The folder's config.json as it is, and its `architectures[0]` (None without one)."""
    if not src.is_dir():
        raise ConversionError(f"{src}: {'is not a folder' if src.exists() else 'no such folder'} "
                              "(give a Hugging Face model folder with config.json and model.safetensors)")
    if not (src / "config.json").is_file():
        raise ConversionError(f"{src}: no config.json; this is not a Hugging Face model folder")
    raw = read_json(src / "config.json")
    if not isinstance(raw, dict):
        raise ConversionError(f"{src / 'config.json'}: expected a JSON object")
    arches = raw.get("architectures")
    arch = arches[0] if isinstance(arches, list) and arches and isinstance(arches[0], str) else None
    return raw, arch


def check_sizes(path: Path, config: dict[str, Any], keys: tuple[str, ...]) -> None:
    """Each of `keys` is a positive integer in config (a ConversionError naming the first not)."""
    for key in keys:
        v = config.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConversionError(f"{path}: {key} must be a positive integer, got {v!r}")


def check_number(path: Path, config: dict[str, Any], key: str) -> None:
    v = config.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ConversionError(f"{path}: {key} must be a number, got {v!r}")


def check_heads(path: Path, width: int, heads: int, width_key: str, heads_key: str) -> None:
    if width % heads:
        raise ConversionError(f"{path}: {width_key} {width} is not a multiple of {heads_key} {heads}")


def classifier_labels(folder: HFFolder) -> list[str] | None:
    """The classifier's labels in id order, or None for AutoConfig's two placeholder labels
    (LABEL_0, LABEL_1), which llama.cpp's converter drops."""
    c = folder.config
    id2label = c.get("id2label")
    if id2label is None:
        n = c.get("num_labels", 2)
        id2label = {i: f"LABEL_{i}" for i in range(n)} if isinstance(n, int) and n > 0 else {}
    if not isinstance(id2label, dict):
        raise ConversionError(f"{folder.path / 'config.json'}: id2label must be an object")
    try:
        labels = {int(k): str(v) for k, v in id2label.items()}
    except ValueError:
        raise ConversionError(f"{folder.path / 'config.json'}: id2label keys must be integers") from None
    if not labels or (len(labels) == 2 and labels.get(0) == "LABEL_0"):
        return None
    return [v for _, v in sorted(labels.items())]


def pooling_type(folder: HFFolder) -> PoolingType | None:
    """sentence-transformers' pooling (modules.json's Pooling module), or None without one."""
    modules_path = folder.path / "modules.json"
    if not modules_path.is_file():
        return None
    modules = read_json(modules_path)
    modules = modules if isinstance(modules, list) else []
    pooling_dir = next((m.get("path") for m in modules
                        if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling")), None)
    if pooling_dir is None:
        return None
    conf_path = folder.path / str(pooling_dir) / "config.json"
    if not conf_path.is_file():
        raise ConversionError(f"{modules_path}: its Pooling module has no {conf_path}")
    p = read_json(conf_path)
    p = p if isinstance(p, dict) else {}
    if p.get("pooling_mode_mean_tokens"):
        return PoolingType.MEAN
    if p.get("pooling_mode_cls_token"):
        return PoolingType.CLS
    if p.get("pooling_mode_lasttoken"):
        return PoolingType.LAST
    if (mode := p.get("pooling_mode")) in POOLING_MODES:
        return POOLING_MODES[mode]
    raise ConversionError(f"{conf_path}: only mean, cls and lasttoken pooling are supported (llama.cpp's)")


def classifier_pooling(folder: HFFolder) -> PoolingType | None:
    """config.json's classifier_pooling (the pooling before a classification head), if any."""
    if (mode := folder.config.get("classifier_pooling")) is None:
        return None
    if mode not in ("cls", "mean"):
        raise ConversionError(f"{folder.path / 'config.json'}: classifier_pooling {mode!r} is not supported (cls, mean)")
    return POOLING_MODES[mode]


class SafetensorParts:
    """The folder's model*.safetensors files, opened: names in llama.cpp's order (parts by file
    name, tensors by name within each), shapes without reading data, arrays on demand."""

    def __init__(self, src: Path) -> None:
        from safetensors import SafetensorError, safe_open

        files = sorted(p for p in src.iterdir() if p.name.startswith("model") and p.name.endswith(".safetensors"))
        if not files:
            torch_only = any(src.glob("pytorch_model*.bin"))
            raise ConversionError(f"{src}: no model.safetensors" + (
                " (only pytorch_model.bin, which needs torch to read: save the model as safetensors)" if torch_only else ""))
        self.files = files
        self._where: dict[str, Any] = {}
        for f in files:
            try:
                h = safe_open(str(f), framework="numpy")
            except (SafetensorError, OSError, ValueError) as e:
                raise ConversionError(f"{f}: not a readable safetensors file ({e})") from None
            for name in sorted(h.keys()):
                self._where[name] = (f, h)

    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name][1].get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        """The tensor as float32 or float16 (llama.cpp converts any other float type to float32)."""
        f, h = self._where[name]
        dtype = h.get_slice(name).get_dtype()
        if dtype not in FLOAT_DTYPES:
            raise ConversionError(f"{f}: tensor {name!r} is {dtype}; only F32, F16 and F64 weights are read "
                                  "(save the model in float32 or float16)")
        a = h.get_tensor(name)
        return a if a.dtype in (np.float32, np.float16) else a.astype(np.float32)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)
