"""GGUF files from Hugging Face repositories: `hf:user/repo[:QUANT]` (LLM, serve, run) and
`edge-infer pull user/repo[:QUANT]`, through `huggingface_hub` (the [hub] extra).

The repository's file list picks the file: the .gguf whose name holds QUANT (Q4_K_M when none
is given) as a word, vision projectors (mmproj) left out; a repository with a single model file
needs no QUANT. A model split in shards (`-00001-of-00003.gguf`) is fetched whole and joined
into one GGUF (its tensors in order, the split keys dropped), written beside and renamed, so an
interrupted join leaves nothing half-written. Each file's sha256 is checked against the hub's
LFS record. HF_ENDPOINT (a mirror, or a test's loopback server) is honoured, HF_TOKEN too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from edge_infer.errors import HubError
from edge_infer.hub.cache import drop_marker, file_digest, models_dir

PREFIX = "hf:"
DEFAULT_QUANT = "Q4_K_M"
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


def is_hf(ref: str) -> bool:
    return str(ref).startswith(PREFIX)


def looks_like_repo(ref: str) -> bool:
    """`user/repo` or `user/repo:QUANT` (the pull command's short form)."""
    return _REPO.fullmatch(str(ref).partition(":")[0]) is not None


def parse(ref: str) -> tuple[str, str | None]:
    """(repo id, quant or None) of `hf:user/repo[:QUANT]` (the prefix optional)."""
    repo, _, quant = str(ref).removeprefix(PREFIX).partition(":")
    if _REPO.fullmatch(repo) is None:
        raise HubError(f"{ref!r}: a Hugging Face model is hf:USER/REPO or hf:USER/REPO:QUANT (e.g. "
                       "hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M)")
    return repo, quant or None


def local_path(ref: str) -> Path:
    """Where the model of `ref` lives once pulled (its join, or its single file's link)."""
    repo, quant = parse(ref)
    return models_dir() / "hf" / repo.replace("/", "--") / f"{(quant or DEFAULT_QUANT).upper()}.gguf"


def choose(files: list[str], quant: str | None, repo: str) -> list[str]:
    """The repository files that make the model: one .gguf, or all shards of one split."""
    models = sorted(f for f in files if f.endswith(".gguf") and "mmproj" not in f.rsplit("/", 1)[-1].lower())
    if not models:
        raise HubError(f"hf:{repo} holds no .gguf file")
    want = (quant or DEFAULT_QUANT).upper()
    word = re.compile(rf"(^|[^A-Z0-9]){re.escape(want)}([^A-Z0-9_]|$)")
    picked = [f for f in models if word.search(f.upper())]
    if not picked and quant is None and len({_group(f) for f in models}) == 1:
        picked = models  # the repository's only model
    if not picked:
        have = sorted({q for f in models for q in re.findall(r"(?:I?Q\d\w*|F16|BF16|F32)", f.rsplit("/", 1)[-1].upper())})
        raise HubError(f"hf:{repo} has no {want} file; it has {', '.join(have) or ', '.join(models)}"
                       f" (pick one: hf:{repo}:QUANT)")
    group = _group(picked[0])
    shards = [f for f in picked if _group(f) == group]
    m = _SHARD.match(shards[0])
    if m is not None and len(shards) != int(m.group(3)):
        raise HubError(f"hf:{repo}: {shards[0]} is one of {int(m.group(3))} shards, and {len(shards)} are listed")
    return shards


def _group(name: str) -> str:
    m = _SHARD.match(name)
    return m.group(1) if m else name


def pull_hf(ref: str, *, progress: bool | None = None) -> Path:
    """Fetch `ref`'s model into the cache (once) and return its local .gguf path."""
    out = local_path(ref)
    if out.is_file():
        return out
    repo, quant = parse(ref)
    try:
        from huggingface_hub import HfApi, RepoFile, hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
    except ImportError:
        raise HubError("hf: models need huggingface_hub: pip install 'edge-infer[hub]'") from None
    endpoint = os.environ.get("HF_ENDPOINT") or None
    api = HfApi(endpoint=endpoint)
    try:
        entries = [e for e in api.list_repo_tree(repo, recursive=True) if isinstance(e, RepoFile)]
    except RepositoryNotFoundError:
        raise HubError(f"hf:{repo}: no such repository (or it is private: set HF_TOKEN)") from None
    except HfHubHTTPError as e:
        raise HubError(f"hf:{repo}: the hub's file list failed: {e}") from None
    files = choose([e.path for e in entries], quant, repo)
    sums = {e.path: e.lfs.sha256 for e in entries if e.lfs is not None}
    got = []
    for name in files:
        try:
            path = Path(hf_hub_download(repo, name, endpoint=endpoint, cache_dir=models_dir() / "hf-cache"))
        except HfHubHTTPError as e:
            raise HubError(f"hf:{repo}: downloading {name} failed: {e}") from None
        _check(path, sums.get(name), name, progress)
        got.append(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + f".part{os.getpid()}")
    if len(got) == 1:
        os.symlink(got[0].resolve(), part)
    else:
        from edge_infer.hub.gguf_join import join_shards

        join_shards(got, part)
    os.replace(part, out)
    return out


def _check(path: Path, sha256: str | None, name: str, show: bool | None) -> None:
    if sha256 is None:
        return
    digest = file_digest(path, show)
    if digest != sha256:
        drop_marker(path)
        path.unlink(missing_ok=True)
        raise HubError(f"{name}: sha256 {digest} does not match the hub's {sha256}; removed, pull again")
