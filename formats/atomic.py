"""Writing a file atomically: into a temporary file beside the destination, renamed over it
only when complete, so an interrupted or failed write leaves the destination as it was."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def temp_beside(dest: Path) -> Path:
    """A new empty file in dest's folder (hidden, `.part`), with the permissions a plain
    `open(dest, "w")` would give (mkstemp's are 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return Path(tmp)


def commit(tmp: Path, dest: Path) -> None:
    """Flush tmp to disk and rename it over dest."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, dest)
