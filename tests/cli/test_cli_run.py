"""`edge-infer run` and `edge-infer chat`: streaming on the real default model, -v figures,
prompt sources, one-line errors, and a multi-turn chat driven through stdin."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run, without_compile_note

from edge_infer import cli
from edge_infer.cli.run import read_prompt
from edge_infer.errors import InvalidRequest

PROMPT = "The capital of France is"
GREEDY = ["--temp", "0", "-n", "8"]
RAW = ["--raw", *GREEDY]  # a completion prompt: plain completion


# -- run on the real model -----------------------------------------------------------------
@pytest.mark.slow
def test_run_streams_greedy_text_in_process_and_as_a_process(
    capsys: pytest.CaptureFixture[str], smollm2_path: Path
) -> None:
    rc, out, err = run(capsys, "run", "-m", str(smollm2_path), *RAW, PROMPT)
    assert rc == 0, err
    assert out.startswith(" Paris") and out.endswith("\n")
    assert without_compile_note(err) == ""  # no figures without -v

    cmd = [sys.executable, "-m", "edge_infer.cli", "run", "-v", "-m", str(smollm2_path), *RAW, PROMPT]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    chunks: list[bytes] = []
    while chunk := os.read(proc.stdout.fileno(), 4096):
        chunks.append(chunk)
        time.sleep(0.005)
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, stderr
    # The same greedy text, written token by token (flushed as it came, so read in pieces).
    assert b"".join(chunks).decode() == out
    assert len(chunks) >= 2, chunks
    assert "Traceback" not in stderr
    assert re.search(r"prompt: 5 tokens, time to first token \d+ ms", stderr), stderr
    assert re.search(r"decode: 8 tokens, [\d.]+ tokens/s after the first, finish reason: length", stderr), (
        stderr
    )


@pytest.mark.slow
def test_run_with_speculation_prints_the_plain_greedy_text(
    capsys: pytest.CaptureFixture[str], smollm2_path: Path
) -> None:
    model = ["-m", str(smollm2_path), "-t", "1"]
    prompt = "The cat sat on the mat. The dog sat on the log. The cat sat on the"  # some accepted, some not
    rc, plain, err = run(capsys, "run", *model, *RAW, prompt)
    assert rc == 0, err
    rc, out, err = run(capsys, "run", "-v", *model, "--spec", "ngram", "--spec-k", "3", *RAW, prompt)
    assert rc == 0, err
    assert out == plain
    assert "speculative ngram k 3" in err, err
    assert re.search(
        r"speculative: \d+ of \d+ proposed tokens accepted \(\d+%\), [\d.]+ tokens per step", err
    ), err


def parse_run(*argv: str) -> object:
    return cli.build_parser().parse_args(["run", *argv])


def test_prompt_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "p.txt"
    f.write_text("from a file\n", encoding="utf-8")
    assert read_prompt(parse_run("-f", str(f))) == "from a file\n"
    assert read_prompt(parse_run("-p", "flag")) == "flag"
    assert read_prompt(parse_run("positional")) == "positional"
    monkeypatch.setattr(sys, "stdin", io.StringIO("piped text"))
    assert read_prompt(parse_run("-")) == "piped text"
    monkeypatch.setattr(sys, "stdin", io.StringIO("piped without a dash"))
    assert read_prompt(parse_run()) == "piped without a dash"  # not a TTY: read it
    monkeypatch.setattr(sys, "stdin", io.StringIO("   \n"))
    with pytest.raises(InvalidRequest, match="stdin is empty"):
        read_prompt(parse_run())


# -- errors: one line, exit 1, before any model is loaded -------------------------------------
@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["run", "-f", "/no/such/prompt.txt"], ["/no/such/prompt.txt", "no such file"]),
        (["run", "-p", ""], ["the prompt is empty"]),
        (["run", "   "], ["the prompt is empty"]),
        (["run", "-m", "no-such-model", "hi"], ["unknown model 'no-such-model'"]),
        (["run", "--temp", "abc", "hi"], ["--temp must be a number", "'abc'"]),
        (["run", "--temp", "-1", "hi"], ["--temp must be in"]),
        (["run", "--top-p", "1.5", "hi"], ["--top-p must be in"]),
        (["run", "-n", "0", "hi"], ["-n must be -1"]),
        (["run", "--seed", "x", "hi"], ["--seed must be an integer"]),
        (["run", "-p", "a", "b"], ["give the prompt once"]),
        (["run", "--raw", "--system", "s", "hi"], ["--system and --template are for chat mode", "drop --raw"]),
        (["chat", "--template", "nope"], ["unknown --template 'nope'", "chatml"]),
        (
            ["run", "--spec", "ngram", "--spec-k", "0", "hi"],
            ["--spec-k must be an integer in 1..16 or 'auto'", "'0'"],
        ),
        (["run", "--spec", "ngram", "--spec-k", "many", "hi"], ["--spec-k must be", "'many'"]),
        (["run", "--spec", "draft", "hi"], ["--spec draft needs --draft-model"]),
        (
            ["run", "--spec", "ngram", "--draft-model", "m.gguf", "hi"],
            ["--draft-model is only for --spec draft"],
        ),
        (["run", "--spec-k", "3", "hi"], ["--draft-model and --spec-k need --spec ngram|draft"]),
        (["chat", "--spec", "draft"], ["--spec draft needs --draft-model"]),
        (["perplexity", "-f", "/no/such/text.txt"], ["no such file"]),
        (["perplexity", "-f", "x", "--ctx", "big"], ["--ctx must be an integer"]),
    ],
)
def test_user_mistakes_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], needles: list[str]
) -> None:
    rc, out, err = run(capsys, *argv)
    assert out == ""
    assert_one_line_error(rc, err, *needles)


def test_empty_prompt_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "empty.txt"
    f.write_text("\n")
    rc, _, err = run(capsys, "run", "-f", str(f))
    assert_one_line_error(rc, err, str(f), "is empty")


def test_error_as_a_process_has_no_traceback() -> None:
    cmd = [sys.executable, "-m", "edge_infer.cli", "run", "-m", "no-such-model", "hi"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("edge-infer: error: unknown model") and p.stderr.count("\n") == 1, p.stderr


def test_chat_without_a_template_says_how_to_force_one(
    capsys: pytest.CaptureFixture[str], gemma3_path: Path
) -> None:
    rc, _, err = run(capsys, "chat", "-m", str(gemma3_path))
    assert_one_line_error(rc, err, "has no chat template", "--template chatml")
    rc, _, err = run(capsys, "run", "--chat", "-m", str(gemma3_path), "hi")
    assert_one_line_error(rc, err, "has no chat template")


def test_forced_chatml_template(gemma3_path: Path, smollm2_path: Path) -> None:
    from edge_infer.cli.common import ChatEncoder

    for path in (gemma3_path, smollm2_path):  # without a template, and overriding the model's own
        enc = ChatEncoder.for_model(path, "chatml")
        assert enc.template.name == "builtin chatml template"
        assert "<|im_end|>" in enc.stops
    assert ChatEncoder.for_model(smollm2_path).stops == ()


# -- chat on the real model ------------------------------------------------------------------
@pytest.mark.slow
def test_chat_keeps_history_and_resets(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, smollm2_path: Path
) -> None:
    lines = "Hello\n\nWhat is the capital of France?\n/reset\nHello\n/exit\nnever read\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    rc, out, err = run(capsys, "chat", "-v", "-m", str(smollm2_path), *GREEDY)
    assert rc == 0, err
    assert "Traceback" not in err and "error" not in err
    prompts = [int(n) for n in re.findall(r"prompt: (\d+) tokens", err)]
    assert len(prompts) == 3, err  # the blank line is skipped, nothing after /exit is read
    assert prompts[1] > prompts[0] + 8  # turn 2 carries turn 1 (user + reply) in its prompt
    assert prompts[2] == prompts[0]  # /reset: the same first turn again
    assert "(history cleared)" in err
    replies = out.split("\n")
    assert out.count("\n") >= 3 and any(r.strip() for r in replies)
