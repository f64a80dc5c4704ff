"""BERT's tensors as llama.cpp's converter writes them: which Hugging Face tensors it drops,
the GGUF name of each other one (gguf-py's tensor map for MODEL_ARCH.BERT, spelled out), the
shape each must have, and the type it is stored as."""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as T

from edge_infer.errors import ConversionError

# the whole-model tensors: Hugging Face name (without "bert.", without .weight/.bias) -> GGUF
GLOBAL = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.LayerNorm": "token_embd_norm",
    "classifier": "cls",  # llama.cpp's name for a classifier with placeholder labels
    "classifier.out_proj": "cls.output",
}
# a layer's tensors: after "encoder.layer.{i}." -> after "blk.{i}."
LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
# what BertModel.filter_tensors and prepare_tensors drop: the pooler and the pretraining heads
DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
DROPPED_PREFIXES = ("cls.predictions", "cls.seq_relationship")
DROPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")
# always stored as F32 (llama.cpp's list, as far as bert has them), besides 1-D tensors,
# norms and anything not named .weight
KEEP_F32 = ("position_embd.weight", "token_types.weight")
OUT_TYPES = {"f32": T.F32, "f16": T.F16, "q8_0": T.Q8_0}
Q8_0_BLOCK = 32


@dataclass(frozen=True, slots=True)
class BertDims:
    """The sizes that fix every tensor's shape."""

    vocab: int
    hidden: int
    layers: int
    ffn: int
    positions: int
    token_types: int
    labels: int  # classifier outputs (0: no classifier)


def gguf_name(hf_name: str, has_labels: bool) -> str | None:
    """The GGUF name llama.cpp gives the Hugging Face tensor `hf_name`, or None when it drops it.
    has_labels: the config has real classifier labels (its classifier becomes cls.output)."""
    name = hf_name[5:] if hf_name.startswith("bert.") else hf_name
    if name.endswith(".gamma"):
        name = name[:-6] + ".weight"
    if name.endswith(".beta"):
        name = name[:-5] + ".bias"
    if name in DROPPED or name.startswith(DROPPED_PREFIXES) or name.endswith(DROPPED_SUFFIXES):
        return None
    if has_labels and name in ("classifier.weight", "classifier.bias"):
        name = "classifier.out_proj." + name.rsplit(".", 1)[1]
    base, _, suffix = name.rpartition(".")
    if suffix in ("weight", "bias"):
        if base in GLOBAL:
            return f"{GLOBAL[base]}.{suffix}"
        parts = base.split(".", 3)
        if len(parts) == 4 and parts[:2] == ["encoder", "layer"] and parts[2].isdecimal() and parts[3] in LAYER:
            return f"blk.{int(parts[2])}.{LAYER[parts[3]]}.{suffix}"
    raise ConversionError(f"tensor {hf_name!r} is not a BERT tensor llama.cpp's converter maps")


def hf_name(name: str) -> str:
    """The Hugging Face name (as BertModel saves it) of the GGUF tensor `name`."""
    base, _, suffix = name.rpartition(".")
    if base.startswith("blk."):
        _, i, rest = base.split(".", 2)
        return f"encoder.layer.{i}.{next(k for k, v in LAYER.items() if v == rest)}.{suffix}"
    return f"{next(k for k, v in GLOBAL.items() if v == base)}.{suffix}"


def expected_shapes(d: BertDims) -> dict[str, tuple[int, ...]]:
    """Every GGUF tensor a BERT model has, with its numpy shape (rows = outputs): the classifier's
    only when it has labels."""
    h = d.hidden
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (d.vocab, h),
        "token_types.weight": (d.token_types, h),
        "position_embd.weight": (d.positions, h),
        "token_embd_norm.weight": (h,),
        "token_embd_norm.bias": (h,),
    }
    for i in range(d.layers):
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            shapes[f"blk.{i}.{proj}.weight"], shapes[f"blk.{i}.{proj}.bias"] = (h, h), (h,)
        shapes[f"blk.{i}.ffn_up.weight"], shapes[f"blk.{i}.ffn_up.bias"] = (d.ffn, h), (d.ffn,)
        shapes[f"blk.{i}.ffn_down.weight"], shapes[f"blk.{i}.ffn_down.bias"] = (h, d.ffn), (h,)
        for norm in ("attn_output_norm", "layer_output_norm"):
            shapes[f"blk.{i}.{norm}.weight"], shapes[f"blk.{i}.{norm}.bias"] = (h,), (h,)
    if d.labels:
        shapes["cls.output.weight"], shapes["cls.output.bias"] = (d.labels, h), (d.labels,)
    return shapes


OPTIONAL = ("cls.output.weight", "cls.output.bias")  # a BertModel whose config names labels has none


def check_tensors(found: dict[str, tuple[str, tuple[int, ...]]], d: BertDims) -> None:
    """found: GGUF name -> (Hugging Face name, shape). Every expected tensor is there with its
    shape and nothing else is; otherwise a ConversionError naming the first problem."""
    want = expected_shapes(d)
    for name, (hf, shape) in found.items():
        if name not in want:
            why = (f"it is beyond the {d.layers} layers of num_hidden_layers" if name.startswith("blk.") else
                   "a classifier with the placeholder labels LABEL_0, LABEL_1 becomes llama.cpp's `cls`, "
                   "which its bert cannot load: give config.json's id2label the real label names"
                   if name.startswith("cls") else "llama.cpp's bert has no such tensor")
            raise ConversionError(f"tensor {hf!r} ({name}): unexpected; {why}")
        if shape != want[name]:
            raise ConversionError(f"tensor {hf!r} ({name}) has shape {list(shape)}, expected {list(want[name])} "
                                  "from config.json")
    missing = [n for n in want if n not in found and n not in OPTIONAL]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ConversionError(f"missing tensor {hf_name(missing[0])!r} ({missing[0]}){more}: model.safetensors "
                              "does not hold all of the weights config.json describes")
    if ("cls.output.weight" in found) != ("cls.output.bias" in found):
        raise ConversionError("the classifier needs both its weight and its bias")


def tensor_type(name: str, shape: tuple[int, ...], out: T) -> T:
    """llama.cpp's choice: F32 for 1-D tensors, norms, biases, positions and token types; the
    output type for the rest, but F16 for a Q8_0 row that is not whole blocks (as gguf-py
    refuses it and the converter falls back)."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or name in KEEP_F32 or not name.endswith(".weight"):
        return T.F32
    if out == T.Q8_0 and shape[-1] % Q8_0_BLOCK:
        return T.F16
    return out
