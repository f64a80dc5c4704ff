"""Helpers shared by the CLI tests: run `edge-infer` in-process and check one-line errors."""

from __future__ import annotations

import pytest

from edge_infer import cli


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `edge-infer ARGV` run in this process."""
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    """Exit code 1, exactly one `edge-infer: error:` line naming every needle, no traceback."""
    assert rc == 1
    assert err.startswith("edge-infer: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err


def without_compile_note(err: str) -> str:
    """stderr without the one-time line of a first run that compiles the kernels (a cold JIT
    cache in CI prints it in whichever test loads a model first)."""
    from edge_infer.cli.common import COMPILE_NOTE

    head = COMPILE_NOTE.split("{", 1)[0]
    return "".join(line for line in err.splitlines(keepends=True) if not line.startswith(head))
