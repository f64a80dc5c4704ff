"""Images through a multimodal projector (gemma3, idefics3, lfm2, pixtral), checked against llama.cpp's libmtmd on tiny
random-weight files in llama.cpp's layout (tests/support/tiny_vlm.py; the oracle through
llama-cpp-python's mtmd bindings, tests/support/mtmd_oracle.py): the same pixel tensors for the
same image (odd sizes included), image embeddings within relative L2 1e-3 and the first logits
after the image within 1e-3 (F32 files, the oracle's vision attention in F32), the same token
layout around each image; then the engine: a repeated image is a prefix-cache hit that encodes
nothing, two images in one batch give each its solo output, and the refusals name the problem."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
from mtmd_oracle import MtmdOracle
from tiny_vlm import png_bytes, test_image, write_tiny_mmproj, write_tiny_vlm, write_tiny_vlm_text

from edge_infer import LLM, SamplingParams
from edge_infer.errors import EdgeInferError, InvalidRequest, UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.images.preprocess import preprocess
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.models.vision import VisionTower
from edge_infer.models.vision_config import vision_config_from_gguf
from edge_infer.models.vision_weights import load_vision_weights

PROJECTORS = ("pixtral", "idefics3", "gemma3", "lfm2")  # pixtral first: see test_layout_and_first_logits_match_libmtmd
SIZES = ((150, 100), (64, 64), (37, 91))


@pytest.fixture(scope="module", params=PROJECTORS)
def vlm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    text, mm = write_tiny_vlm(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, text, mm


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _data_url(img: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(img)).decode()


def test_pixels_and_embeddings_match_libmtmd(vlm: tuple[str, Path, Path]) -> None:
    _, text, mm = vlm
    f = GGUFFile(mm)
    cfg = vision_config_from_gguf(f)
    backend = CpuBackend(2)
    tower = VisionTower(cfg, load_vision_weights(f, cfg, backend), backend)
    with MtmdOracle(text, mm, flash_attn=False) as o:
        for w, h in SIZES:
            img = test_image(w, h, seed=w)
            ref = [c for c in o.chunks("<__media__>", [img]) if c.kind == "image"]
            t = preprocess(img, cfg.pixels)
            tiles = list(t.tiles) + ([t.overview] if t.overview is not None else [])
            assert len(tiles) == len(ref), (w, h)
            for tile, chunk in zip(tiles, ref):
                (pix,) = MtmdOracle.pixels(chunk)
                assert np.array_equal(pix.reshape(tile.shape), tile), (w, h)  # the same bytes
            for got, chunk in zip(tower.encode(tiles), ref):
                assert _rel(got, chunk.embeddings) < 1e-3, (w, h)
    f.close()


def test_layout_and_first_logits_match_libmtmd(vlm: tuple[str, Path, Path]) -> None:
    """(In a pytest process that ran the idefics3 or lfm2 comparisons first, libmtmd encodes the
    pixtral image to NaN about half the time, fresh contexts included; not in a plain script.
    The oracle refuses to compare NaN, and pixtral's cases run first.)"""
    _, text, mm = vlm
    img = test_image(150, 100)
    prompt = "look: <__media__> what?"
    with MtmdOracle(text, mm, flash_attn=False, n_threads=1) as o:
        want_ids = [t for c in o.chunks(prompt, [img]) for t in (c.tokens if c.kind == "text" else [None] * c.n_tokens)]
        ref = o.logits_after(prompt, [img])
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB") as llm:
        p = llm.image_prompt(prompt, [img])
        inside = {i for s in p.spans for i in range(s.start, s.start + s.length)}
        assert [None if i in inside else t for i, t in enumerate(p.ids)] == want_ids
        got = llm.prompt_logits(p)[-1]
    assert np.isfinite(ref).all(), "the oracle"
    assert np.isfinite(got).all(), "ours"
    assert _rel(got, ref) < 1e-3 and got.argmax() == ref.argmax()


def test_repeated_image_hits_the_prefix_cache_and_batches_are_invariant(vlm: tuple[str, Path, Path]) -> None:
    _, text, mm = vlm
    a, b = test_image(150, 100, seed=1), test_image(90, 120, seed=2)

    def chat(img: np.ndarray, question: str = "what is it?") -> list:
        return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _data_url(img)}},
                                             {"type": "text", "text": question}]}]

    params = SamplingParams(max_tokens=6, temperature=0)
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB", block_size=8) as llm:
        solo_a = llm.chat(chat(a), params)[0]
        encoded = llm.worker.call(lambda e: e.vision.embeddings.tiles_encoded)
        llm.chat(chat(a, "and now?"), params)
        assert llm.worker.call(lambda e: e.vision.embeddings.tiles_encoded) == encoded  # nothing encoded again
        hits = llm.worker.call(lambda e: e.block_manager.prefix_hits)
        assert hits >= len(llm.chat_prompt(chat(a))) // 2  # the image's blocks came from the cache
        solo_b = llm.chat(chat(b), params)[0]
        both = llm.chat([chat(a), chat(b)], params)
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB", enable_prefix_caching=False) as fresh:
        batch = fresh.chat([chat(a), chat(b)], params)
    for solo, got in ((solo_a, both[0]), (solo_b, both[1]), (solo_a, batch[0]), (solo_b, batch[1])):
        assert got.outputs[0].token_ids == solo.outputs[0].token_ids


def test_lfm2_tiles_a_large_image_as_libmtmd_does(tmp_path: Path) -> None:
    """A 1100x700 image: 3 x 2 tiles of 512 px with their row/column markers, then the thumbnail."""
    text, mm = write_tiny_vlm(tmp_path, "lfm2", patch_size=16, image_size=128, n_layer=1)
    img = test_image(1100, 700, seed=9)
    prompt = "<__media__> what?"
    with MtmdOracle(text, mm, flash_attn=False, n_ctx=4096, n_threads=1) as o:
        chunks = o.chunks(prompt, [img])
        want_ids = [t for c in chunks for t in (c.tokens if c.kind == "text" else [None] * c.n_tokens)]
        ref = o.logits_after(prompt, [img])
    assert sum(c.kind == "image" for c in chunks) == 7
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="64MiB", max_num_batched_tokens=512) as llm:
        p = llm.image_prompt(prompt, [img])
        inside = {i for s in p.spans for i in range(s.start, s.start + s.length)}
        assert [None if i in inside else t for i, t in enumerate(p.ids)] == want_ids
        got = llm.prompt_logits(p)[-1]
    assert _rel(got, ref) < 1e-3


def test_pixtral_patch_merger_matches_libmtmd(tmp_path: Path) -> None:
    """Mistral Small 3.1's projector: RMSNorm, 2 x 2 patches unfolded and merged, then the MLP."""
    text, mm = write_tiny_vlm(tmp_path, "pixtral", patch_merger=True)
    img = test_image(33, 77, seed=4)
    prompt = "look: <__media__> ok"
    with MtmdOracle(text, mm, flash_attn=False, n_threads=1) as o:
        chunks = o.chunks(prompt, [img])
        want_ids = [t for c in chunks for t in (c.tokens if c.kind == "text" else [None] * c.n_tokens)]
        (emb,) = [c.embeddings for c in chunks if c.kind == "image"]
        ref = o.logits_after(prompt, [img])
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB") as llm:
        p = llm.image_prompt(prompt, [img])
        inside = {i for s in p.spans for i in range(s.start, s.start + s.length)}
        assert [None if i in inside else t for i, t in enumerate(p.ids)] == want_ids
        (got_emb,) = llm.worker.call(lambda e: e.vision.tower.encode(list(p.spans[0].tiles)))
        got = llm.prompt_logits(p)[-1]
    assert _rel(got_emb, emb) < 1e-3 and _rel(got, ref) < 1e-3


def test_a_quantized_projector_encodes_when_a_step_needs_it(tmp_path: Path) -> None:
    """Q8_0 matrices run on the int8 kernels; the image is encoded when the step needs it (on the
    engine thread), not when the prompt is made; its logits stay near libmtmd's (both quantize
    the activations to 8 bits, each its own way: 1e-2, not 1e-3)."""
    mm = write_tiny_mmproj(tmp_path / "mm.gguf", "idefics3", linear_type="Q8_0", n_embd=64, n_ff=128)
    text = write_tiny_vlm_text(tmp_path / "t.gguf", "idefics3")
    img, prompt = test_image(150, 100), "look: <__media__> ok"
    with MtmdOracle(text, mm, flash_attn=False, n_threads=1) as o:
        ref = o.logits_after(prompt, [img])
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB") as llm:
        p = llm.image_prompt(prompt, [img])
        assert llm.worker.call(lambda e: e.vision.embeddings.tiles_encoded) == 0
        got = llm.prompt_logits(p)[-1]
        assert llm.worker.call(lambda e: e.vision.embeddings.tiles_encoded) == len(p.spans)
    assert _rel(got, ref) < 1e-2 and got.argmax() == ref.argmax()


def _unsupported_projector(path: Path) -> Path:
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "clip")
    w.add_string("general.type", "mmproj")
    w.add_string("clip.projector_type", "qwen2vl_merger")
    w.add_bool("clip.has_vision_encoder", True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_refusals_name_the_problem(tmp_path: Path) -> None:
    text, mm = write_tiny_vlm(tmp_path / "i", "idefics3")
    img = test_image(40, 30)
    with pytest.raises(UnsupportedModelError, match="projector type 'qwen2vl_merger' is not supported"):
        LLM(str(text), mmproj=str(_unsupported_projector(tmp_path / "q.gguf")), n_threads=2, kv_cache_memory="16MiB")
    narrow = write_tiny_vlm_text(tmp_path / "narrow.gguf", "idefics3", d_model=32, n_heads=2, n_kv_heads=1)
    with pytest.raises(UnsupportedModelError, match="this mmproj belongs to another model"):
        LLM(str(narrow), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB")
    with pytest.raises(InvalidRequest, match="is a multimodal projector"):
        LLM(str(mm), n_threads=2)
    with LLM(str(text), n_threads=2, kv_cache_memory="16MiB") as plain:
        with pytest.raises(InvalidRequest, match="takes no images"):
            plain.chat([{"role": "user", "content": [{"type": "image", "image": img}]}])
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB") as llm:
        for bad, words in (("data:image/png;base64,@@@", "not valid base64"),
                           ("data:text/plain;base64,aGk=", "must hold an image"),
                           ("data:image/png;base64," + base64.b64encode(b"not a png").decode(), "not an image"),
                           ("ftp://example.com/a.png", "unsupported URL scheme")):
            with pytest.raises(EdgeInferError, match=words):
                llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": bad}}]}])
        with pytest.raises(InvalidRequest, match="1 image markers"):
            llm.image_prompt("<__media__>", [img, img])
        p = tmp_path / "pic.png"
        p.write_bytes(png_bytes(img))  # a local file in the offline API
        out = llm.chat([{"role": "user", "content": [{"type": "image", "image": str(p)}, {"type": "text", "text": "hi"}]}],
                       SamplingParams(max_tokens=2, temperature=0))
        assert len(out[0].outputs[0].token_ids) == 2


def test_cli_run_with_an_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli_helpers import assert_one_line_error, run

    text, mm = write_tiny_vlm(tmp_path, "idefics3")
    pic = tmp_path / "pic.png"
    pic.write_bytes(png_bytes(test_image(60, 40)))
    rc, out, err = run(capsys, "run", "-m", str(text), "--mmproj", str(mm), "--image", str(pic), "-n", "4",
                       "--temp", "0", "-t", "2", "what is it?")
    assert rc == 0, err
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB") as llm:
        msgs = [{"role": "user", "content": [{"type": "image", "image": str(pic)}, {"type": "text", "text": "what is it?"}]}]
        want = llm.chat(msgs, SamplingParams(max_tokens=4, temperature=0))[0].outputs[0].text
    assert out.rstrip("\n") == want.rstrip("\n")
    rc, _, err = run(capsys, "run", "-m", str(text), "--image", str(pic), "hi")
    assert_one_line_error(rc, err, "--image needs --mmproj")
