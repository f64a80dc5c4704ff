"""Perplexity: llama-perplexity's windowing rules on a stub model, and `edge-infer perplexity`
on smollm2 against llama.cpp's own logits on the same text and windows."""

from __future__ import annotations

import ctypes
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from llama_oracle import model_params

from edge_infer import cli
from edge_infer.bench.perplexity import PerplexityResult, perplexity, token_nlls
from edge_infer.errors import InvalidRequest

GPL3 = Path("/usr/share/common-licenses/GPL-3")
CTX, CHUNKS = 512, 2


class StubLLM:
    """prompt_logits gives each row a fixed distribution and records the windows it saw."""

    def __init__(self, vocab: int = 8, add_bos: bool = True, max_model_len: int = 4096) -> None:
        self.vocab = vocab
        self.tokenizer = SimpleNamespace(add_bos=add_bos, bos_id=1)
        self.plan = SimpleNamespace(max_model_len=max_model_len)
        self.windows: list[list[int]] = []
        rng = np.random.default_rng(0)
        self.row = rng.normal(size=vocab).astype(np.float32)

    def prompt_logits(self, ids: list[int]) -> np.ndarray:
        self.windows.append(list(ids))
        return np.tile(self.row, (len(ids), 1))


def test_token_nlls_is_minus_log_softmax() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(5, 11)).astype(np.float32) * 4
    targets = [0, 3, 10, 7, 7]
    want = [
        -math.log(math.exp(r[t]) / sum(math.exp(x) for x in r))
        for r, t in zip(logits.astype(float), targets, strict=True)
    ]
    np.testing.assert_allclose(token_nlls(logits, targets), want, rtol=1e-12)


@pytest.mark.parametrize("add_bos", [True, False])
def test_windows_bos_and_scored_half(add_bos: bool) -> None:
    llm = StubLLM(add_bos=add_bos)
    ctx = 8
    tokens = [2 + (i % 6) for i in range(3 * ctx + 5)]  # 3 full windows and a dropped tail
    res = perplexity(llm, tokens, ctx)  # type: ignore[arg-type]
    assert res.chunks == 3 and len(llm.windows) == 3
    for i, w in enumerate(llm.windows):
        want = tokens[i * ctx : (i + 1) * ctx]
        if add_bos:
            want[0] = 1
        assert w == want
    # positions ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1 of each window: 3 per window
    assert res.tokens_scored == 3 * (ctx - ctx // 2 - 1)
    targets = [t for i in range(3) for t in tokens[i * ctx + ctx // 2 + 1 : (i + 1) * ctx]]
    nll = token_nlls(np.tile(llm.row, (len(targets), 1)), targets)
    assert res.ppl == pytest.approx(math.exp(nll.mean()), rel=1e-12)
    sd = math.sqrt(nll.var() / (len(nll) - 1))
    assert res.ppl_std == pytest.approx(res.ppl * sd, rel=1e-9)
    assert len(res.running) == 3 and res.running[-1] == pytest.approx(res.ppl)

    seen: list[tuple[int, float]] = []
    res2 = perplexity(
        StubLLM(add_bos=add_bos), tokens, ctx, n_chunks=2, on_chunk=lambda i, p: seen.append((i, p))
    )  # type: ignore[arg-type]
    assert res2.chunks == 2 and [i for i, _ in seen] == [1, 2]


def test_too_few_tokens_and_bad_arguments() -> None:
    llm = StubLLM(max_model_len=16)
    with pytest.raises(InvalidRequest, match="at least 16 tokens"):
        perplexity(llm, list(range(15)), 8)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="maximum context length of 16"):
        perplexity(llm, [2] * 64, 16)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="n_chunks"):
        perplexity(llm, [2] * 64, 8, n_chunks=0)  # type: ignore[arg-type]


def test_result_without_spread() -> None:
    r = PerplexityResult(ctx=4, chunks=1, tokens_scored=2, nll=2.0, nll2=2.0)
    assert r.ppl == pytest.approx(math.e) and r.ppl_std == 0.0


# -- against llama.cpp -----------------------------------------------------------------------
_SILENT_LOG = None


def llama_cpp_perplexity(model: Path, text: str, ctx: int, n_chunks: int) -> tuple[float, int]:
    """llama-perplexity's computation with llama.cpp's own tokenizer and logits: (ppl, scored)."""
    global _SILENT_LOG
    L = pytest.importorskip("llama_cpp")
    if _SILENT_LOG is None:
        _SILENT_LOG = L.llama_log_callback(lambda level, msg, data: None)
        L.llama_log_set(_SILENT_LOG, ctypes.c_void_p())
    L.llama_backend_init()
    mp = model_params(L)
    lm = L.llama_model_load_from_file(str(model).encode(), mp)
    assert lm, "llama.cpp could not load the model"
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = ctx
    cp.n_threads = cp.n_threads_batch = 2
    lctx = L.llama_init_from_model(lm, cp)
    batch = L.llama_batch_init(ctx, 0, 1)
    try:
        vocab = L.llama_model_get_vocab(lm)
        n_vocab = L.llama_vocab_n_tokens(vocab)
        data = text.encode()
        buf = (L.llama_token * (len(data) + 16))()
        n = L.llama_tokenize(vocab, data, len(data), buf, len(buf), True, False)
        tokens = list(buf[:n])
        add_bos, bos = L.llama_vocab_get_add_bos(vocab), L.llama_vocab_bos(vocab)
        first, nll, count = ctx // 2, 0.0, 0
        for c in range(min(n_chunks, len(tokens) // ctx)):
            window = tokens[c * ctx : (c + 1) * ctx]
            if add_bos:
                window[0] = bos
            L.llama_memory_clear(L.llama_get_memory(lctx), True)
            batch.n_tokens = ctx
            for k, tok in enumerate(window):
                batch.token[k], batch.pos[k], batch.n_seq_id[k] = tok, k, 1
                batch.seq_id[k][0] = 0
                batch.logits[k] = k >= first
            assert L.llama_decode(lctx, batch) == 0
            rows = np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(lctx, i), shape=(n_vocab,))
                             for i in range(first, ctx - 1)])
            v = token_nlls(rows, window[first + 1 :])
            nll += float(v.sum())
            count += len(v)
        return math.exp(nll / count), count
    finally:
        L.llama_batch_free(batch)
        L.llama_free(lctx)
        L.llama_model_free(lm)


@pytest.mark.slow
def test_perplexity_matches_llama_cpp(capsys: pytest.CaptureFixture[str], smollm2_path: Path) -> None:
    if not GPL3.is_file():
        pytest.skip(f"{GPL3} is missing (Debian's common-licenses); no reference text")
    argv = ["perplexity", "-v", "-m", str(smollm2_path), "-f", str(GPL3), "--ctx", str(CTX), "--chunks", str(CHUNKS), "--json"]
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    ours = json.loads(out)
    assert set(ours) == {"model", "ctx", "chunks", "tokens_scored", "ppl", "ppl_std"}
    assert ours["ctx"] == CTX and ours["chunks"] == CHUNKS
    assert ours["tokens_scored"] == CHUNKS * (CTX - CTX // 2 - 1)
    assert 0 < ours["ppl_std"] < ours["ppl"]
    running = re.findall(r"\[(\d+)\]([\d.]+),", err)
    assert [int(i) for i, _ in running] == list(range(1, CHUNKS + 1)), err
    assert float(running[-1][1]) == pytest.approx(ours["ppl"], abs=1e-4)

    ref, scored = llama_cpp_perplexity(smollm2_path, GPL3.read_text(encoding="utf-8"), CTX, CHUNKS)
    assert scored == ours["tokens_scored"]
    print(f"GPL-3, ctx {CTX}, {CHUNKS} chunks: edge-infer PPL {ours['ppl']:.4f}, llama.cpp {ref:.4f}")
    assert ours["ppl"] == pytest.approx(ref, rel=0.02)
