"""`edge-infer serve`'s autoscaling flags: refused with a message naming them where they would
do nothing (no --min-replicas / --max-replicas) or are out of range; taken into ScaleOptions."""

from __future__ import annotations

import argparse

import pytest

from edge_infer.cli.serve import register, scale_options
from edge_infer.errors import InvalidRequest


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(), [])
    return parser.parse_args(["serve", "-m", "x", *flags])


def test_the_plain_server_takes_no_ray_flags() -> None:
    assert scale_options(_args()) is None


@pytest.mark.parametrize("flags", [("--load-window", "5"), ("--replicas", "2", "--target-ongoing", "2"),
                                   ("--min-replicas", "1", "--upscale-delay", "3")])
def test_autoscaling_flags_without_both_bounds_are_refused(flags: tuple[str, ...]) -> None:
    named = [f for f in flags if f in ("--load-window", "--target-ongoing", "--upscale-delay")]
    with pytest.raises(InvalidRequest, match=f"{named[0]}.*--min-replicas and --max-replicas"):
        scale_options(_args(*flags))


def test_autoscaling_flags_reach_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.serve")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # what scale_options sets: undone after
    opts = scale_options(_args("--min-replicas", "1", "--max-replicas", "2", "--load-window", "4",
                               "--downscale-delay", "2"))
    assert (opts.load_window_s, opts.downscale_delay_s, opts.upscale_delay_s, opts.target_ongoing) == (4, 2, 10, 4)
    for bad, said in (("0", "--load-window must be positive"), ("soon", "--load-window must be a number")):
        with pytest.raises(InvalidRequest, match=said):
            scale_options(_args("--min-replicas", "1", "--max-replicas", "2", "--load-window", bad))


def test_the_defaults_in_help_are_scale_options_own() -> None:
    import dataclasses

    from edge_infer.cli.serve import AUTOSCALE_FLAGS
    from edge_infer.cluster.app import ScaleOptions

    defaults = {f.name: f.default for f in dataclasses.fields(ScaleOptions)}
    assert {field: default for _, field, _, default, _ in AUTOSCALE_FLAGS} == {
        field: defaults[field] for _, field, *_ in AUTOSCALE_FLAGS}
