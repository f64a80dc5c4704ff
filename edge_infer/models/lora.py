"""LoRA adapters as llama.cpp writes them (convert_lora_to_gguf.py) and loads them
(llama-adapter.cpp): `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, and
a pair `<base tensor>.lora_a` [rank, in] / `.lora_b` [out, rank] (numpy order) per base matrix.
An adapter is read whole into float32 (F32, F16 and Q8_0 tensors) and checked against the base
model it is bound to (models/lora_set.py)."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from edge_infer.errors import GGUFError, UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.formats.quants import dequantize

log = logging.getLogger("edge_infer.models")

ADAPTER_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0)
# matrices an adapter may not touch here: routers (computed inside the mixture-of-experts kernels)
_REFUSED = {"ffn_gate_inp.weight": "a router"}
EMBEDDING = "token_embd.weight"


@dataclass(frozen=True, slots=True)
class LoraPair:
    """One base matrix's update: a float32 [rank, in], b float32 [out, rank]; half: both were F16
    in the file (kept as half bits in memory, exactly)."""

    a: np.ndarray
    b: np.ndarray
    half: bool = False

    @property
    def rank(self) -> int:
        return int(self.b.shape[1])


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A LoRA adapter file read into memory. alpha: adapter.lora.alpha (0: the scale is the
    request's alone, else times alpha / rank); digest: sha256 of the file (prefix-cache keys)."""

    name: str
    path: str
    architecture: str
    alpha: float
    pairs: dict[str, LoraPair]
    digest: bytes

    @property
    def nbytes(self) -> int:
        return sum(p.a.nbytes + p.b.nbytes for p in self.pairs.values())


def _text(f: GGUFFile, key: str) -> str:
    v = f.metadata.get(key)
    if not isinstance(v, str):
        raise UnsupportedModelError(f"{f.path}: not a LoRA adapter: metadata {key!r} is missing or not a string")
    return v


def _floats(f: GGUFFile, name: str) -> np.ndarray:
    t = f.tensors[name]
    if t.type not in ADAPTER_TYPES or len(t.shape) != 2:
        kinds = ", ".join(q.name for q in ADAPTER_TYPES)
        raise UnsupportedModelError(f"{f.path}: LoRA tensor {name!r} is {t.type.name} of {len(t.shape)} dimensions; "
                                    f"adapters take 2-D {kinds} tensors")
    return np.ascontiguousarray(dequantize(t), np.float32)


def read_adapter(name: str, path: str) -> LoraAdapter:
    """The adapter file at `path`, checked to be llama.cpp's LoRA GGUF (the tensors' pairing and
    transposition as llama-adapter.cpp checks them); not yet checked against a base model."""
    try:
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").digest()
    except OSError as e:
        raise GGUFError(f"{path}: cannot read the LoRA adapter ({e.strerror})") from None
    with GGUFFile(path) as f:
        if (kind := _text(f, "general.type")) != "adapter":
            raise UnsupportedModelError(f"{path}: not a LoRA adapter (general.type is {kind!r}, expected 'adapter')")
        if (kind := _text(f, "adapter.type")) != "lora":
            raise UnsupportedModelError(f"{path}: adapter.type is {kind!r}; only 'lora' adapters are supported")
        if "adapter.alora.invocation_tokens" in f.metadata:
            raise UnsupportedModelError(f"{path}: activated LoRA (aLoRA) adapters are not supported")
        alpha = f.metadata.get("adapter.lora.alpha")
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not np.isfinite(alpha):
            raise UnsupportedModelError(f"{path}: metadata 'adapter.lora.alpha' is missing or not a finite number")
        halves: dict[str, dict[str, np.ndarray]] = {}
        for tname in f.tensors:
            base, _, part = tname.rpartition(".")
            if part in ("lora_a", "lora_b"):
                halves.setdefault(base, {})[part] = _floats(f, tname)
            elif tname.endswith("_norm.weight"):  # llama.cpp skips these too (mergekit-extract-lora writes them)
                log.warning("%s: tensor %r ignored (llama.cpp ignores an adapter's norm vectors)", path, tname)
            else:
                raise UnsupportedModelError(f"{path}: LoRA tensor {tname!r} has an unexpected suffix "
                                            "(expected .lora_a or .lora_b)")
        pairs = {}
        for base, h in halves.items():
            if len(h) != 2:
                raise UnsupportedModelError(f"{path}: the LoRA pair of {base!r} is missing its "
                                            f"{'lora_b' if 'lora_a' in h else 'lora_a'}")
            a, b = h["lora_a"], h["lora_b"]
            # the token embedding's A is stored flipped, [vocab, rank] (llama.cpp's get_rows)
            if a.shape[1 if base.endswith("token_embd.weight") else 0] != b.shape[1]:
                raise UnsupportedModelError(f"{path}: {base}.lora_a {a.shape} and .lora_b {b.shape} disagree on the "
                                            "rank (lora_a is not transposed?)")
            half = all(f.tensors[f"{base}.{p}"].type == GGMLQuantizationType.F16 for p in ("lora_a", "lora_b"))
            pairs[base] = LoraPair(a, b, half)
        if not pairs:
            raise UnsupportedModelError(f"{path}: the adapter has no LoRA tensors")
        return LoraAdapter(name, path, f.architecture, float(alpha), pairs, digest)


def check_against(adapter: LoraAdapter, architecture: str, matrices: dict[str, list[QMatrix]],
                  outside: set[str], embedding: QMatrix | None) -> None:
    """Refuse, by name, an adapter not made for this base: another architecture, a tensor the
    base lacks, a shape that differs (llama.cpp's checks), or a matrix edge-infer computes where
    no adapter can reach (routers, expert stacks, fused matrices it splits, `outside`: gemma4's
    per-layer inputs, gemma3n's AltUp and LAuReL). embedding: the token embedding [vocab, d]
    (None: the model ties its output matrix to it)."""
    where = f"LoRA adapter {adapter.name!r} ({adapter.path})"
    if adapter.architecture != architecture:
        raise UnsupportedModelError(f"{where} was made for a {adapter.architecture!r} model; this model is "
                                    f"{architecture!r}")
    for base, pair in adapter.pairs.items():
        if base == EMBEDDING:  # A [vocab, rank] read by rows, B [d, rank] (llama.cpp's build_inp_embd)
            if embedding is None:
                raise UnsupportedModelError(f"{where}: tensor {base!r}: this model ties its output matrix to the token "
                                            "embedding, which an embedding adapter would change too (llama.cpp "
                                            "cannot apply it either); not supported")
            if pair.a.shape[0] != embedding.rows or pair.b.shape[0] != embedding.cols:
                raise UnsupportedModelError(f"{where}: tensor {base!r} is [{embedding.rows}, {embedding.cols}] in the "
                                            f"model but the adapter's update is [{pair.a.shape[0]}, {pair.b.shape[0]}] "
                                            "(maybe the wrong base model?)")
            continue
        kind = _REFUSED.get(base.split(".", 2)[-1] if base.startswith("blk.") else base)
        if kind is not None:
            raise UnsupportedModelError(f"{where}: tensor {base!r} is {kind}; LoRA on it is not supported")
        if base in outside:
            raise UnsupportedModelError(f"{where}: tensor {base!r} is computed outside the layers' matmuls (per-layer "
                                        "inputs, AltUp, LAuReL); LoRA on it is not supported")
        found = matrices.get(base)
        if not found:
            raise UnsupportedModelError(f"{where}: tensor {base!r} does not exist in the base model (maybe the wrong "
                                        "base model?)")
        m = found[0]
        if m.n_experts:
            raise UnsupportedModelError(f"{where}: tensor {base!r} is a stack of experts; LoRA on it is not supported")
        if len(found) > 1:
            raise UnsupportedModelError(f"{where}: tensor {base!r} is a fused matrix edge-infer splits; LoRA on it is "
                                        "not supported")
        if pair.a.shape[1] != m.cols or pair.b.shape[0] != m.rows:
            raise UnsupportedModelError(f"{where}: tensor {base!r} is [{m.rows}, {m.cols}] in the model but the adapter's "
                                        f"update is [{pair.b.shape[0]}, {pair.a.shape[1]}] (maybe the wrong base "
                                        "model?)")
