"""BERT's tensors as llama.cpp's converter writes them: which Hugging Face tensors it drops,
the GGUF name of each other one (gguf-py's tensor map for MODEL_ARCH.BERT, spelled out) and the
shape each must have."""

from __future__ import annotations

from dataclasses import dataclass

from edge_infer.convert.model_base import bert_style_name
from edge_infer.convert.model_base import check_tensors as check_planned
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
    name = bert_style_name(hf_name)
    if name is None:
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
    def why(name: str) -> str:
        if name.startswith("blk."):
            return f"it is beyond the {d.layers} layers of num_hidden_layers"
        if name.startswith("cls"):
            return ("a classifier with the placeholder labels LABEL_0, LABEL_1 becomes llama.cpp's `cls`, "
                    "which its bert cannot load: give config.json's id2label the real label names")
        return "llama.cpp's bert has no such tensor"

    check_planned(found, expected_shapes(d), OPTIONAL, why, hf_name, pairs=("cls.output",))
