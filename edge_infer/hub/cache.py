"""The local model cache: where files live, their sha256 verification markers, atomic writes.

Layout: `cache_dir()/models/<name>.gguf`, next to it a sidecar `<file>.sha256` ("digest size
mtime_ns") written once the file has been verified, so that later pulls and loads trust the
file without re-hashing it while its size and mtime are unchanged. A model converted on pull
lives in `<name>-<type>-conv<converter version>.gguf` (a new converter converts again) beside
its verified source `<name>.hf.zip` (kept, so that it does so without downloading again).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from edge_infer.errors import HubError
from edge_infer.hub.registry import KNOWN_MODELS, KnownModel

log = logging.getLogger("edge_infer.hub")

CHUNK = 1 << 20  # bytes read or written at a time


def cache_dir() -> Path:
    """Root of the edge-infer cache: $EDGE_INFER_CACHE, else ~/.cache/edge-infer."""
    env = os.environ.get("EDGE_INFER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edge-infer"


def models_dir() -> Path:
    """Folder holding the cached .gguf files (it may not exist yet)."""
    return cache_dir() / "models"


def cached_path(name: str) -> Path:
    """Where the known model `name` lives in the cache (it may not exist yet)."""
    m = KNOWN_MODELS.get(name)
    if m is not None and m.convert is not None:
        from edge_infer.convert import CONVERTER_VERSION

        return models_dir() / f"{name}-{m.convert}-conv{CONVERTER_VERSION}.gguf"
    return models_dir() / f"{name}.gguf"


def source_path(name: str) -> Path:
    """Where the verified source zip of a model converted on pull is kept (it may not exist yet)."""
    return models_dir() / f"{name}.hf.zip"


def make_models_dir() -> None:
    """Create the models folder, or a HubError that says how to point the cache elsewhere."""
    d = models_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HubError(
            f"cannot create the cache folder {d} ({e.strerror}); set EDGE_INFER_CACHE elsewhere"
        ) from None


def progress_bar(show: bool, total: int | None, desc: str, initial: int = 0) -> Any:
    """A tqdm byte counter on stderr, disabled (a no-op) unless `show`."""
    from tqdm import tqdm  # deferred: importing tqdm costs time the fast paths don't need

    return tqdm(
        total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
        disable=not show, file=sys.stderr, dynamic_ncols=True,
    )


# -- verification markers ----------------------------------------------------------------
def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _read_marker(path: Path) -> str | None:
    """The digest recorded for `path`, if the marker still describes the file as it is now."""
    try:
        digest, size, mtime_ns = _marker(path).read_text().split()
        st = path.stat()
    except (OSError, ValueError):
        return None
    if int(size) != st.st_size or int(mtime_ns) != st.st_mtime_ns:
        return None
    return digest


def write_marker(path: Path, digest: str) -> None:
    """Record `digest` for `path` as it is now; a read-only cache just loses the shortcut."""
    try:
        st = path.stat()
        _atomic_write_text(_marker(path), f"{digest} {st.st_size} {st.st_mtime_ns}\n")
    except OSError as e:
        log.info("could not write %s (%s); the file will be hashed again next time", _marker(path), e)


def drop_marker(path: Path) -> None:
    """Remove path's marker, before path is replaced by a file the marker would not describe."""
    _marker(path).unlink(missing_ok=True)


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = new_temp(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def new_temp(path: Path) -> tuple[int, Path]:
    """Create a hidden temp file beside `path` for a later os.replace. Unlike mkstemp's 0600,
    it gets the umask's permissions, so a shared cache stays readable by others."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp


def file_digest(path: Path, show: bool | None) -> str:
    """sha256 of `path`: from its marker when still valid, else hashed once (and recorded)."""
    digest = _read_marker(path)
    if digest is None:
        h = hashlib.sha256()
        show = sys.stderr.isatty() if show is None else show
        with open(path, "rb") as f, progress_bar(show, path.stat().st_size, f"verifying {path.name}") as bar:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                bar.update(len(chunk))
        digest = h.hexdigest()
        write_marker(path, digest)
    return digest


def verified(path: Path, m: KnownModel, progress: bool | None) -> bool:
    """Is the cached model file good? A downloaded one must match the pinned digest; one we
    converted (m.convert) is trusted while the marker written after converting still describes
    it (its digest is not pinned: the pinned one is of the zip it came from)."""
    if m.convert is not None:
        return _read_marker(path) is not None
    return matches_pin(path, m, progress)


def matches_pin(path: Path, m: KnownModel, progress: bool | None) -> bool:
    """Does `path` match m's pinned size and sha256? (A wrong size fails without hashing.)"""
    try:
        if path.stat().st_size != m.size:
            return False
    except OSError:
        return False
    return file_digest(path, progress) == m.sha256
