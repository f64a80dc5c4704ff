"""Resumable streaming download of one file over http(s), with urllib only.

Bytes go to `<dest>.part`; `<dest>.part.json` records the URL and the server's validator
(strong ETag or Last-Modified). A later attempt resumes with `Range` + `If-Range` only for
the same URL, so a changed file on the server comes back as a 200 and we start over.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from edge_infer._version import __version__
from edge_infer.errors import HubError
from edge_infer.hub.cache import CHUNK, progress_bar

log = logging.getLogger("edge_infer.download")  # the name its messages have always carried

ATTEMPTS = 3  # a dropped connection is resumed this many times before we give up
RETRY_DELAY = 1.0  # seconds, times the attempt number
TIMEOUT = 30.0  # seconds without a byte before the socket gives up


class _Interrupted(Exception):
    """The transfer stopped before the end; the .part file is kept for the next attempt."""


def download(url: str, dest: Path, sha256: str | None, *, show: bool) -> str:
    """Fetch `url` into `dest` (atomically, via `<dest>.part`); return the sha256 hex digest.

    With `sha256`, a mismatch deletes the download and raises HubError naming both digests.
    """
    part = dest.with_name(dest.name + ".part")
    meta = dest.with_name(dest.name + ".part.json")
    try:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                digest = _attempt(url, part, meta, show)
                break
            except _Interrupted as e:
                if attempt == ATTEMPTS:
                    raise HubError(
                        f"downloading {url} was interrupted {ATTEMPTS} times (last: {e}); the partial "
                        f"file {part} was kept: run the same pull again to resume"
                    ) from None
                log.warning("download of %s interrupted (%s); resuming", url, e)
                time.sleep(RETRY_DELAY * attempt)
        if sha256 is not None and digest != sha256:
            part.unlink(missing_ok=True)
            meta.unlink(missing_ok=True)
            raise HubError(
                f"{dest}: sha256 mismatch for {url}: expected {sha256}, got {digest}; the download was deleted"
            )
        os.replace(part, dest)
        meta.unlink(missing_ok=True)
    except OSError as e:  # network errors were mapped inside: this is the local disk
        raise HubError(f"{part}: cannot write the download ({e.strerror or e})") from None
    return digest


def _attempt(url: str, part: Path, meta_path: Path, show: bool) -> str:
    """One request: resume `part` if it belongs to `url`, else start over. Returns the digest."""
    meta = _read_meta(meta_path)
    have = part.stat().st_size if part.exists() and meta.get("url") == url else 0
    headers = {"User-Agent": f"edge-infer/{__version__}"}
    if have:
        headers["Range"] = f"bytes={have}-"
        if meta.get("validator"):
            headers["If-Range"] = meta["validator"]
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and have:
            if _range_total(e.headers.get("Content-Range", "")) == have:
                return _hash_into(part, hashlib.sha256()).hexdigest()  # whole: we stopped before the rename
            part.unlink()
            raise _Interrupted("the server refused to resume; starting over") from None
        raise HubError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        host = urlsplit(url).netloc
        reason = getattr(e.reason, "strerror", None) or e.reason
        raise HubError(
            f"cannot reach {host} ({reason}): no network? pass the path of a local .gguf file instead"
        ) from None
    except (http.client.HTTPException, OSError) as e:  # dropped before the headers arrived
        raise _Interrupted(f"{type(e).__name__}: {e}") from None

    with resp:
        start = _range_start(resp.headers.get("Content-Range", ""))
        if have and resp.status == 206 and start == have:
            mode, h = "ab", _hash_into(part, hashlib.sha256())
        else:
            if have:
                log.info("%s: the server sent the whole file instead of a range; starting over", url)
            have, mode, h = 0, "wb", hashlib.sha256()
            _write_meta(meta_path, url, resp.headers)
        length = resp.headers.get("Content-Length", "")
        total = have + int(length) if length.isdigit() else None
        got = have
        with (
            open(part, mode) as f,
            progress_bar(show, total, part.name[: -len(".part")], initial=have) as bar,
        ):
            while True:
                try:
                    chunk = resp.read(CHUNK)
                except (http.client.HTTPException, OSError) as e:
                    raise _Interrupted(f"after {got} bytes: {type(e).__name__}: {e}") from None
                if not chunk:
                    break
                f.write(chunk)
                h.update(chunk)
                bar.update(len(chunk))
                got += len(chunk)
    # http.client returns b"" (not IncompleteRead) when the peer closes early: compare sizes.
    if total is not None and got != total:
        raise _Interrupted(f"connection closed after {got} of {total} bytes")
    return h.hexdigest()


def _hash_into(path: Path, h: Any) -> Any:
    """Feed the bytes of `path` into the hash object `h`; return `h`."""
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h


def _range_start(content_range: str) -> int | None:
    m = re.fullmatch(r"bytes (\d+)-\d+/(?:\d+|\*)", content_range.strip())
    return int(m.group(1)) if m else None


def _range_total(content_range: str) -> int | None:
    m = re.fullmatch(r"bytes (?:\*|\d+-\d+)/(\d+)", content_range.strip())
    return int(m.group(1)) if m else None


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        v = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


def _write_meta(path: Path, url: str, headers: Message) -> None:
    etag = headers.get("ETag") or ""
    # If-Range needs a strong validator; a weak ETag would make every resume restart.
    validator = etag if etag and not etag.startswith("W/") else headers.get("Last-Modified")
    path.write_text(json.dumps({"url": url, "validator": validator}))
