"""The encoders (bert, nomic-bert, jina-bert-v2, modern-bert, gemma-embedding) against llama.cpp on tiny random-weight GGUFs in
llama.cpp's layout (tests/support/bert_models.py): each input's pooled embedding at cosine >=
0.9999 (mean, cls; a rank head's scores within 2e-3), bit-identical alone and batched with
others. Every feature the variants add moves llama.cpp's result far past that tolerance (edited
tensors), or ours when we leave it out (RoPE, ALiBi, the symmetric window, the sliding layers'
rope base, gemma's dense layers), so none can be skipped unnoticed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bert_models import CLS, SEP, EncoderSpec, write_encoder
from gguf_edits import edited, fill
from llama_oracle import LlamaCpp

from edge_infer import LLM
from edge_infer.errors import InvalidRequest, UnsupportedModelError
from edge_infer.models.encoder_config import EncoderConfig

CASES: dict[str, EncoderSpec] = {
    "bert-mean": EncoderSpec(),
    "bert-cls": EncoderSpec(pooling="cls"),
    "bert-rank": EncoderSpec(pooling="rank", rank_head=True),
    "nomic-bert": EncoderSpec(arch="nomic-bert", fused_qkv=True, biases=False, qk_std=0.4),
    "jina-bert-v2": EncoderSpec(arch="jina-bert-v2", qk_norm=True, norm_2=True, qk_std=0.4),
    "jina-bert-v2-geglu": EncoderSpec(arch="jina-bert-v2", geglu=True, qk_std=0.4),
    "modern-bert": EncoderSpec(arch="modern-bert", n_layers=3, qk_std=0.4),
    "modern-bert-rank": EncoderSpec(arch="modern-bert", n_layers=3, pooling="rank", rank_head=True),
    "gemma-embedding": EncoderSpec(arch="gemma-embedding", n_layers=3, n_heads=2, n_kv_heads=1, head_dim=48,
                                   qk_std=0.4, dense=192),  # wider than the FFN (128)
}
POOLING_IDS = {"mean": 1, "cls": 2, "rank": 4}
COS = 0.9999


def inputs(seed: int = 1) -> list[list[int]]:
    """[CLS] ... [SEP] inputs of several lengths over the tiny vocabulary (the last one long)."""
    rng = np.random.default_rng(seed)
    return [[CLS, *(int(t) for t in rng.integers(5, 60, n)), SEP] for n in (1, 7, 18, 45)]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("encoders")


def _path(files: Path, name: str, qtype: str = "F32") -> Path:
    path = files / f"{name}-{qtype}.gguf"
    return path if path.exists() else write_encoder(path, CASES[name], qtype)


def reference(path: Path, spec: EncoderSpec, ids: list[list[int]]) -> list[np.ndarray]:
    """llama.cpp's pooled result per input: an embedding, or a rank head's n_cls_out scores."""
    lc = LlamaCpp(path, 64, pooling=POOLING_IDS[spec.pooling])
    try:
        if spec.pooling != "rank":
            return [lc.embedding(x) for x in ids]
        out = []
        for x in ids:
            lc._decode(x)
            out.append(np.ctypeslib.as_array(lc.lc.llama_get_embeddings_seq(lc.ctx, 0), shape=(spec.n_cls_out,)).copy())
        return out
    finally:
        lc.close()


def ours(llm: LLM, spec: EncoderSpec, ids: list[list[int]]) -> np.ndarray:
    if spec.pooling == "rank":
        return llm.worker.call(lambda e: e.score_pairs(ids))  # type: ignore[union-attr]
    return llm.embed(ids)


def cosines(a: np.ndarray, refs: list[np.ndarray]) -> list[float]:
    return [float(x @ r / np.linalg.norm(x) / np.linalg.norm(r)) for x, r in zip(a, refs, strict=True)]


@pytest.mark.parametrize("name", list(CASES))
def test_matches_llama_cpp(name: str, files: Path) -> None:
    spec, path, ids = CASES[name], _path(files, name), inputs()
    refs = reference(path, spec, ids)
    with LLM(str(path), n_threads=1) as llm:
        assert llm.model_config.arch == spec.arch
        got = ours(llm, spec, ids)
        if spec.pooling == "rank":
            np.testing.assert_allclose(got, np.array(refs)[:, 0], atol=2e-3, err_msg=name)
            assert np.ptp(got) > 0.05  # the scores differ between inputs: a head that ignored them would not
        else:
            assert min(cosines(got, refs)) >= COS, (name, cosines(got, refs))
        # batch invariance: each input alone gives the same bits as the four together
        for i, x in enumerate(ids):
            np.testing.assert_array_equal(ours(llm, spec, [x])[0], got[i], err_msg=f"{name}: input {i} alone")


def test_q8_0_close(files: Path) -> None:
    spec, ids = CASES["bert-mean"], inputs(2)
    path = _path(files, "bert-mean", "Q8_0")
    with LLM(str(path), n_threads=1) as llm:
        assert min(cosines(llm.embed(ids), reference(path, spec, ids))) >= 0.999


# name: tensor edits that neutralise one feature of the file
TENSOR_FEATURES = {
    "bert-mean": {"learned positions": {"position_embd.weight": fill(0.0)},
                  "token type": {"token_types.weight": fill(0.0)},
                  "attention biases": {f"blk.{i}.attn_{x}.bias": fill(0.0) for i in range(2) for x in "qkv"},
                  "FFN biases": {f"blk.{i}.ffn_up.bias": fill(0.0) for i in range(2)},
                  "input norm bias": {"token_embd_norm.bias": fill(0.0)}},
    "bert-rank": {"dense head bias": {"cls.bias": fill(0.0)}},
    "modern-bert-rank": {"head norm": {"cls.norm.weight": fill(3.0)}},
    "gemma-embedding": {"post-norms": {f"blk.{i}.post_{x}_norm.weight": fill(3.0) for i in range(3)
                                       for x in ("attention", "ffw")},
                        "Q/K head norms": {f"blk.{i}.attn_{x}_norm.weight": fill(3.0) for i in range(3) for x in "qk"}},
    # the Q/K LayerNorms' weights scale every score (their biases move little: q.k of unit rows)
    "jina-bert-v2": {"Q/K norms": {f"blk.{i}.attn_{x}_norm.weight": fill(3.0) for i in range(2) for x in "qk"},
                     "second attention norm": {f"blk.{i}.attn_norm_2.bias": fill(0.0) for i in range(2)}},
}


@pytest.mark.parametrize("name,feature", [(n, f) for n, fs in TENSOR_FEATURES.items() for f in fs])
def test_feature_moves_llama_cpp(name: str, feature: str, files: Path) -> None:
    spec, ids = CASES[name], inputs()
    path = _path(files, name)
    changed = edited(path, TENSOR_FEATURES[name][feature], tag=feature.replace(" ", "-").replace("/", ""))
    a, b = reference(path, spec, ids), reference(changed, spec, ids)
    if spec.pooling == "rank":
        assert max(abs(float(x[0] - y[0])) for x, y in zip(a, b, strict=True)) > 2e-2, feature
    else:
        assert min(cosines(np.array(b), a)) < 1 - 10 * (1 - COS), feature


def _no_rope(enc: Any) -> None:
    enc.inv_freqs = [np.zeros_like(f) for f in enc.inv_freqs]


def _no_alibi(enc: Any) -> None:
    enc.slopes = enc.slopes[:0]


def _no_window(enc: Any) -> None:
    enc.cfg = dataclasses.replace(enc.cfg, sliding_window=0)


def _one_rope_base(enc: Any) -> None:
    enc.inv_freqs = [enc.inv_freqs[-1]] * len(enc.inv_freqs)  # the last layer is a full one in both files


def _no_dense(enc: Any) -> None:
    enc.w.dense_2 = enc.w.dense_3 = None


# features with no tensor to edit: ours without them misses llama.cpp
ABLATIONS = [("nomic-bert", _no_rope), ("jina-bert-v2-geglu", _no_alibi), ("modern-bert", _no_window),
             ("modern-bert", _one_rope_base), ("gemma-embedding", _no_window), ("gemma-embedding", _one_rope_base),
             ("gemma-embedding", _no_dense)]


@pytest.mark.parametrize("name,ablate", ABLATIONS, ids=[f"{n}-{f.__name__}" for n, f in ABLATIONS])
def test_ablated_feature_misses_llama_cpp(name: str, ablate: Callable[[Any], None], files: Path) -> None:
    spec, ids = CASES[name], inputs()
    path = _path(files, name)
    refs = reference(path, spec, ids)
    with LLM(str(path), n_threads=1) as llm:
        ablate(llm.worker.engine.encoder)  # type: ignore[union-attr]
        assert min(cosines(llm.embed(ids), refs)) < 1 - 10 * (1 - COS)


def test_encoder_refuses_generation_and_bad_inputs(files: Path) -> None:
    with LLM(str(_path(files, "bert-mean")), n_threads=1) as llm:
        assert isinstance(llm.model_config, EncoderConfig)
        with pytest.raises(InvalidRequest, match="encoder"):
            llm.generate("the cat")
        with pytest.raises(InvalidRequest, match="maximum of 64 tokens"):
            llm.embed([[CLS] + [5] * 70])
        with pytest.raises(InvalidRequest, match="outside the vocabulary"):
            llm.embed([[CLS, 10_000]])
        with pytest.raises(InvalidRequest, match="empty"):
            llm.embed([[]])
    with LLM(str(_path(files, "bert-rank")), n_threads=1) as llm, pytest.raises(InvalidRequest, match="reranker"):
        llm.embed("the cat")


def test_malformed_encoder_refused(files: Path, tmp_path: Path) -> None:
    """A file whose tensors do not fit its variant is refused naming the tensor."""
    bad = write_encoder(tmp_path / "bad.gguf", EncoderSpec(arch="nomic-bert", fused_qkv=True, qk_norm=True))
    with pytest.raises(UnsupportedModelError, match="attn_q_norm"):
        LLM(str(bad), n_threads=1)


def test_rerank_orders_by_score(files: Path) -> None:
    """LLM.rerank: a rank model's pair scores, a mean-pooled model's embedding cosines."""
    with LLM(str(_path(files, "bert-rank")), n_threads=1) as llm:
        docs = ["the cat sat on the mat", "paris is the capital of france", "hello world"]
        scores = llm.rerank("what is the capital of france", docs)
        pairs = [llm.worker.engine.rerank_ids("what is the capital of france", d) for d in docs]  # type: ignore[union-attr]
        # llama.cpp's format_rerank: this vocabulary adds [CLS] and [SEP], no EOS
        assert pairs[0][0] == CLS and pairs[0].count(SEP) == 1 and pairs[0][-1] != SEP
        np.testing.assert_allclose(scores, np.array(reference(llm_path := _path(files, "bert-rank"), CASES["bert-rank"],
                                                               pairs))[:, 0], atol=2e-3, err_msg=str(llm_path))
    with LLM(str(_path(files, "bert-mean")), n_threads=1) as llm:
        scores = llm.rerank("the cat", ["the cat", "paris france"])
        emb = llm.embed(["the cat", "the cat", "paris france"])
        np.testing.assert_allclose(scores, [float(emb[0] @ emb[1]), float(emb[0] @ emb[2])], rtol=1e-6)
        assert scores[0] == pytest.approx(1.0, abs=1e-6)


def test_inspect_names_the_encoder(files: Path) -> None:
    """`edge-infer inspect` shows an encoder's layers (sliding ones marked) and its pooling."""
    from edge_infer.cli.inspect import layers
    from edge_infer.formats.gguf import GGUFFile

    with GGUFFile(_path(files, "modern-bert")) as f:
        r = layers(f)
    assert r["encoder"] == {"pooling": "mean"}
    # modern-bert's pattern of 3 with the full layer first
    assert r["kinds"] == ["bidirectional_attention"] + ["windowed_bidirectional_attention"] * 2


@pytest.mark.parametrize("name", ["bert-mean", "gemma-embedding", "modern-bert-rank"])
def test_scratch_contents_never_leak(name: str, files: Path) -> None:
    """The forward reads only scratch it wrote: with every workspace buffer poisoned with NaN
    first (what reused memory can hold), the same bits come out. gemma-embedding's Dense layers
    make its FFN buffers wider than the FFN."""
    spec, ids = CASES[name], inputs()
    with LLM(str(_path(files, name)), n_threads=1) as llm:
        clean = ours(llm, spec, ids)
        ws = llm.worker.engine.encoder.ws  # type: ignore[union-attr]
        for f in dataclasses.fields(ws):
            buf = getattr(ws, f.name)
            if isinstance(buf, np.ndarray) and buf.dtype.kind == "f":
                buf.fill(np.nan)
        np.testing.assert_array_equal(ours(llm, spec, ids), clean)
