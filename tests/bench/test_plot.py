"""Charts of the benchmarks: real PNGs from real result shapes, bad targets refused before any
measuring, no half-written file."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import write_tiny_llama

from edge_infer.bench.baseline import combine_runs, format_drift
from edge_infer.bench.plot import check_plot_path, plot_pp_tg, plot_throughput
from edge_infer.cli import main as cli_main
from edge_infer.errors import InvalidRequest

pytest.importorskip("matplotlib")
PNG = b"\x89PNG\r\n\x1a\n"


def _result(model: str, pp: float, tg: float, base: bool) -> dict:
    res = {"model": model, "threads": 2, "n_prompt": 512, "n_gen": 128, "edge": {"pp_tps": pp, "tg_tps": tg}}
    if base:
        res["llama_cpp"] = {"pp_tps": pp / 2, "tg_tps": tg / 1.5}
    return res


def test_pp_tg_chart_is_a_png(tmp_path: Path) -> None:
    out = plot_pp_tg([_result("a.gguf", 900, 120, True), _result("b", 300, 40, False)], tmp_path / "pp.png")
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 5000
    assert [p.name for p in tmp_path.iterdir()] == ["pp.png"]  # the .part file was renamed


def test_throughput_chart_is_a_png(tmp_path: Path) -> None:
    out = plot_throughput({"continuous": {1: 50.0, 4: 150.0, 16: 400.0}}, {"llama.cpp sequential": 100.0},
                          tmp_path / "t.png", "title", {"static 16": (16, 300.0)})
    assert out.read_bytes()[:8] == PNG


@pytest.mark.parametrize("name, msg", [("chart.svg", "ending in .png"), ("nowhere/chart.png", "does not exist")])
def test_bad_targets_are_refused(tmp_path: Path, name: str, msg: str) -> None:
    with pytest.raises(InvalidRequest, match=msg):
        check_plot_path(tmp_path / name)


def test_cli_bench_refuses_a_bad_plot_path_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["bench", "-m", str(tmp_path / "missing.gguf"), "--plot", str(tmp_path / "x.jpg")])
    err = capsys.readouterr().err
    assert rc == 1 and "ending in .png" in err and "Traceback" not in err


def test_cli_bench_two_models_and_a_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_tiny_llama(tmp_path / "a.gguf", qtype="Q8_0")
    b = write_tiny_llama(tmp_path / "b.gguf", qtype="Q4_0")
    rc = cli_main(["bench", "-m", str(a), str(b), "-t", "1", "-p", "16", "-n", "4", "-r", "1", "--no-llama-cpp",
                   "--plot", str(tmp_path / "c.png")])
    out = capsys.readouterr().out
    assert rc == 0 and out.count("edge-infer ") >= 2 and str(a) in out and str(b) in out
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG


def test_combine_runs_keeps_both_and_the_drift() -> None:
    got = combine_runs({"tokens_per_s": 100.0, "ttft": 1.0}, {"tokens_per_s": 80.0}, ("tokens_per_s",))
    assert got is not None and got["tokens_per_s"] == 90.0 and got["ttft"] == 1.0
    assert got["before"] == {"tokens_per_s": 100.0} and got["drift"] == pytest.approx(-0.2)
    assert format_drift(got, "tokens_per_s") == " (before us 100.0, after us 80.0)"
    failed = {"error": "x"}
    assert combine_runs(failed, None, ("tokens_per_s",)) is failed
    before = {"tokens_per_s": 1.0}
    assert combine_runs(before, failed, ("tokens_per_s",)) is before and format_drift(before, "tokens_per_s") == ""
