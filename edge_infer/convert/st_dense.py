"""sentence-transformers' Dense modules (modules.json, each module's config.json and
model.safetensors) as llama.cpp's --sentence-transformers-dense-modules reads them: the module at
2_Dense becomes `dense_2`, the one after it `dense_3`, each its `linear.weight` with in/out
feature keys. llama.cpp projects the pooled embedding by them, without a bias or an activation,
and needs the result as wide as the model: so the chain is hidden -> n -> hidden, both or only
the first, after the Pooling module. What it would silently skip or drop (a module without
model.safetensors or config.json, a bias, an activation) is refused here instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_infer.convert.hf_folder import SafetensorParts
from edge_infer.convert.special_vocab import read_json
from edge_infer.errors import ConversionError

PATHS = ("2_Dense", "3_Dense")  # EmbeddingGemma's, the layout llama.cpp names dense_2, dense_3
IDENTITY = ("torch.nn.modules.linear.Identity", "torch.nn.Identity")


@dataclass(frozen=True, slots=True)
class DenseModule:
    """One Dense module: its GGUF prefix (dense_2, dense_3), folder, features and weights."""

    prefix: str
    path: Path
    in_features: int
    out_features: int
    parts: SafetensorParts

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features


def dense_module_paths(folder: Path) -> list[str]:
    """The paths of modules.json's Dense modules, in order (none without modules.json)."""
    return [p for p, kind, _ in _modules(folder) if kind.endswith("Dense")]


def read_dense_modules(folder: Path, hidden: int) -> list[DenseModule]:
    """The folder's Dense modules, checked to be what llama.cpp's graph computes after pooling."""
    mods = _modules(folder)
    dense = [(p, i) for p, kind, i in mods if kind.endswith("Dense")]
    if not dense:
        return []
    where = folder / "modules.json"
    paths = [p for p, _ in dense]
    if paths != list(PATHS[:len(paths)]):
        raise ConversionError(f"{where}: Dense modules at {paths}; llama.cpp's gemma-embedding reads them from "
                              f"{PATHS[0]} and then {PATHS[1]}")
    pooling = next((i for _, kind, i in mods if kind.endswith("Pooling")), None)
    if pooling is None or dense[0][1] < pooling:
        raise ConversionError(f"{where}: the Dense modules must come after a Pooling module "
                              "(llama.cpp projects the pooled embedding)")
    out = [_module(folder, p, prefix) for p, prefix in zip(paths, ("dense_2", "dense_3"))]
    if out[0].in_features != hidden or out[-1].out_features != hidden:
        dims = " -> ".join([str(out[0].in_features)] + [str(m.out_features) for m in out])
        raise ConversionError(f"{where}: the Dense modules map {dims}; llama.cpp needs hidden_size {hidden} "
                              f"in and out")
    if len(out) == 2 and out[0].out_features != out[1].in_features:
        raise ConversionError(f"{folder / PATHS[1] / 'config.json'}: in_features {out[1].in_features} is not "
                              f"{PATHS[0]}'s out_features {out[0].out_features}")
    return out


def _modules(folder: Path) -> list[tuple[str, str, int]]:
    """(path, type, position) of each entry of modules.json."""
    where = folder / "modules.json"
    if not where.is_file():
        return []
    mods = read_json(where)
    if not isinstance(mods, list) or not all(isinstance(m, dict) for m in mods):
        raise ConversionError(f"{where}: expected a list of modules")
    return [(str(m.get("path", "")), str(m.get("type", "")), i) for i, m in enumerate(mods)]


def _module(folder: Path, path: str, prefix: str) -> DenseModule:
    d = folder / path
    conf_path = d / "config.json"
    if not conf_path.is_file() or not (d / "model.safetensors").is_file():
        what = "config.json" if not conf_path.is_file() else "model.safetensors"
        raise ConversionError(f"{d}: no {what} (llama.cpp's converter reads the Dense module's weights from "
                              "model.safetensors and its features from config.json)")
    conf: Any = read_json(conf_path)
    conf = conf if isinstance(conf, dict) else {}
    n_in, n_out = conf.get("in_features"), conf.get("out_features")
    for key, v in (("in_features", n_in), ("out_features", n_out)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConversionError(f"{conf_path}: {key} must be a positive integer, got {v!r}")
    if conf.get("bias", True):
        raise ConversionError(f"{conf_path}: a Dense module with a bias is not supported "
                              "(llama.cpp's gemma-embedding has none; its converter would drop it)")
    act = conf.get("activation_function")
    if act not in IDENTITY:
        raise ConversionError(f"{conf_path}: activation_function {act!r} is not supported; llama.cpp applies "
                              "none (torch.nn.modules.linear.Identity)")
    parts = SafetensorParts(d)
    names = parts.names()
    if names != ["linear.weight"]:
        raise ConversionError(f"{d / 'model.safetensors'}: tensors {names}; a Dense module without a bias "
                              "holds only linear.weight")
    if parts.shape("linear.weight") != (n_out, n_in):
        raise ConversionError(f"{d / 'model.safetensors'}: linear.weight has shape "
                              f"{list(parts.shape('linear.weight'))}, expected [{n_out}, {n_in}] from config.json")
    return DenseModule(prefix, d, n_in, n_out, parts)
