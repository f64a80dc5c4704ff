"""Which GGML type each tensor of a model gets when it is requantized: a target (one type for
every weight, or a llama.cpp-style mix such as Q4_K_M), the rules llama.cpp's
`llama_tensor_get_type` applies for it, and the user's explicit `--keep PATTERN=TYPE` overrides.

Rules kept from llama.cpp (src/llama-quant.cpp): only 2-D and 3-D tensors whose names end in
"weight" are quantized, never norms, the MoE router (`ffn_gate_inp`) or position embeddings;
the output matrix (and the token embedding when the output is tied to it) gets Q6_K unless the
target is Q8_0 or float; a mix raises attn_v / ffn_down / attn_output per layer as the preset
says; a K-quant on a row length that is not a multiple of 256 falls back to its record's
`fallback` in weight_types.py (a 32-element type), and to F16 when even 32 does not divide it.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from gguf import GGMLQuantizationType as T
from gguf import LlamaFileType as FT

from edge_infer.errors import InvalidRequest
from edge_infer.formats.weight_types import TYPES, weight_type

# the plain targets: name -> (type, general.file_type as llama.cpp writes it for that target)
PLAIN: dict[str, tuple[T, FT]] = {
    "f32": (T.F32, FT.ALL_F32),
    "f16": (T.F16, FT.MOSTLY_F16),
    "q8_0": (T.Q8_0, FT.MOSTLY_Q8_0),
    "q6_k": (T.Q6_K, FT.MOSTLY_Q6_K),
    "q5_k": (T.Q5_K, FT.MOSTLY_Q5_K_S),
    "q5_1": (T.Q5_1, FT.MOSTLY_Q5_1),
    "q5_0": (T.Q5_0, FT.MOSTLY_Q5_0),
    "q4_k": (T.Q4_K, FT.MOSTLY_Q4_K_S),
    "q4_1": (T.Q4_1, FT.MOSTLY_Q4_1),
    "q4_0": (T.Q4_0, FT.MOSTLY_Q4_0),
    "q3_k": (T.Q3_K, FT.MOSTLY_Q3_K_S),
    "q2_k": (T.Q2_K, FT.MOSTLY_Q2_K),
    "iq4_xs": (T.IQ4_XS, FT.MOSTLY_IQ4_XS),
    "iq4_nl": (T.IQ4_NL, FT.MOSTLY_IQ4_NL),
}
# the mixes: name -> (base type, file type); their per-tensor rules are in _mix_type
MIXES: dict[str, tuple[T, FT]] = {
    "q5_k_m": (T.Q5_K, FT.MOSTLY_Q5_K_M),
    "q4_k_m": (T.Q4_K, FT.MOSTLY_Q4_K_M),
    "q4_k_s": (T.Q4_K, FT.MOSTLY_Q4_K_S),
    "q3_k_l": (T.Q3_K, FT.MOSTLY_Q3_K_L),
    "q3_k_m": (T.Q3_K, FT.MOSTLY_Q3_K_M),
    "q2_k_m": (T.Q2_K, FT.MOSTLY_Q2_K),  # llama.cpp's "Q2_K" file type: a mix, not all Q2_K
    # the grid file types (their rules in _iq_mix_type); llama.cpp's IQ2_S file is mostly IQ2_XS
    "iq3_m": (T.IQ3_S, FT.MOSTLY_IQ3_M),
    "iq3_s": (T.IQ3_S, FT.MOSTLY_IQ3_S),
    "iq3_xxs": (T.IQ3_XXS, FT.MOSTLY_IQ3_XXS),
    "iq2_m": (T.IQ2_S, FT.MOSTLY_IQ2_M),
    "iq2_s": (T.IQ2_XS, FT.MOSTLY_IQ2_S),
    "iq2_xs": (T.IQ2_XS, FT.MOSTLY_IQ2_XS),
    "iq2_xxs": (T.IQ2_XXS, FT.MOSTLY_IQ2_XXS),
    "iq1_m": (T.IQ1_M, FT.MOSTLY_IQ1_M),
    "iq1_s": (T.IQ1_S, FT.MOSTLY_IQ1_S),
}
_IQ1_FILES = (FT.MOSTLY_IQ1_S, FT.MOSTLY_IQ1_M)
_IQ2_FILES = (FT.MOSTLY_IQ2_XXS, FT.MOSTLY_IQ2_XS, FT.MOSTLY_IQ2_S, FT.MOSTLY_IQ2_M, *_IQ1_FILES)
_IQ3_FILES = (FT.MOSTLY_IQ3_XXS, FT.MOSTLY_IQ3_S, FT.MOSTLY_IQ3_M)
KEEP_TYPES = {n: t for n, (t, _) in PLAIN.items()} | {"f32": T.F32, "bf16": T.BF16} | {
    t.name.lower(): t for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M)}
# a K-quant's type when the row length is not a multiple of 256 (the records' fallback)
FALLBACK = {T(w.id): T(w.fallback) for w in TYPES if w.fallback is not None}
_NEVER = ("_norm.weight", "ffn_gate_inp.weight", "position_embd.weight", "token_types.weight")


@dataclass(frozen=True)
class Target:
    """A validated --type: the base type, the file type written, whether it is a mix."""

    name: str
    base: T
    file_type: FT
    mix: bool


def parse_target(name: str) -> Target:
    key = name.strip().lower()
    if key in PLAIN:
        return Target(key, *PLAIN[key], mix=False)
    if key in MIXES:
        return Target(key, *MIXES[key], mix=True)
    raise InvalidRequest(f"unknown --type {name!r}; choose one of: {', '.join([*PLAIN, *MIXES])}")


def parse_keep(spec: str) -> tuple[str, T]:
    """'PATTERN=TYPE' (a shell-style glob over tensor names) -> (pattern, type)."""
    pattern, sep, tname = spec.rpartition("=")
    if not sep or not pattern.strip() or not tname.strip():
        raise InvalidRequest(f"--keep {spec!r}: expected PATTERN=TYPE, e.g. 'blk.0.*=q8_0'")
    t = KEEP_TYPES.get(tname.strip().lower())
    if t is None:
        raise InvalidRequest(f"--keep {spec!r}: unknown type {tname!r}; choose one of: {', '.join(KEEP_TYPES)}")
    return pattern.strip(), t


def quantizable(name: str, n_dims: int) -> bool:
    """Whether llama.cpp would quantize this tensor at all."""
    return n_dims >= 2 and name.endswith("weight") and not any(s in name for s in _NEVER)


def block_size(t: T) -> int:
    """Elements per block of type t."""
    return weight_type(t).block_size


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer(name: str) -> int | None:
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def _mix_type(target: Target, name: str, n_layer: int, n_gqa: int, counters: dict[str, int]) -> T:
    """The preset's type for one weight (llama_tensor_get_type_impl's K-quant branches).
    counters: how many attn_v tensors were seen before this one (llama.cpp counts in file order)."""
    ft, base = target.file_type, target.base
    i = _layer(name)
    if "attn_v.weight" in name:
        k = counters.get("attn_v", 0)
        counters["attn_v"] = k + 1
        if ft == FT.MOSTLY_Q2_K:
            return T.Q4_K if n_gqa >= 4 else T.Q3_K
        if ft == FT.MOSTLY_Q3_K_M:
            return T.Q5_K if k < 2 else T.Q4_K
        if ft == FT.MOSTLY_Q3_K_L:
            return T.Q5_K
        if ft in (FT.MOSTLY_Q4_K_M, FT.MOSTLY_Q5_K_M) and _use_more_bits(k, n_layer):
            return T.Q6_K
        if ft == FT.MOSTLY_Q4_K_S and k < 4:
            return T.Q5_K
        return base
    if "ffn_down" in name and i is not None:
        if ft == FT.MOSTLY_Q2_K:
            return T.Q3_K
        if ft == FT.MOSTLY_Q3_K_M:
            return T.Q5_K if i < n_layer // 16 else T.Q4_K
        if ft == FT.MOSTLY_Q3_K_L:
            return T.Q5_K
        if ft in (FT.MOSTLY_Q4_K_M, FT.MOSTLY_Q5_K_M) and _use_more_bits(i, n_layer):
            return T.Q6_K
        if ft == FT.MOSTLY_Q4_K_S and i < n_layer // 8:
            return T.Q5_K
        return base
    if "attn_output.weight" in name:
        return {FT.MOSTLY_Q2_K: T.Q3_K, FT.MOSTLY_Q3_K_M: T.Q4_K, FT.MOSTLY_Q3_K_L: T.Q5_K}.get(ft, base)
    if "attn_qkv.weight" in name:
        return {FT.MOSTLY_Q3_K_M: T.Q4_K, FT.MOSTLY_Q3_K_L: T.Q4_K, FT.MOSTLY_Q4_K_M: T.Q5_K,
                FT.MOSTLY_Q5_K_M: T.Q6_K}.get(ft, base)
    return base


def _iq_mix_type(ft: FT, base: T, name: str, n_layer: int, n_gqa: int, has_imatrix: bool,
                 counters: dict[str, int]) -> T:
    """A grid file type's type for one weight (llama_tensor_get_type_impl's IQ1/IQ2/IQ3 branches,
    for a dense model: its 8-expert rules are not kept). counters: ffn_down seen so far."""
    i = _layer(name)
    is_ = {role: name.endswith(f"{role}.weight") for role in ("attn_v", "attn_k", "attn_q", "attn_output", "attn_qkv")}
    wide = ft in (FT.MOSTLY_IQ2_S, FT.MOSTLY_IQ2_M)  # these two raise to IQ3_S where the others take Q2_K
    if ft in _IQ2_FILES:
        if is_["attn_v"]:
            return T.Q4_K if n_gqa >= 4 else T.IQ3_S if wide else T.Q2_K
        if "ffn_down" in name:
            k = counters.get("ffn_down", 0)
            counters["ffn_down"] = k + 1
            return (T.IQ3_S if wide else T.Q2_K) if k < n_layer // 8 else base
        if is_["attn_output"]:
            return T.IQ3_S if wide else T.IQ2_XXS if ft in _IQ1_FILES else base
        return base
    xxs, m = ft == FT.MOSTLY_IQ3_XXS, ft == FT.MOSTLY_IQ3_M
    if is_["attn_v"]:
        if xxs:
            return T.Q4_K if n_gqa >= 4 else T.IQ3_XXS if has_imatrix else T.IQ3_S
        return T.Q4_K if m or n_gqa >= 4 else base
    if (is_["attn_k"] or is_["attn_q"]) and xxs:
        return T.IQ2_S
    if "ffn_down" in name and i is not None:
        if xxs and not has_imatrix:
            return T.Q4_K if i < n_layer // 8 else T.Q3_K
        return T.Q4_K if m and i < n_layer // 8 else base
    if is_["attn_output"]:
        return T.IQ3_S if xxs else T.Q4_K if m else base
    return T.Q4_K if is_["attn_qkv"] and m else base


def choose_types(tensors: list[tuple[str, tuple[int, ...]]], target: Target, keep: list[tuple[str, T]],
                 n_layer: int, n_gqa: int, has_imatrix: bool = False) -> dict[str, T | None]:
    """For each (name, GGUF shape ne0 first) in file order: the new type, or None to copy the
    tensor as it is (not quantizable). A --keep pattern that matches nothing is an error.
    has_imatrix: Q4_0 / Q5_0 then keep the first eighth of ffn_down at Q4_1 / Q5_1 (llama.cpp
    guards those layers so only when an importance matrix is used)."""
    names = [n for n, _ in tensors]
    for pattern, _ in keep:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise InvalidRequest(f"--keep {pattern!r} matches no tensor of the model (names look like {names[-1]!r})")
    tied = "output.weight" not in names
    out: dict[str, T | None] = {}
    counters: dict[str, int] = {}
    for name, shape in tensors:
        if not quantizable(name, len(shape)):
            out[name] = None
            continue
        t = target.base
        manual = next((kt for p, kt in keep if fnmatch.fnmatchcase(name, p)), None)
        if manual is not None:
            t = manual
        elif t in (T.F16, T.F32, T.BF16):
            pass
        elif name == "output.weight" or (tied and name == "token_embd.weight"):
            grid_low = target.mix and target.file_type in (*_IQ2_FILES, FT.MOSTLY_IQ3_XXS)
            t = T.Q8_0 if t == T.Q8_0 or shape[0] % 256 else T.Q5_K if grid_low else T.Q6_K
        elif target.mix and target.file_type in (*_IQ2_FILES, *_IQ3_FILES):
            if name == "token_embd.weight":
                t = T.Q2_K if target.file_type in (FT.MOSTLY_IQ2_XXS, FT.MOSTLY_IQ2_XS, *_IQ1_FILES) else T.IQ3_S
            else:
                t = _iq_mix_type(target.file_type, t, name, n_layer, n_gqa, has_imatrix, counters)
        elif target.mix:
            t = _mix_type(target, name, n_layer, n_gqa, counters)
        elif has_imatrix and t in (T.Q4_0, T.Q5_0) and "ffn_down" in name and (_layer(name) or 0) < n_layer // 8:
            t = T.Q4_1 if t == T.Q4_0 else T.Q5_1
        if shape[0] % block_size(t):  # the row length does not fit the type's blocks
            t = FALLBACK.get(t, t)
            if shape[0] % block_size(t):
                t = T.F16
        out[name] = t
    return out
