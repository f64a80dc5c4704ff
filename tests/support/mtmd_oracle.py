"""llama.cpp's libmtmd (llama-cpp-python's llama_cpp.mtmd_cpp) as an oracle for the image
pipeline: mtmd's chunk layout (text ids around the image chunks), each image chunk's projected
embeddings, the preprocessed pixels the vision encoder saw, and the text model's logits after
the chunks. Run `python tests/support/mtmd_oracle.py` for a demo on the tiny_vlm models.

Pixels: mtmd_input_chunk_save serializes only the chunk's metadata (tile sizes, no pixel
data), so they are captured instead with a ggml eval callback on the vision graph: the input
of the node that reads the "inp_raw" tensor (the patch-embedding im2col), [3, H, W] planes."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

GGML_MAX_SRC = 10
_ERRORS: list[str] = []  # mtmd's error log lines (llama-cpp-python's own logger drops ERROR, now level 4)
_LOG_CB: Any = None


def _mtmd_errors_only(lc: Any, mtmd: Any) -> None:
    """Route libmtmd's log (clip and helpers) to _ERRORS, errors only (ggml: 4 ERROR, 5 CONT)."""
    global _LOG_CB
    if _LOG_CB is None:
        last = [0]

        def log(level: int, text: bytes, _user: int) -> None:
            last[0] = last[0] if level == 5 else level
            if last[0] == 4:
                _ERRORS.append(text.decode(errors="replace"))

        _LOG_CB = lc.llama_log_callback(log)
    mtmd.mtmd_helper_log_set(_LOG_CB, None)  # sets mtmd_log_set too


_IN_CHILD = "EDGE_INFER_MTMD_CHILD"
_CHILD = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from mtmd_oracle import MtmdOracle
mode, text, mm, opts, prompt, images, out = sys.argv[2:9]
with np.load(images) as z:
    imgs = [z[f"arr_{i}"] for i in range(len(z.files))]
with MtmdOracle(text, mm, capture=False, **json.loads(opts)) as o:
    if mode == "logits":
        np.savez(out, o.logits_after(prompt, imgs))
    else:
        np.savez(out, *[c.embeddings for c in o.chunks(prompt, imgs) if c.kind == "image"])
"""


def _in_child(mode: str, args: tuple[str, str, dict[str, Any]], prompt: str, images: list[np.ndarray]) -> list[np.ndarray]:
    """MtmdOracle(*args)'s logits_after (mode "logits": one array) or its image chunks'
    embeddings (mode "embeddings") for prompt and images, in a fresh Python process."""
    import json
    import subprocess
    import sys
    import tempfile

    text, mm, opts = args
    with tempfile.TemporaryDirectory() as tmp:
        imgs, out = os.path.join(tmp, "images.npz"), os.path.join(tmp, "out.npz")
        np.savez(imgs, *images)
        r = subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).parent), mode, text, mm, json.dumps(opts),
                            prompt, imgs, out], capture_output=True, text=True, timeout=600,
                           env={**os.environ, _IN_CHILD: "1"})
        if r.returncode != 0:
            raise _fail(f"libmtmd in a fresh process failed: {r.stderr[-2000:]}")
        with np.load(out) as z:
            return [z[f"arr_{i}"] for i in range(len(z.files))]


def _fail(message: str) -> AssertionError:
    """An AssertionError with mtmd's logged errors since the last one."""
    errors = "".join(_ERRORS).strip()
    _ERRORS.clear()
    return AssertionError(f"{message}: {errors}" if errors else message)


class _GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of the ggml llama-cpp-python 0.3.36 ships (ggml.h)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * GGML_MAX_SRC), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


@dataclass
class Chunk:
    """One mtmd input chunk: kind "text" (tokens) or "image" (n_tokens embeddings
    [n_tokens, n_embd_text] taking n_pos positions; pixels: the encoder's [3, H, W] inputs)."""

    kind: str
    tokens: list[int] = field(default_factory=list)
    n_tokens: int = 0
    n_pos: int = 0
    id: str = ""
    embeddings: np.ndarray | None = None
    pixels: list[np.ndarray] = field(default_factory=list)


class MtmdOracle:
    """A text model (llama-cpp-python's low-level API) and its mmproj in libmtmd, on the CPU.
    flash_attn sets both mtmd's and the text context's flash_attn_type (None: their default,
    AUTO); image_min_tokens / image_max_tokens: mtmd's token limits for dynamic-size projectors;
    capture: read the pixel planes through an eval callback (off for timings: the callback makes
    the scheduler stop at every node)."""

    def __init__(self, text_gguf: str | Path, mmproj_gguf: str | Path, *, flash_attn: bool | None = None,
                 n_ctx: int = 2048, n_threads: int = 2, image_min_tokens: int = -1,
                 image_max_tokens: int = -1, capture: bool = True) -> None:
        lc = pytest.importorskip("llama_cpp")
        mtmd = pytest.importorskip("llama_cpp.mtmd_cpp")
        from llama_cpp._logger import set_verbose
        from llama_oracle import model_params

        set_verbose(False)
        _mtmd_errors_only(lc, mtmd)
        lc.llama_backend_init()
        self.lc, self.mtmd, self.n_ctx, self.n_threads, self.flash_attn = lc, mtmd, n_ctx, n_threads, flash_attn
        # what a fresh process needs to open the same oracle (logits_after's last resort)
        self._args = (str(text_gguf), str(mmproj_gguf), {"flash_attn": flash_attn, "n_ctx": n_ctx, "n_threads": n_threads,
                      "image_min_tokens": image_min_tokens, "image_max_tokens": image_max_tokens})
        self.mctx: Any = None
        self.nan_retries = 0
        self.model = lc.llama_model_load_from_file(str(text_gguf).encode(), model_params(lc))
        assert self.model, f"llama.cpp could not load {text_gguf}"
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.n_embd = lc.llama_model_n_embd_inp(self.model)

        ggml = ctypes.CDLL(os.path.join(os.path.dirname(lc.__file__), "lib", "libggml-base.so"))
        ggml.ggml_op_desc.restype, ggml.ggml_op_desc.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        ggml.ggml_tensor_overhead.restype = ctypes.c_size_t
        assert ggml.ggml_tensor_overhead() == ctypes.sizeof(_GgmlTensor) + 32, "ggml_tensor layout changed"
        self._ggml = ggml
        self.ops: set[str] = set()  # ops of the vision graphs run since the last chunks()
        self._pixels: list[np.ndarray] | None = None  # capturing while not None
        self._cb = lc.ggml_backend_sched_eval_callback(self._on_eval)  # kept alive with self

        p = mtmd.mtmd_context_params_default()
        p.use_gpu, p.print_timings, p.n_threads = False, False, n_threads
        if flash_attn is not None:
            p.flash_attn_type = int(flash_attn)  # LLAMA_FLASH_ATTN_TYPE_DISABLED 0 / ENABLED 1
        p.image_min_tokens, p.image_max_tokens = image_min_tokens, image_max_tokens
        if capture:
            p.cb_eval = self._cb
        self._mparams, self._mmproj = p, str(mmproj_gguf).encode()
        self._open_mtmd()
        self.non_causal = bool(mtmd.mtmd_decode_use_non_causal(self.mctx, None))
        self.marker = mtmd.mtmd_default_marker().decode()

    def _open_mtmd(self) -> None:
        if self.mctx:
            self.mtmd.mtmd_free(self.mctx)
        self.mctx = self.mtmd.mtmd_init_from_file(self._mmproj, self.model, self._mparams)
        if not self.mctx:
            self.close()
            raise _fail(f"libmtmd could not load {self._mmproj.decode()}")

    # eval callback: `ask` for every node; the nodes reading inp_raw are computed and read back
    def _on_eval(self, t: int, ask: bool, _user: int) -> bool:
        raw = [r for s in _GgmlTensor.from_address(t).src if s and (r := _GgmlTensor.from_address(s)).name == b"inp_raw"]
        if ask:
            self.ops.add(self._ggml.ggml_op_desc(t).decode())
            return self._pixels is not None and bool(raw)
        pixels = self._pixels if self._pixels is not None else []
        for r in raw:
            nx, ny, nc, nb = (int(v) for v in r.ne)  # ggml ne: [W, H, 3, batch] -> numpy [batch, 3, H, W]
            ptr = ctypes.cast(r.data, ctypes.POINTER(ctypes.c_float))
            pixels.extend(np.ctypeslib.as_array(ptr, shape=(nb, nc, ny, nx)).copy())
        return True

    @property
    def flash_attn_used(self) -> bool:
        """Whether the vision graphs run since the last chunks() used FLASH_ATTN_EXT."""
        return "FLASH_ATTN_EXT" in self.ops

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """llama.cpp's tokenization of `text` with the text model's vocabulary."""
        data = text.encode()
        buf = (self.lc.llama_token * (len(data) + 8))()
        n = self.lc.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, parse_special)
        assert n >= 0, "tokenize failed"
        return list(buf[:n])

    def piece(self, token: int) -> str:
        """The text of one token (special tokens as written)."""
        buf = ctypes.create_string_buffer(256)
        n = self.lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n].decode(errors="replace")

    def _tokenize(self, prompt: str, images: list[np.ndarray]) -> Any:
        """mtmd_tokenize (add_special, parse_special) -> an mtmd_input_chunks pointer to free."""
        m = self.mtmd
        assert prompt.count(self.marker) == len(images), f"need one {self.marker} per image"
        imgs = [np.ascontiguousarray(im, dtype=np.uint8) for im in images]
        for im in imgs:
            assert im.ndim == 3 and im.shape[2] == 3, "images are uint8 [H, W, 3] RGB"
        bitmaps = [m.mtmd_bitmap_init(im.shape[1], im.shape[0], im.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
                   for im in imgs]
        data = prompt.encode()
        text = m.mtmd_input_text(data, len(data), True, True)
        chunks = m.mtmd_input_chunks_init()
        try:
            rc = m.mtmd_tokenize(self.mctx, chunks, ctypes.byref(text), (ctypes.c_void_p * len(bitmaps))(*bitmaps),
                                 len(bitmaps))
        finally:
            for b in bitmaps:
                m.mtmd_bitmap_free(b)
        if rc != 0:
            m.mtmd_input_chunks_free(chunks)
            raise _fail(f"mtmd_tokenize failed ({rc})")
        return chunks

    def chunks(self, prompt: str, images: list[np.ndarray]) -> list[Chunk]:
        """The prompt's chunks; every image chunk encoded (mtmd_encode_chunk), its embeddings
        and the pixel planes its encoder saw copied out. An image encoded to NaN (logits_after
        says when) is encoded again in a fresh context, up to four tries, then its embeddings
        come from a fresh process (its pixels stay this process's)."""
        for _ in range(4):
            out = self._chunks_once(prompt, images)
            if all(c.embeddings is None or np.isfinite(c.embeddings).all() for c in out):
                return out
            self.nan_retries += 1
            self._open_mtmd()
        if not os.environ.get(_IN_CHILD):
            embs = list(_in_child("embeddings", self._args, prompt, images))
            out = [replace(c, embeddings=embs.pop(0)) if c.kind == "image" else c for c in out]
        return out

    def _chunks_once(self, prompt: str, images: list[np.ndarray]) -> list[Chunk]:
        m, out = self.mtmd, []
        handle = self._tokenize(prompt, images)
        self.ops.clear()
        try:
            for i in range(m.mtmd_input_chunks_size(handle)):
                ch = m.mtmd_input_chunks_get(handle, i)
                if m.mtmd_input_chunk_get_type(ch) == 0:  # MTMD_INPUT_CHUNK_TYPE_TEXT
                    n = ctypes.c_size_t()
                    ptr = m.mtmd_input_chunk_get_tokens_text(ch, ctypes.byref(n))
                    out.append(Chunk("text", [int(t) for t in ptr[: n.value]], n.value, n.value))
                    continue
                n_tok = m.mtmd_input_chunk_get_n_tokens(ch)
                self._pixels = []
                try:
                    if m.mtmd_encode_chunk(self.mctx, ch) != 0:
                        raise _fail("mtmd_encode_chunk failed")
                    pixels = self._pixels
                finally:
                    self._pixels = None
                embd = np.ctypeslib.as_array(m.mtmd_get_output_embd(self.mctx), shape=(n_tok, self.n_embd)).copy()
                cid = m.mtmd_input_chunk_get_id(ch)
                out.append(Chunk("image", [], n_tok, m.mtmd_input_chunk_get_n_pos(ch),
                                 (cid or b"").decode(), embd, pixels))
        finally:
            m.mtmd_input_chunks_free(handle)
        return out

    @staticmethod
    def pixels(chunk: Chunk) -> list[np.ndarray]:
        """The float32 [3, H, W] planes (normalized RGB) the vision encoder took for this image
        chunk: one per encoder input (one tile or overview per chunk)."""
        assert chunk.kind == "image", "pixels of an image chunk"
        return chunk.pixels

    def _context(self) -> Any:
        lc = self.lc
        cp = lc.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = self.n_ctx
        cp.n_threads = cp.n_threads_batch = self.n_threads
        if self.flash_attn is not None:
            cp.flash_attn_type = int(self.flash_attn)
        ctx = lc.llama_init_from_model(self.model, cp)
        assert ctx, "llama.cpp could not create a context"
        return ctx

    def _eval(self, chunks: list[Chunk], every: bool) -> list[np.ndarray]:
        """Decode the chunks in a fresh context (an image chunk in one batch, non-causal where
        mtmd says so); per chunk its rows' logits (every) or only the last chunk's last row."""
        lc, pos, out = self.lc, 0, []
        ctx = self._context()
        try:
            for k, ch in enumerate(chunks):
                n, image = ch.n_tokens, ch.kind == "image"
                rows = list(range(n)) if every else [n - 1] if k == len(chunks) - 1 else []
                b = lc.llama_batch_init(n, self.n_embd if image else 0, 1)
                try:
                    for i in range(n):
                        b.pos[i], b.n_seq_id[i], b.logits[i] = pos + i, 1, i in rows
                        b.seq_id[i][0] = 0
                        if not image:
                            b.token[i] = ch.tokens[i]
                    if image:
                        assert ch.embeddings is not None
                        emb = np.ascontiguousarray(ch.embeddings, dtype=np.float32)
                        ctypes.memmove(b.embd, emb.ctypes.data, emb.nbytes)
                    b.n_tokens = n
                    lc.llama_set_causal_attn(ctx, not (image and self.non_causal))
                    assert lc.llama_decode(ctx, b) == 0, "llama_decode failed"
                    lc.llama_set_causal_attn(ctx, True)
                finally:
                    lc.llama_batch_free(b)
                out.append(np.array([np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(self.n_vocab,))
                                     for i in rows], np.float32).reshape(len(rows), self.n_vocab))
                pos += ch.n_pos
        finally:
            lc.llama_free(ctx)
        return out

    def logits_after(self, prompt: str, images: list[np.ndarray]) -> np.ndarray:
        """float32 [n_vocab]: the logits at the last position after all the chunks. libmtmd
        here now and then encodes every image to NaN in a context opened in a process that ran
        other projectors before (pixtral after idefics3 or lfm2, about one run in three): the
        context is opened again (`self.nan_retries` counts it), and after four such tries a
        fresh process computes them (a CI run saw four in a row); a NaN is never compared."""
        for _ in range(4):
            chunks = self._chunks_once(prompt, images)
            if all(c.embeddings is None or np.isfinite(c.embeddings).all() for c in chunks):
                out = self._eval(chunks, every=False)[-1][-1]
                if np.isfinite(out).all():
                    return out
            self.nan_retries += 1
            self._open_mtmd()  # the NaN stays with the context: a fresh one
        bad = [c.kind for c in chunks if c.embeddings is not None and not np.isfinite(c.embeddings).all()]
        if not os.environ.get(_IN_CHILD):
            (out,) = _in_child("logits", self._args, prompt, images)
            if np.isfinite(out).all():
                return out
        raise _fail(f"libmtmd gave non-finite embeddings or logits four times (non-finite embeddings: {bad}), "
                    "and in a fresh process")

    def all_logits(self, prompt: str, images: list[np.ndarray]) -> list[np.ndarray]:
        """Per chunk, float32 [n_tokens, n_vocab]: the logits at every position (text and image)."""
        return self._eval(self.chunks(prompt, images), every=True)

    def helper_logits_after(self, prompt: str, images: list[np.ndarray]) -> np.ndarray:
        """logits_after through mtmd's own mtmd_helper_eval_chunks (encodes again)."""
        lc, m = self.lc, self.mtmd
        handle, ctx = self._tokenize(prompt, images), self._context()
        try:
            n_past = lc.llama_pos(0)
            if m.mtmd_helper_eval_chunks(self.mctx, ctx, handle, 0, 0, self.n_ctx, True, ctypes.byref(n_past)):
                raise _fail("mtmd_helper_eval_chunks failed")
            return np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(self.n_vocab,)).copy()
        finally:
            lc.llama_free(ctx)
            m.mtmd_input_chunks_free(handle)

    def close(self) -> None:
        if self.mctx:
            self.mtmd.mtmd_free(self.mctx)
            self.mctx = None
        if self.model:
            self.lc.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> MtmdOracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _demo() -> None:
    """Per projector: tiny files; chunk layouts of a 150x100 and a 64x64 image; logits checked
    against mtmd's own helper; flash attention off / on."""
    import tempfile

    from tiny_vlm import PROJECTORS, marker_tokens, test_image, write_tiny_vlm

    np.set_printoptions(precision=4, suppress=True, linewidth=120)
    for proj in PROJECTORS:
        with tempfile.TemporaryDirectory() as tmp:
            text, mmproj = write_tiny_vlm(tmp, proj)
            embd = {}
            for fa in (None, False, True):
                with MtmdOracle(text, mmproj, flash_attn=fa) as o:
                    images = [test_image(150, 100)]
                    embd[fa] = np.concatenate([c.embeddings for c in o.chunks(o.marker, images) if c.kind == "image"])
                    print(f"== {proj} flash_attn={fa}: FLASH_ATTN_EXT used {o.flash_attn_used}")
                    if fa is not None:
                        continue
                    bad = {s: o.tokenize(s) for s in [*marker_tokens(proj), "\n", "\n\n"] if len(o.tokenize(s)) != 1}
                    print(f"   non-causal image decode {o.non_causal}; markers that are not one token: {bad}")
                    for w, h in ((150, 100), (64, 64)):
                        prompt, images = f"Look: {o.marker} what?", [test_image(w, h)]
                        print(f"-- {w}x{h}")
                        for c in o.chunks(prompt, images):
                            if c.kind == "text":
                                pieces = "".join(o.piece(t) for t in c.tokens).encode("unicode_escape").decode()
                                print("  text ", c.tokens, pieces)
                            else:
                                e, px = np.asarray(c.embeddings), o.pixels(c)
                                print(f"  image n_tokens={c.n_tokens} n_pos={c.n_pos} embd {e.shape} norm "
                                      f"{np.linalg.norm(e):.3f} pixels {[p.shape for p in px]} "
                                      f"range [{min(p.min() for p in px):.3f}, {max(p.max() for p in px):.3f}]")
                        last, every = o.logits_after(prompt, images), o.all_logits(prompt, images)
                        helper = o.helper_logits_after(prompt, images)
                        print("  logits[:6]", last[:6], "max |ours - mtmd helper|", np.abs(last - helper).max(),
                              "max |all_logits[-1][-1] - last|", np.abs(every[-1][-1] - last).max())
            print(f"   embeddings max |FA on - FA off| {np.abs(embd[True] - embd[False]).max():.2e}, "
                  f"|default - FA on| {np.abs(embd[None] - embd[True]).max():.2e}")


if __name__ == "__main__":
    _demo()
