"""LoRA adapters (issue #43): llama.cpp's adapter GGUFs over the real models, against llama.cpp
with the same adapter; several adapters and the base in one batch, each row as its solo run;
the prefix cache keyed by adapter; speculation with an adapter; refusals by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_oracle import LlamaCpp, kl_rows
from lora_files import write_lora

from edge_infer import LLM, SamplingParams
from edge_infer.errors import EdgeInferError, InvalidRequest, UnsupportedModelError

GPL3 = Path("/usr/share/common-licenses/GPL-3")  # natural text, as tests/models/test_kv_agreement.py reads
TEXT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lantern and a notebook. "
        "He wrote down the color of the sky, the direction of the wind, and the names of the ships that passed. "
        "Over forty years the notebooks filled three shelves, and when he retired the town library asked for them. "
        "Scientists later used his records to study how storms along the coast had changed over the century, "
        "and a small museum now displays the first notebook beside his brass telescope.")
PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "List three colors:",
           "Water boils at", "My favourite book is", "In 1969, astronauts", "The best way to learn"]


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("lora")
    paths = {"a": write_lora(d / "a.gguf", smollm2_path, rank=8, strength=0.2, seed=0),
             "b": write_lora(d / "b.gguf", smollm2_path, rank=16, strength=0.2, seed=1, dtype="F16",
                             targets=("attn_q", "attn_v", "ffn_down")),
             "c": write_lora(d / "c.gguf", smollm2_path, rank=4, alpha=0.0, strength=0.05, seed=2, dtype="Q8_0")}
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="64MiB",
             adapters={"a": str(paths["a"]), "b": str(paths["b"]), "c": (str(paths["c"]), 0.5)}) as llm:
        yield llm, paths


def _check_against_llama(llm: LLM, model: Path, adapter: Path, name: str) -> None:
    ids = llm.tokenizer.encode(GPL3.read_text()[:3000], add_special=True, parse_special=False)[:256]
    lc = LlamaCpp(model, 256)
    try:
        ref_base = lc.logits(ids)
        refs = {}
        for scale in (1.0, 0.5):
            lc.set_adapters([(adapter, scale)])
            refs[scale] = lc.logits(ids)
    finally:
        lc.close()
    assert kl_rows(refs[1.0], ref_base).mean() > 0.05  # the adapter moves the logits
    for scale, ref in refs.items():
        ours = llm.prompt_logits(ids, adapter=name, adapter_scale=scale)
        kl = kl_rows(ref, ours)
        assert kl.mean() <= 0.01, (scale, kl.mean())
        assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.95, scale
    base = llm.prompt_logits(ids)  # the base in the same LLM, with adapters loaded
    assert kl_rows(ref_base, base).mean() <= 0.01


def test_smollm2_adapter_matches_llama_cpp(smol, smollm2_path) -> None:  # type: ignore[no-untyped-def]
    llm, paths = smol
    _check_against_llama(llm, smollm2_path, paths["a"], "a")


def test_qwen2_adapter_matches_llama_cpp(tmp_path: Path, qwen2_path: Path) -> None:
    path = write_lora(tmp_path / "q.gguf", qwen2_path, rank=16, strength=0.03, seed=3, dtype="F16")
    with LLM(str(qwen2_path), n_threads=2, kv_cache_memory="32MiB") as llm:
        info = llm.load_adapter("q", str(path))
        assert info.ranks == (16,) and info.name == "q"
        _check_against_llama(llm, qwen2_path, path, "q")


def test_mixed_batch_equals_solo_runs(smol) -> None:  # type: ignore[no-untyped-def]
    """8 requests over 3 adapters and the base in one batch: each one's tokens and logprobs are
    its solo run's, and the adapters change what they generate."""
    llm, _ = smol
    names = [None, "a", "b", "c", "a", None, "b", "c"]
    params = SamplingParams(max_tokens=10, temperature=0.0, logprobs=1)
    handles = [llm.worker.submit(p, params, lora=() if n is None else ((n, None),)) for p, n in zip(PROMPTS, names)]
    batched = [llm._wait(h) for h in handles]
    for p, n, out in zip(PROMPTS, names, batched):
        solo = llm.generate(p, params, adapter=n)[0]
        assert solo.token_ids == out.token_ids, (p, n)
        assert solo.outputs[0].cumulative_logprob == out.outputs[0].cumulative_logprob, (p, n)
    base = llm.generate(PROMPTS[1], params)[0].token_ids
    assert any(llm.generate(PROMPTS[1], params, adapter=n)[0].token_ids != base for n in ("a", "b"))


def _hits(llm: LLM) -> int:
    return llm.worker.call(lambda e: e.block_manager.prefix_hits)  # type: ignore[union-attr]


def _first(llm: LLM, ids: list[int], adapter: str | None, scale: float | None = None) -> list[dict[int, float]]:
    """The first 3 greedy tokens' top-5 logprobs (a prompt's cached blocks are reused here)."""
    out = llm.generate(ids, SamplingParams(max_tokens=3, temperature=0.0, logprobs=5), adapter=adapter,
                       adapter_scale=scale)[0]
    return out.outputs[0].logprobs  # type: ignore[return-value]


def test_prefix_cache_never_crosses_adapters(smol) -> None:  # type: ignore[no-untyped-def]
    llm, _ = smol
    ids = llm.tokenizer.encode(TEXT, add_special=True, parse_special=False)
    reset = lambda: llm.worker.call(lambda e: e.block_manager.reset_prefix_cache())  # noqa: E731
    fresh = {}
    for name, scale in (("b", None), ("a", 0.5), (None, None)):
        reset()
        fresh[name, scale] = _first(llm, ids, name, scale)
    reset()
    before = _hits(llm)
    with_a = _first(llm, ids, "a")
    assert _hits(llm) == before
    assert _first(llm, ids, "a") == with_a and _hits(llm) > before  # the same adapter: its blocks are hits
    hits = _hits(llm)
    for (name, scale), want in fresh.items():  # another adapter, another scale, the base: none of a's blocks
        assert _first(llm, ids, name, scale) == want, (name, scale)
        assert want != with_a
    assert _hits(llm) == hits


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_with_an_adapter_is_lossless(smol, smollm2_path, method) -> None:  # type: ignore[no-untyped-def]
    """The n-gram proposer, or a draft model running without the adapter: the output is the
    adapter's plain greedy output."""
    llm, paths = smol
    params = SamplingParams(max_tokens=24, temperature=0.0)
    prompt = "Repeat after me: red green blue, red green blue, red green blue,"
    want = llm.generate(prompt, params, adapter="a")[0].token_ids
    spec = {"method": "ngram", "k": 4} if method == "ngram" else {"method": "draft", "model": str(smollm2_path), "k": 3}
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="32MiB", speculative=spec,
             adapters={"a": str(paths["a"])}) as s:
        assert s.generate(prompt, params, adapter="a")[0].token_ids == want


def test_load_unload_and_refusals(smol, smollm2_path, qwen2_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    llm, paths = smol
    with pytest.raises(InvalidRequest, match=r"no LoRA adapter named 'zz' \(loaded: 'a', 'b', 'c'\)"):
        llm.generate("hi", adapter="zz")
    with pytest.raises(InvalidRequest, match="adapter_scale needs adapter="):
        llm.generate("hi", adapter_scale=0.5)
    with pytest.raises(InvalidRequest, match="the scale of adapter .a. must be a finite number, got nan"):
        llm.generate("hi", adapter="a", adapter_scale=float("nan"))
    with pytest.raises(InvalidRequest, match="named 'a' is loaded already"):
        llm.load_adapter("a", str(paths["a"]))
    wrong_arch = write_lora(tmp_path / "arch.gguf", smollm2_path, arch="qwen2", layers=[0])
    with pytest.raises(UnsupportedModelError, match="made for a 'qwen2' model; this model is 'llama'"):
        llm.load_adapter("w", str(wrong_arch))
    wrong_base = write_lora(tmp_path / "base.gguf", qwen2_path, arch="llama", layers=[0], targets=("attn_q",))
    with pytest.raises(UnsupportedModelError, match=r"'blk.0.attn_q.weight' is \[576, 576\] in the model but the "
                                                    r"adapter's update is \[896, 896\]"):
        llm.load_adapter("w", str(wrong_base))
    missing = write_lora(tmp_path / "miss.gguf", smollm2_path, layers=[0],
                         extra={"blk.99.attn_q.weight.lora_a": ((4, 576), 0.01), "blk.99.attn_q.weight.lora_b": ((576, 4), 0.01)})
    with pytest.raises(UnsupportedModelError, match="'blk.99.attn_q.weight' does not exist in the base model"):
        llm.load_adapter("w", str(missing))
    embd = write_lora(tmp_path / "embd.gguf", smollm2_path, layers=[],
                      extra={"token_embd.weight.lora_a": ((49152, 4), 0.01), "token_embd.weight.lora_b": ((576, 4), 0.01)})
    with pytest.raises(UnsupportedModelError, match="'token_embd.weight': this model ties its output matrix to the token embedding"):
        llm.load_adapter("w", str(embd))
    half = write_lora(tmp_path / "half.gguf", smollm2_path, layers=[], extra={"blk.0.attn_q.weight.lora_a": ((4, 576), 0.01)})
    with pytest.raises(UnsupportedModelError, match="pair of 'blk.0.attn_q.weight' is missing its lora_b"):
        llm.load_adapter("w", str(half))
    with pytest.raises(UnsupportedModelError, match=r"not a LoRA adapter \(general.type is 'model'"):
        llm.load_adapter("w", str(smollm2_path))
    with pytest.raises(EdgeInferError, match=r"nope.gguf: cannot read the LoRA adapter \(No such file or directory\)"):
        llm.load_adapter("w", str(tmp_path / "nope.gguf"))
    assert [a.name for a in llm.adapters()] == ["a", "b", "c"]  # nothing half-loaded
    # unload: refused while a stream uses it, then gone; its slot is reused
    stream = llm.stream("Tell me a long story about", SamplingParams(max_tokens=64, temperature=0.0), adapter="b")
    next(stream)
    with pytest.raises(InvalidRequest, match=r"'b' is in use by 1 running sequence"):
        llm.unload_adapter("b")
    stream.close()
    llm.unload_adapter("b")
    with pytest.raises(InvalidRequest, match="no LoRA adapter named 'b'"):
        llm.generate("hi", adapter="b")
    info = llm.load_adapter("b", str(paths["b"]))
    assert info.id == 1 and [a.name for a in llm.adapters()] == ["a", "b", "c"]
    assert llm.adapters()[2].scale == 0.5


def test_cli_run_with_lora(smol, smollm2_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`edge-infer run --lora FILE` prints the adapter's greedy completion; a bad --lora is one
    error line naming the flag."""
    from cli_helpers import assert_one_line_error, run

    llm, paths = smol
    want = llm.generate("The capital of France is", SamplingParams(max_tokens=8, temperature=0.0), adapter="a")[0].text
    rc, out, _ = run(capsys, "run", "-m", str(smollm2_path), "--raw", "-n", "8", "--temp", "0", "--lora", str(paths["a"]),
                     "The capital of France is")
    assert rc == 0 and out.rstrip("\n") == want
    rc, _, err = run(capsys, "run", "-m", str(smollm2_path), "--raw", "--lora", f"{paths['a']}:abc", "hi")
    assert_one_line_error(rc, err, "--lora", "finite number")


@pytest.mark.parametrize("arch", ["lfm2", "granitehybrid", "qwen35"])
def test_hybrid_adapters_match_llama_cpp(tmp_path: Path, arch: str) -> None:
    """Adapters on every matrix a tiny hybrid's layers multiply by (attention, MLP, LFM2's
    short-convolution projections, Mamba2's in/out projections, Qwen3.5's gated-delta ones),
    against llama.cpp on the same random-weight file."""
    import hybrid_models

    from edge_infer.formats.gguf import GGUFFile

    base = tmp_path / f"{arch}.gguf"
    getattr(hybrid_models, f"write_{arch}")(base)
    skip = ("norm", "conv.weight", "conv1d", "_exps", "gate_inp", "ssm_a", "ssm_d", "ssm_dt")
    with GGUFFile(base) as f:
        targets = sorted({n.split(".", 2)[2].rsplit(".", 1)[0] for n, t in f.tensors.items()
                          if n.startswith("blk.") and len(t.shape) == 2 and not any(s in n for s in skip)})
    adapter = write_lora(tmp_path / "lora.gguf", base, rank=4, strength=0.3, targets=tuple(targets))
    ids = list(range(1, 40))
    with LLM(str(base), n_threads=2, kv_cache_memory="16MiB", adapters={"a": str(adapter)}) as llm:
        ours = llm.prompt_logits(ids, adapter="a")
    lc = LlamaCpp(base, 64)
    try:
        ref_base = lc.logits(ids)
        lc.set_adapters([(adapter, 1.0)])
        ref = lc.logits(ids)
    finally:
        lc.close()
    assert kl_rows(ref, ref_base).mean() > 0.05
    assert kl_rows(ref, ours).mean() < 1e-4


def test_matrices_outside_the_layers_matmuls_are_refused(tmp_path: Path) -> None:
    """gemma3n's per-layer input gate is computed where no LoRA update reaches: refused by name,
    not silently left out."""
    from gemma3n_models import write_gemma3n

    base = tmp_path / "g3n.gguf"
    write_gemma3n(base)
    adapter = write_lora(tmp_path / "lora.gguf", base, rank=4, layers=[0], targets=("attn_q", "inp_gate"))
    with LLM(str(base), n_threads=2, kv_cache_memory="16MiB") as llm:
        with pytest.raises(UnsupportedModelError, match="'blk.0.inp_gate.weight' is computed outside the layers' matmuls"):
            llm.load_adapter("a", str(adapter))
        assert llm.adapters() == []


@pytest.mark.parametrize("arch", ["llama", "qwen2moe"])
def test_embedding_output_and_shared_expert_adapters_match_llama_cpp(tmp_path: Path, arch: str) -> None:
    """A model with its own output matrix: adapters on the token embedding (A [vocab, rank] read
    by rows, as llama.cpp's build_inp_embd), the output matrix and (qwen2moe) the shared expert's
    MLP, two adapters at once, against llama.cpp; a tied model refuses a token_embd adapter."""
    from arch_models import write_arch_model

    from edge_infer.formats.gguf import GGUFFile

    base = tmp_path / f"{arch}.gguf"
    moe = dict(experts=(4, 2, 32), shared_ffn=64) if arch == "qwen2moe" else {}
    write_arch_model(base, arch, **moe)  # type: ignore[arg-type]
    with GGUFFile(base) as f:
        vocab = f.tensors["token_embd.weight"].shape[1]
        shexp = tuple(n.split(".", 2)[2].rsplit(".", 1)[0] for n in f.tensors if n.startswith("blk.0.") and "shexp" in n
                      and len(f.tensors[n].shape) == 2)
    rng = np.random.default_rng(7)
    emb = {"token_embd.weight.lora_a": ((vocab, 4), 1.0), "token_embd.weight.lora_b": ((64, 4), 0.1),
           "output.weight.lora_a": ((4, 64), 0.3), "output.weight.lora_b": ((vocab, 4), 0.1)}
    first = write_lora(tmp_path / "a.gguf", base, rank=4, strength=0.5, targets=("attn_q", "ffn_down") + shexp,
                       extra=emb, seed=1)
    second = write_lora(tmp_path / "b.gguf", base, rank=8, alpha=0.0, strength=0.3, targets=("attn_v",), seed=2)
    ids = [int(t) for t in rng.integers(1, vocab, 40)]
    with LLM(str(base), n_threads=2, kv_cache_memory="16MiB", adapters={"a": str(first), "b": str(second)}) as llm:
        ours = llm.prompt_logits(ids, adapter=["a", "b"], adapter_scale=0.7)
    embedding_only = write_lora(tmp_path / "e.gguf", base, rank=4, layers=[], extra=dict(list(emb.items())[:2]))
    with LLM(str(base), n_threads=2, kv_cache_memory="16MiB", adapters={"e": str(embedding_only)}) as llm:
        ours_e = llm.prompt_logits(ids, adapter="e")
    lc = LlamaCpp(base, 64)
    try:
        ref_base = lc.logits(ids)
        lc.set_adapters([(first, 0.7), (second, 0.7)])
        ref = lc.logits(ids)
        lc.set_adapters([(embedding_only, 1.0)])
        ref_e = lc.logits(ids)
    finally:
        lc.close()
    for theirs, mine in ((ref, ours), (ref_e, ours_e)):  # the embedding's pair alone moves the logits too
        assert kl_rows(theirs, ref_base).mean() > 0.05
        assert kl_rows(theirs, mine).mean() < 1e-4


@pytest.mark.parametrize(("adapters", "message"), [
    ({"a": ("x.gguf", "big")}, "adapter 'a''s scale must be a finite number, got 'big'"),
    ({"a": ("x.gguf", float("inf"))}, "adapter 'a''s scale must be a finite number, got inf"),
    ({"a": 3}, r"adapter 'a' needs the path of its LoRA .gguf \(or \(path, scale\)\), got 3"),
    ({"": "x.gguf"}, "an adapter's name must be a non-empty string"),
    (["x.gguf"], "adapters must be a dict of name -> adapter .gguf path"),
])
def test_bad_adapters_option_is_refused_by_name(adapters: object, message: str) -> None:
    from edge_infer.config import EngineConfig

    with pytest.raises(InvalidRequest, match=message):
        EngineConfig.from_options("smollm2-135m", adapters=adapters)
