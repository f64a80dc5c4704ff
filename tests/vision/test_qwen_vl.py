"""Qwen2.5-VL (a qwen2.5vl projector beside a qwen2vl text model) against llama.cpp's libmtmd on
tiny random-weight files in llama.cpp's layout (tests/support/tiny_qwen_vl.py): the same pixel
tensors, image embeddings within relative L2 1e-3 (window attention and the 2-D RoPE included:
two of the three sizes span two windows), the same token layout, and the logits after one or
two images within 1e-3 (M-RoPE: an image's tokens at (t, row, column), the text after it at
t + max(rows, columns); libmtmd's own mtmd_helper_eval_chunks places them). Then the engine:
the same image again is a prefix-cache hit, a chunked prefill that cuts the image gives the
same tokens, and a batch gives each prompt its solo output."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
from mtmd_oracle import MtmdOracle
from tiny_qwen_vl import (
    png_bytes,
    test_image,
    write_tiny_qwen_vl,
    write_tiny_qwen_vl_mmproj,
    write_tiny_qwen_vl_text,
)
from tiny_vlm import write_tiny_vlm

from edge_infer import LLM, SamplingParams
from edge_infer.engine.image_prompt import ImageSpan
from edge_infer.engine.mrope import mrope_positions
from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.images.preprocess import preprocess
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.models.vision_config import vision_config_from_gguf
from edge_infer.models.vision_qwen import vision_tower
from edge_infer.models.vision_weights import load_vision_weights

SIZES = ((150, 100), (37, 91), (64, 64))  # 5 x 4 and 2 x 5 token grids span two 112 px windows


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_qwen_vl(tmp_path_factory.mktemp("qwen_vl"))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_mrope_positions_follow_libmtmd() -> None:
    """Text 0..2, a 3 x 2 image at t = 3 (rows 3..4, columns 3..5), text from 3 + 3 = 6, a 1 x 2
    image at t = 8, text from 10; any window of the sequence gives the same rows."""
    tiles = (np.zeros((3, 1, 1), np.float32),)
    spans = [ImageSpan(3, 6, "a" * 64, 0, tiles, (3, 2)), ImageSpan(11, 2, "b" * 64, 0, tiles, (1, 2))]
    got = mrope_positions(spans, 0, 15)
    want = [(0, 0, 0), (1, 1, 1), (2, 2, 2), (3, 3, 3), (3, 3, 4), (3, 3, 5), (3, 4, 3), (3, 4, 4), (3, 4, 5),
            (6, 6, 6), (7, 7, 7), (8, 8, 8), (8, 9, 8), (10, 10, 10), (11, 11, 11)]
    assert got.tolist() == [list(w) for w in want]
    assert np.array_equal(mrope_positions(spans, 5, 7), got[5:12])
    with pytest.raises(ValueError, match="no M-RoPE positions"):
        mrope_positions([ImageSpan(0, 5, "c" * 64, 0, tiles, (2, 2))], 0, 5)


def test_pixels_and_embeddings_match_libmtmd(qwen: tuple[Path, Path]) -> None:
    text, mm = qwen
    f = GGUFFile(mm)
    cfg = vision_config_from_gguf(f)
    backend = CpuBackend(2)
    tower = vision_tower(cfg, load_vision_weights(f, cfg, backend), backend)
    try:
        with MtmdOracle(text, mm, flash_attn=False, n_threads=1) as o:
            for w, h in SIZES:
                img = test_image(w, h, seed=w)
                (chunk,) = [c for c in o.chunks("<__media__>", [img]) if c.kind == "image"]
                (tile,) = preprocess(img, cfg.pixels).tiles
                # the graph reads its input twice (both temporal kernels): two captures of one tensor
                assert all(np.array_equal(p.reshape(tile.shape), tile) for p in MtmdOracle.pixels(chunk)), (w, h)
                (got,) = tower.encode([tile])
                assert got.shape == chunk.embeddings.shape and _rel(got, chunk.embeddings) < 1e-3, (w, h)
    finally:
        tower.close()
        f.close()


@pytest.mark.parametrize("prompt,sizes", [("look: <__media__> what?", ((150, 100),)),
                                          ("a <__media__> b <__media__> c", ((37, 91), (64, 64)))])
def test_layout_and_logits_after_images_match_libmtmd(qwen: tuple[Path, Path], prompt: str,
                                                      sizes: tuple[tuple[int, int], ...]) -> None:
    text, mm = qwen
    imgs = [test_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    with MtmdOracle(text, mm, flash_attn=False, n_threads=1) as o:
        chunks = o.chunks(prompt, imgs)
        want_ids = [t for c in chunks for t in (c.tokens if c.kind == "text" else [None] * c.n_tokens)]
        n_pos = [c.n_pos for c in chunks if c.kind == "image"]
        ref = o.helper_logits_after(prompt, imgs)
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB") as llm:
        p = llm.image_prompt(prompt, imgs)
        inside = {i for s in p.spans for i in range(s.start, s.start + s.length)}
        assert [None if i in inside else t for i, t in enumerate(p.ids)] == want_ids
        assert [max(s.grid) for s in p.spans] == n_pos  # the text position an image advances by
        got = llm.prompt_logits(p)[-1]
    assert np.isfinite(ref).all()
    assert _rel(got, ref) < 1e-3 and got.argmax() == ref.argmax()


def _chat(img: np.ndarray, question: str = "what is it?") -> list:
    url = "data:image/png;base64," + base64.b64encode(png_bytes(img)).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": question}]}]


def test_prefix_hits_chunked_prefill_and_batches(qwen: tuple[Path, Path]) -> None:
    text, mm = qwen
    a, b = test_image(150, 100, seed=1), test_image(90, 120, seed=2)
    params = SamplingParams(max_tokens=8, temperature=0)
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB", block_size=8) as llm:
        solo_a = llm.chat(_chat(a), params)[0].outputs[0].token_ids
        encoded = llm.worker.call(lambda e: e.vision.embeddings.tiles_encoded)
        llm.chat(_chat(a, "and now?"), params)
        assert llm.worker.call(lambda e: e.vision.embeddings.tiles_encoded) == encoded
        (span,) = llm.chat_prompt(_chat(a)).spans  # every full block up to the image's end came from the cache
        assert llm.worker.call(lambda e: e.block_manager.prefix_hits) >= (span.start + span.length) // 8 * 8 > 0
        solo_b = llm.chat(_chat(b), params)[0].outputs[0].token_ids
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB", enable_prefix_caching=False,
             max_num_batched_tokens=16) as small:  # the prompts (about 60 tokens) cut into steps of 16
        both = [o.outputs[0].token_ids for o in small.chat([_chat(a), _chat(b)], params)]
    assert both == [solo_a, solo_b]


def test_a_quantized_projector_stays_near_libmtmd(tmp_path: Path) -> None:
    text, _ = write_tiny_qwen_vl(tmp_path)
    mm = write_tiny_qwen_vl_mmproj(tmp_path / "q8.gguf", linear_type="Q8_0")
    img, prompt = test_image(150, 100), "look: <__media__> ok"
    with MtmdOracle(text, mm, flash_attn=False, n_threads=1) as o:
        ref = o.helper_logits_after(prompt, [img])
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB") as llm:
        got = llm.prompt_logits(llm.image_prompt(prompt, [img]))[-1]
    assert _rel(got, ref) < 1e-2 and got.argmax() == ref.argmax()


def test_a_projector_beside_the_wrong_text_model_is_refused(tmp_path: Path, qwen: tuple[Path, Path]) -> None:
    text, mm = qwen
    other_text, other_mm = write_tiny_vlm(tmp_path, "idefics3")
    with pytest.raises(UnsupportedModelError, match="without M-RoPE: this mmproj belongs to another model"):
        LLM(str(other_text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB")
    with pytest.raises(UnsupportedModelError, match="with M-RoPE: this mmproj belongs to another model"):
        LLM(str(text), mmproj=str(other_mm), n_threads=2, kv_cache_memory="16MiB")


def test_text_alone_matches_llama_cpp_with_and_without_the_projector(qwen: tuple[Path, Path]) -> None:
    """Text tokens' three position components are equal: the kernels' NEOX RoPE without a
    projector, the host rotation with one, both llama.cpp's logits."""
    text, mm = qwen
    prompt = "plain words and no picture at all"
    with MtmdOracle(text, mm, flash_attn=False, n_threads=1) as o:
        ids = [t for c in o.chunks(prompt, []) for t in c.tokens]
        ref = o.helper_logits_after(prompt, [])
    for mmproj in (None, str(mm)):
        with LLM(str(text), mmproj=mmproj, n_threads=2, kv_cache_memory="16MiB") as llm:
            got = llm.prompt_logits(ids)[-1]
        assert _rel(got, ref) < 1e-3 and got.argmax() == ref.argmax(), mmproj


@pytest.mark.parametrize("sections", [(2, 3, 9, 0), (5, -1, 4, 0), (0, 0, 0, 0)])
def test_malformed_rope_sections_are_refused_by_name(tmp_path: Path, sections: tuple[int, ...]) -> None:
    """M-RoPE sections that sum past head_dim / 2, hold a negative count or rotate nothing are
    an UnsupportedModelError naming the key, not a wrong rotation."""
    from gguf import GGUFReader

    path = write_tiny_qwen_vl_text(tmp_path / "text.gguf")
    r = GGUFReader(str(path), "r+")
    field = r.fields["qwen2vl.rope.dimension_sections"]
    for i, s in zip(field.data, sections, strict=True):
        field.parts[i][0] = s
    r.data.flush()
    del r
    with pytest.raises(UnsupportedModelError, match=r"rope.dimension_sections must be 4 counts"):
        LLM(str(path), n_threads=1, kv_cache_memory="16MiB")
