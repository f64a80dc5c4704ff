"""`edge-infer inspect MODEL [--json]`: a GGUF file's header, metadata and tensor table.

`describe()` builds one plain dict (what `--json` prints); `format_text()` renders it for
people: long arrays become `[49152 strings]`, long strings are cut to one short line.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

SHORT_ARRAY = 16  # arrays up to this length keep their values in --json (8 in text)
TEXT_ARRAY = 8
TEXT_STRING = 72  # characters of a string value shown in text mode


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "inspect", parents=parents, help="show a GGUF file's metadata and tensors",
        description="Show a GGUF file's header, metadata (arrays summarised) and tensor table.",
    )
    p.add_argument("model", metavar="MODEL", help="a known model name (must be pulled) or a .gguf path")
    p.add_argument("--json", action="store_true", help="print a machine-readable JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.hub import resolve_model

    # No download: inspect should stay instant and read-only; the error says how to pull.
    path = resolve_model(args.model, download=False)
    with GGUFFile(path) as f:
        report = describe(f)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(format_text(report))
    return 0


def describe(f: Any) -> dict[str, Any]:
    """A JSON-ready summary of an open GGUFFile. Array values become
    {"type": "array[T]", "length": N} (plus "values" when N <= SHORT_ARRAY)."""
    metadata: dict[str, Any] = {}
    for key, value in f.metadata.items():
        if isinstance(value, list):
            entry: dict[str, Any] = {"type": f.metadata_types[key], "length": len(value)}
            if len(value) <= SHORT_ARRAY:
                entry["values"] = value
            metadata[key] = entry
        else:
            metadata[key] = value
    tensors = [
        {"name": t.name, "type": t.type.name, "shape": list(t.shape), "offset": t.offset, "nbytes": t.nbytes}
        for t in f.tensors.values()
    ]
    by_type: dict[str, dict[str, int]] = {}
    for t in f.tensors.values():
        d = by_type.setdefault(t.type.name, {"tensors": 0, "nbytes": 0})
        d["tensors"] += 1
        d["nbytes"] += t.nbytes
    return {
        "path": f.path,
        "file_size": f.size,
        "layers": layers(f),
        "version": f.version,
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "metadata": metadata,
        "metadata_types": dict(f.metadata_types),
        "tensors": tensors,
        "totals": {
            "tensors": len(tensors),
            "parameters": sum(t.n_elements for t in f.tensors.values()),
            "nbytes": sum(t.nbytes for t in f.tensors.values()),
            "by_type": dict(sorted(by_type.items(), key=lambda kv: -kv[1]["tensors"])),
        },
    }


def layers(f: Any) -> dict[str, Any]:
    """The model's layer kinds as edge-infer runs it: {"kinds": ["attention" | "short_conv" |
    "mamba2" | "gated_deltanet" | "attention+mamba2" (falcon-h1) | "ffn" (nemotron_h's FFN-only
    layers) | "shared_kv_attention" (gemma4's, gemma3n's: over an earlier layer's K/V), ...],
    "state_bytes_per_sequence": N}, or {"error": why} for a model it cannot run. An encoder's
    layers are "bidirectional_attention" (or "windowed_bidirectional_attention" on its sliding
    layers) and it adds {"encoder": {"pooling": name}}. A multimodal projector (mmproj) file is
    {"projector": {"type", "blocks", "width", "patch_size", "text_width"}}, or the error naming
    why it is refused."""
    from edge_infer.errors import EdgeInferError
    from edge_infer.models import config_from_gguf
    from edge_infer.models.encoder_config import encoder_config_from_gguf, is_encoder
    from edge_infer.models.vision_config import is_mmproj, vision_config_from_gguf

    try:
        if is_mmproj(f):
            v = vision_config_from_gguf(f)
            return {"projector": {"type": v.projector, "blocks": v.n_layers, "width": v.d_model,
                                  "patch_size": v.patch_size, "text_width": v.text_dim}}
        if is_encoder(f):
            enc = encoder_config_from_gguf(f)
            return {"kinds": ["windowed_bidirectional_attention" if enc.layer_window(i) else "bidirectional_attention"
                              for i in range(enc.n_layers)],
                    "state_bytes_per_sequence": 0, "encoder": {"pooling": enc.pooling}}
        cfg = config_from_gguf(f)
    except EdgeInferError as e:
        return {"error": str(e)}
    kinds = ["ffn" if not cfg.has_mixer(i) else "attention+mamba2" if cfg.is_ssm(i) and cfg.has_attention(i)
             else "short_conv" if cfg.is_conv(i) else "mamba2" if cfg.is_ssm(i)
             else "gated_deltanet" if cfg.is_delta(i) else "shared_kv_attention" if cfg.kv_source(i) != i
             else "attention" for i in range(cfg.n_layers)]
    return {"kinds": kinds, "state_bytes_per_sequence": cfg.state_bytes}


def _layers_line(r: dict[str, Any]) -> str:
    info = r.get("layers") or {}
    if "projector" in info:
        p = info["projector"]
        return (f"a multimodal projector: {p['type']}, a vision tower of {p['blocks']} blocks {p['width']} wide "
                f"over {p['patch_size']} px patches, giving {p['text_width']}-wide embeddings: load it beside its "
                "text model (--mmproj FILE, LLM(model, mmproj=FILE))")
    if "kinds" not in info:
        return f"layers: not runnable by edge-infer ({info.get('error', '?')})"
    counts: dict[str, int] = {}
    for k in info["kinds"]:
        counts[k] = counts.get(k, 0) + 1
    mix = ", ".join(f"{n} {k}" for k, n in counts.items())
    state = info["state_bytes_per_sequence"]
    if "encoder" in info:
        mix += f"; an encoder, pooling {info['encoder']['pooling']}: embeddings and rerank, no generation"
    return f"layers: {len(info['kinds'])} ({mix})" + (f"; recurrent state {human_bytes(state)} per sequence" if state else "")


def format_text(r: dict[str, Any]) -> str:
    """The human-readable report: header, metadata, tensor table, totals line."""
    out = [
        r["path"],
        f"  GGUF v{r['version']}, {human_bytes(r['file_size'])} ({r['file_size']:,} bytes), "
        f"alignment {r['alignment']}, tensor data at byte {r['data_offset']:,}",
        _layers_line(r),
        f"metadata ({len(r['metadata'])} keys):",
    ]
    types = r["metadata_types"]
    key_w = min(max((len(k) for k in r["metadata"]), default=0), 48)
    type_w = max((len(t) for t in types.values()), default=0)
    for key, value in r["metadata"].items():
        out.append(f"  {key:<{key_w}}  {types[key]:<{type_w}}  {_show_value(value, types[key])}")

    tensors = r["tensors"]
    out.append(f"tensors ({len(tensors)}; shape in GGUF order, row length first):")
    if tensors:
        shapes = [" x ".join(str(d) for d in t["shape"]) for t in tensors]
        sizes = [f"{t['nbytes']:,}" for t in tensors]
        name_w = max(len("NAME"), *(len(t["name"]) for t in tensors))
        ty_w = max(len("TYPE"), *(len(t["type"]) for t in tensors))
        sh_w = max(len("SHAPE"), *(len(s) for s in shapes))
        by_w = max(len("BYTES"), *(len(s) for s in sizes))
        out.append(f"  {'NAME':<{name_w}}  {'TYPE':<{ty_w}}  {'SHAPE':<{sh_w}}  {'BYTES':>{by_w}}")
        for t, shape, size in zip(tensors, shapes, sizes, strict=True):
            out.append(f"  {t['name']:<{name_w}}  {t['type']:<{ty_w}}  {shape:<{sh_w}}  {size:>{by_w}}")

    tot = r["totals"]
    mix = ", ".join(f"{name} x {d['tensors']}" for name, d in tot["by_type"].items())
    out.append(
        f"total: {tot['tensors']} tensors, {human_count(tot['parameters'])} parameters, "
        f"{human_bytes(tot['nbytes'])} of tensor data" + (f" ({mix})" if mix else "")
    )
    return "\n".join(out) + "\n"


def _show_value(value: Any, vtype: str) -> str:
    if isinstance(value, dict):  # a summarised array
        n, elem = value["length"], vtype[len("array[") : -1]
        if "values" in value and n <= TEXT_ARRAY:
            return "[" + ", ".join(_show_scalar(v, elem) for v in value["values"]) + "]"
        return f"[{n} {'strings' if elem == 'string' else elem}]"
    return _show_scalar(value, vtype)


def _show_scalar(value: Any, vtype: str) -> str:
    if isinstance(value, str):
        return _show_string(value)
    if vtype == "float32":
        return f"{value:.7g}"  # float32 read as a double: print the digits it really has
    return str(value)


def _show_string(s: str) -> str:
    # The reader keeps undecodable bytes as surrogates; they cannot be printed as they are.
    clean = s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if len(clean) <= TEXT_STRING:
        return json.dumps(clean, ensure_ascii=False)
    return json.dumps(clean[:TEXT_STRING], ensure_ascii=False)[:-1] + f'..." ({len(clean):,} chars)'


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    if n < 1024:
        return f"{n} B"
    size, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:.1f} {unit}"


def human_count(n: int) -> str:
    """134515008 -> '134.5M'."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)
