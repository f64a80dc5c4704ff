"""Writing a file atomically: into a temporary file beside the destination, renamed over it
only when complete, so an interrupted or failed write leaves the destination as it was. Without
`overwrite`, the move is a hard link, which fails rather than replace a file that appeared in
the meantime (the stdlib has no rename-without-replace)."""

from __future__ import annotations

import errno
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


def commit(tmp: Path, dest: Path, overwrite: bool = True) -> None:
    """Flush tmp to disk and move it to dest: over whatever is there when `overwrite`, else only
    while dest does not exist (FileExistsError otherwise, tmp left for the caller to remove)."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    if overwrite:
        os.replace(tmp, dest)
        return
    try:
        os.link(tmp, dest)  # atomic and never replacing: FileExistsError if dest is there
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise
        # A filesystem without hard links: check, then rename (the one window left).
        if os.path.lexists(dest):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dest)) from None
        os.rename(tmp, dest)
        return
    os.unlink(tmp)
