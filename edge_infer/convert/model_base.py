"""What the writer asks of each architecture's conversion, and the parts they share: the plan
of tensors (each GGUF tensor, the Hugging Face tensor it comes from, its shape, how to read it),
the check of names and shapes against what the architecture must have, and llama.cpp's choice
of each tensor's stored type (its prepare_tensors rules)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, LlamaFileType

from edge_infer.convert.hf_folder import HFFolder, SafetensorParts
from edge_infer.errors import ConversionError

OUT_TYPES = {"f32": T.F32, "f16": T.F16, "q8_0": T.Q8_0}
Q8_0_BLOCK = 32
# llama.cpp keeps these in F32 whatever the output type (its list, as far as these models have them)
KEEP_F32 = ("position_embd.weight", "token_types.weight")
Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Planned:
    """One tensor to write: its GGUF name, the Hugging Face tensor it comes from, its numpy
    shape (rows = outputs) and how to read its data (float32 or float16)."""

    name: str
    hf: str
    shape: tuple[int, ...]
    read: Callable[[], np.ndarray]


class Converter:
    """One architecture's conversion of a checked folder. The writer calls prepare (everything
    that can be refused short of tensor data), plan, then add_parameters and add_vocab in
    llama.cpp's key order."""

    arch: ClassVar[str]  # the GGUF architecture
    hf_architectures: ClassVar[tuple[str, ...]]  # config.json's architectures it converts
    # include sentence-transformers' Dense modules (set by the writer before prepare); read only
    # where llama.cpp's converter can write them (gemma-embedding), as it ignores them elsewhere
    dense_modules: bool = False

    def __init__(self, folder: HFFolder) -> None:
        self.folder = folder

    @classmethod
    def from_config(cls, path: Path, raw: dict[str, Any], arch: str) -> Converter:
        """The converter of the folder at `path` whose config.json is `raw` (architectures[0]
        `arch`), its config checked (with the defaults AutoConfig would add)."""
        raise NotImplementedError

    def prepare(self) -> None:
        raise NotImplementedError

    def plan(self, parts: SafetensorParts) -> list[Planned]:
        raise NotImplementedError

    def add_parameters(self, w: GGUFWriter, ftype: LlamaFileType) -> None:
        """The hyper-parameters, from TextModel.set_gguf_parameters on (general.file_type among them)."""
        raise NotImplementedError

    def add_vocab(self, w: GGUFWriter) -> None:
        raise NotImplementedError


def planned(parts: SafetensorParts, found: dict[str, tuple[str, tuple[int, ...]]],
            transform: Callable[[str, np.ndarray], np.ndarray] | None = None) -> list[Planned]:
    """found (GGUF name -> (Hugging Face name, shape)) as a plan reading from parts, each array
    passed through transform(GGUF name, array) when one is given."""
    def reader(name: str, hf: str) -> Callable[[], np.ndarray]:
        if transform is None:
            return lambda: parts.get(hf)
        return lambda: transform(name, parts.get(hf))

    return [Planned(name, hf, shape, reader(name, hf)) for name, (hf, shape) in found.items()]


def check_tensors(found: dict[str, tuple[str, tuple[int, ...]]], want: Shapes, optional: tuple[str, ...],
                  unexpected: Callable[[str], str], hf_of: Callable[[str], str], pairs: tuple[str, ...] = ()) -> None:
    """found: GGUF name -> (Hugging Face name, shape). Every wanted tensor not in `optional` is
    there with its shape and nothing unwanted is; a ConversionError names the first problem
    (unexpected(name) says why a tensor is not wanted, hf_of(name) the Hugging Face name of a
    missing one). pairs: GGUF base names (".weight" / ".bias") that come both or neither."""
    for name, (hf, shape) in found.items():
        if name not in want:
            raise ConversionError(f"tensor {hf!r} ({name}): unexpected; {unexpected(name)}")
        if shape != want[name]:
            raise ConversionError(f"tensor {hf!r} ({name}) has shape {list(shape)}, expected {list(want[name])} "
                                  "from config.json")
    missing = [n for n in want if n not in found and n not in optional]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ConversionError(f"missing tensor {hf_of(missing[0])!r} ({missing[0]}){more}: model.safetensors "
                              "does not hold all of the weights config.json describes")
    for base in pairs:
        if (f"{base}.weight" in found) != (f"{base}.bias" in found):
            raise ConversionError(f"{base}: needs both its weight and its bias")


def layer_shapes(layers: int, per_layer: Shapes) -> Shapes:
    """per_layer's names (after "blk.{i}.") for every layer."""
    return {f"blk.{i}.{n}": s for i in range(layers) for n, s in per_layer.items()}


# what llama.cpp's BERT-family converters drop: position ids, the pooler, masked-LM and
# next-sentence heads, attention masks and rotary tables kept as buffers
DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
DROPPED_PREFIXES = ("cls.predictions", "cls.seq_relationship")
DROPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")


def bert_style_name(hf: str) -> str | None:
    """A BERT-family tensor name as llama.cpp's converters see it: without the `bert.` prefix,
    LayerNorm `gamma` / `beta` as `weight` / `bias`; None for a tensor they drop."""
    name = hf[5:] if hf.startswith("bert.") else hf
    if name.endswith(".gamma"):
        name = name[:-6] + ".weight"
    if name.endswith(".beta"):
        name = name[:-5] + ".bias"
    if name in DROPPED or name.startswith(DROPPED_PREFIXES) or name.endswith(DROPPED_SUFFIXES):
        return None
    return name


def bert_family_gguf_name(hf: str, whole: dict[str, str], layer_prefix: str, layer: dict[str, str],
                          arch: str) -> str | None:
    """The GGUF name of a BERT-family tensor (bert_style_name, then the architecture's maps), None
    when llama.cpp drops it; ConversionError naming `arch` for a tensor it does not map."""
    name = bert_style_name(hf)
    if name is None:
        return None
    mapped = map_name(name, whole, layer_prefix, layer)
    if mapped is None:
        raise ConversionError(f"tensor {hf!r} is not one of {arch}'s tensors")
    return mapped


def map_name(name: str, whole: dict[str, str], layer_prefix: str, layer: dict[str, str]) -> str | None:
    """The GGUF name of a Hugging Face tensor (prefixes already removed) by the two tables: whole
    model (base name -> GGUF base) and per layer (after f"{layer_prefix}{i}."), or None."""
    base, _, suffix = name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if base in whole:
        return f"{whole[base]}.{suffix}"
    if base.startswith(layer_prefix):
        i, _, rest = base[len(layer_prefix):].partition(".")
        if i.isdecimal() and rest in layer:
            return f"blk.{int(i)}.{layer[rest]}.{suffix}"
    return None


def hf_name_of(name: str, whole: dict[str, str], layer_prefix: str, layer: dict[str, str]) -> str:
    """map_name reversed: the Hugging Face name of the GGUF tensor `name`."""
    base, _, suffix = name.rpartition(".")
    if base.startswith("blk."):
        _, i, rest = base.split(".", 2)
        return f"{layer_prefix}{i}.{next(k for k, v in layer.items() if v == rest)}.{suffix}"
    return f"{next(k for k, v in whole.items() if v == base)}.{suffix}"


def tensor_type(name: str, shape: tuple[int, ...], out: T) -> T:
    """llama.cpp's choice: F32 for 1-D tensors, norms, biases, positions and token types; the
    output type for the rest, but F16 for a Q8_0 row that is not whole blocks (as gguf-py
    refuses it and the converter falls back)."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or name in KEEP_F32 or not name.endswith(".weight"):
        return T.F32
    if out == T.Q8_0 and shape[-1] % Q8_0_BLOCK:
        return T.F16
    return out
