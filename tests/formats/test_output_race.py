"""The quantizer's output is never a file it did not mean to replace: one created at OUT while it
writes (after the up-front check) is kept without force, replaced with it, and either way no
temporary file is left beside it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from tiny_models import write_tiny_llama

from edge_infer.errors import InvalidRequest
from edge_infer.formats import atomic
from edge_infer.formats.atomic import commit, temp_beside
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.quant_policy import parse_target
from edge_infer.formats.requantize import requantize


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("race") / "f32.gguf", n_layers=1)


def create_midway(out: Path) -> object:
    """A progress callback that creates `out` once the writer is under way (someone else's file)."""

    def progress(name: str, n: int) -> None:
        if not out.exists():
            out.write_bytes(b"theirs")

    return progress


def test_an_output_created_while_writing_is_kept_without_force(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.gguf"
    with pytest.raises(InvalidRequest, match=r"out\.gguf: appeared while quantizing and was kept \(use --force"):
        requantize(src, out, parse_target("q8_0"), progress=create_midway(out))  # type: ignore[arg-type]
    assert out.read_bytes() == b"theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["out.gguf"]  # no temporary file left


def test_with_force_it_is_replaced(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.gguf"
    requantize(src, out, parse_target("q8_0"), force=True, progress=create_midway(out))  # type: ignore[arg-type]
    with GGUFFile(out) as f:
        assert f.tensors["blk.0.attn_q.weight"].type.name == "Q8_0"
    assert [p.name for p in tmp_path.iterdir()] == ["out.gguf"]


def test_commit_without_overwrite_never_replaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "d.bin"
    tmp = temp_beside(dest)
    tmp.write_bytes(b"new")
    commit(tmp, dest, overwrite=False)
    assert dest.read_bytes() == b"new" and not tmp.exists()
    tmp = temp_beside(dest)
    tmp.write_bytes(b"newer")
    with pytest.raises(FileExistsError):
        commit(tmp, dest, overwrite=False)
    assert dest.read_bytes() == b"new" and tmp.read_bytes() == b"newer"  # the caller removes tmp

    def no_links(a: object, b: object) -> None:  # a filesystem without hard links
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(atomic.os, "link", no_links)
    with pytest.raises(FileExistsError):
        commit(tmp, dest, overwrite=False)
    assert dest.read_bytes() == b"new"
    dest.unlink()
    commit(tmp, dest, overwrite=False)
    assert dest.read_bytes() == b"newer" and not tmp.exists()
