"""Tiny random-weight vision-language GGUF pairs (an mmproj file plus a text model) in the
layout llama.cpp's converter writes and its libmtmd loads (tools/mtmd/clip.cpp,
models/siglip.cpp), for comparing our image pipeline with mtmd (tests/support/mtmd_oracle.py).

Projectors: "idefics3" (SmolVLM: SigLIP + pixel shuffle + one linear; llama text model),
"gemma3" (SigLIP + 2D average pool + RMS norm + projection; gemma3 text model) and "lfm2"
(LFM2-VL: SigLIP with resized position embeddings + pixel unshuffle + LayerNorm + GELU MLP;
lfm2 text model) and "pixtral" (Pixtral-12B: RMS-norm SwiGLU ViT with 2D RoPE, no learned
positions, dynamic image size, GELU MLP, an [IMG_BREAK] embedding after every patch row but the
last; llama text model; patch_merger=True gives Mistral-Small-3.1's RMS norm + 2x2 patch merger).
Every tensor is F32 (the patch embedding too). The text vocabulary is the tiny byte-level BPE
of tiny_models plus "\\n\\n" and the marker tokens mtmd looks up.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter
from tiny_models import BYTE_ENCODER, CHATML, MERGES, SPECIALS, _Weights, finish

PROJECTORS = ("idefics3", "gemma3", "lfm2", "pixtral")
TEXT_ARCH = {"idefics3": "llama", "gemma3": "gemma3", "lfm2": "lfm2", "pixtral": "llama"}
LFM2_TEXT_LAYERS = ("conv", "attn", "conv")
NEWLINE2 = ("Ċ", "Ċ")  # "\n\n" as one token: idefics3's overview starts with it


def marker_tokens(projector: str) -> list[str]:
    """The special tokens mtmd.cpp looks up (or tokenizes) around this projector's images."""
    if projector == "idefics3":
        grid = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
        return ["<fake_token_around_image>", "<global-img>", "<image>", *grid]
    if projector == "gemma3":
        return ["<start_of_image>", "<end_of_image>"]
    if projector == "lfm2":
        grid = [f"<|img_row_{r}_col_{c}|>" for r in range(1, 11) for c in range(1, 11) if r * c <= 10]
        return ["<|image_start|>", "<|image_end|>", "<|img_thumbnail|>", *grid]
    if projector == "pixtral":  # mtmd writes "[IMG_END]" after the image; [IMG], [IMG_BREAK]: Mistral's
        return ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
    raise ValueError(f"unknown projector {projector!r}; expected one of {PROJECTORS}")


def vlm_vocab(projector: str) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): bytes, merges (with "ĊĊ"), control tokens, markers."""
    merges = [*MERGES, NEWLINE2]
    specials = [*SPECIALS, *marker_tokens(projector)]
    tokens = list(BYTE_ENCODER) + [a + b for a, b in merges] + specials
    types = [1] * (len(tokens) - len(specials)) + [3] * len(specials)  # 1 normal, 3 control
    return tokens, types, [f"{a} {b}" for a, b in merges]


_LINEAR = ["F32"]  # the matrices' type while write_tiny_mmproj runs


def _lin(w: GGUFWriter, rng: np.random.Generator, name: str, rows: int, cols: int, gain: float = 1.0,
         bias: bool = True) -> None:
    """A PyTorch-order [rows (out), cols (in)] weight, std gain/sqrt(cols), stored as _LINEAR[0]
    (F32, F16 or Q8_0: what write_tiny_mmproj's linear_type asks); bias std 0.02."""
    weight = rng.normal(0.0, gain / np.sqrt(cols), (rows, cols)).astype(np.float32)
    if _LINEAR[0] == "F16":
        w.add_tensor(name + ".weight", weight.astype(np.float16))
    elif _LINEAR[0] == "Q8_0":
        from gguf import GGMLQuantizationType, quants

        w.add_tensor(name + ".weight", quants.quantize(weight, GGMLQuantizationType.Q8_0),
                     raw_dtype=GGMLQuantizationType.Q8_0)
    else:
        w.add_tensor(name + ".weight", weight)
    if bias:
        w.add_tensor(name + ".bias", rng.normal(0.0, 0.02, rows).astype(np.float32))


def _norm(w: GGUFWriter, rng: np.random.Generator, name: str, n: int, bias: bool = True) -> None:
    """Norm weights near 1 (biases near 0)."""
    w.add_tensor(name + ".weight", rng.normal(1.0, 0.1, n).astype(np.float32))
    if bias:
        w.add_tensor(name + ".bias", rng.normal(0.0, 0.05, n).astype(np.float32))


def _clip_writer(path: Path, name: str, projector: str, text_embd: int, image_size: int, patch_size: int, n_embd: int,
                 n_ff: int, n_layer: int, n_head: int, image_mean: Any, image_std: Any, eps: float) -> GGUFWriter:
    """A writer with the clip.* keys every projector's file has (F32, one vision tower)."""
    w = GGUFWriter(str(path), "clip")
    w.add_type("mmproj")
    w.add_name(name)
    w.add_file_type(0)  # ALL_F32
    w.add_clip_projector_type(projector)
    w.add_clip_has_vision_encoder(True)
    w.add_vision_projection_dim(text_embd)
    w.add_vision_image_size(image_size)
    w.add_vision_patch_size(patch_size)
    w.add_vision_embedding_length(n_embd)
    w.add_vision_feed_forward_length(n_ff)
    w.add_vision_block_count(n_layer)
    w.add_vision_head_count(n_head)
    w.add_vision_image_mean(list(image_mean))
    w.add_vision_image_std(list(image_std))
    w.add_vision_attention_layernorm_eps(eps)
    return w


def write_tiny_mmproj(path: str | Path, projector: str, *, linear_type: str = "F32", **kwargs: Any) -> Path:
    """_write_mmproj's file with its matrices (the blocks' and the projector's) of linear_type:
    F32 (the default, for the 1e-3 comparisons), F16 or Q8_0 (what real mmproj files ship)."""
    if linear_type not in ("F32", "F16", "Q8_0"):
        raise ValueError(f"linear_type must be F32, F16 or Q8_0, got {linear_type!r}")
    _LINEAR[0] = linear_type
    try:
        return _write_mmproj(path, projector, **kwargs)
    finally:
        _LINEAR[0] = "F32"


def _write_mmproj(
    path: str | Path,
    projector: str,
    *,
    seed: int = 0,
    image_size: int = 64,
    patch_size: int = 8,
    n_embd: int = 32,
    n_layer: int = 2,
    n_head: int = 2,
    n_ff: int = 64,
    n_merge: int = 2,
    text_embd: int = 64,
    preproc_image_size: int | None = None,
    image_mean: tuple[float, float, float] | None = None,
    image_std: tuple[float, float, float] | None = None,
    mm_hidden: int = 96,
    eps: float | None = None,
    patch_merger: bool = False,
    img_break: np.ndarray | None = None,
) -> Path:
    """An mmproj GGUF for `projector`; `path` is a file or a folder. idefics3's
    preproc_image_size (longest edge before tiling) defaults to 2 * image_size, so every image
    becomes 2x2 tiles of image_size plus a global image; mm_hidden is lfm2's MLP width.
    image_mean / image_std default to 0.5 (pixtral: the CLIP values its converter writes), eps
    to 1e-6 (pixtral: 1e-5, its RMS norms'). Pixtral only: patch_merger (Mistral-Small-3.1's
    n_merge x n_merge patch merger, spatial_merge_size n_merge; without it n_merge is unused),
    img_break (the [IMG_BREAK] embedding [text_embd], which the converter copies from the text
    model's token_embd; random if None)."""
    marker_tokens(projector)  # validates the name
    if projector == "pixtral":
        return _write_pixtral_mmproj(
            path, seed=seed, image_size=image_size, patch_size=patch_size, n_embd=n_embd, n_layer=n_layer,
            n_head=n_head, n_ff=n_ff, n_merge=n_merge, text_embd=text_embd,
            image_mean=image_mean or PIXTRAL_MEAN, image_std=image_std or PIXTRAL_STD,
            eps=1e-5 if eps is None else eps, patch_merger=patch_merger, img_break=img_break)
    if patch_merger or img_break is not None:
        raise ValueError("patch_merger / img_break are pixtral options")
    image_mean = image_mean or (0.5, 0.5, 0.5)
    image_std = image_std or (0.5, 0.5, 0.5)
    eps = 1e-6 if eps is None else eps
    if n_ff == n_embd:  # clip.cpp would take ffn_down for ffn_up (its legacy-swap check)
        raise ValueError("n_ff must differ from n_embd")
    side = image_size // patch_size
    if projector == "gemma3" and side % n_merge:
        raise ValueError("gemma3 needs (image_size / patch_size) divisible by n_merge")
    path = Path(path)
    if path.is_dir():
        path = path / f"mmproj-tiny-{projector}-f32.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)

    w = _clip_writer(path, f"tiny {projector} mmproj", projector, text_embd, image_size, patch_size, n_embd, n_ff,
                     n_layer, n_head, image_mean, image_std, eps)
    w.add_vision_use_gelu(True)
    if projector != "gemma3" or n_merge != 4:  # the gemma3 converter writes only a non-default factor
        w.add_vision_projector_scale_factor(n_merge)
    if projector == "idefics3":
        w.add_vision_preproc_image_size(preproc_image_size or 2 * image_size)

    rng = np.random.default_rng(seed)
    # conv kernel [n_embd, 3, p, p] (GGUF ne [p, p, 3, n_embd]), as the converter writes Conv2d
    patch = rng.normal(0.0, 1.0 / np.sqrt(3 * patch_size**2), (n_embd, 3, patch_size, patch_size))
    w.add_tensor("v.patch_embd.weight", patch.astype(np.float32))
    w.add_tensor("v.patch_embd.bias", rng.normal(0.0, 0.02, n_embd).astype(np.float32))
    w.add_tensor("v.position_embd.weight", rng.normal(0.0, 0.3, (side * side, n_embd)).astype(np.float32))
    for i in range(n_layer):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            _lin(w, rng, p + name, n_embd, n_embd)
        _norm(w, rng, p + "ln1", n_embd)
        _norm(w, rng, p + "ln2", n_embd)
        _lin(w, rng, p + "ffn_up", n_ff, n_embd)  # fc1
        _lin(w, rng, p + "ffn_down", n_embd, n_ff)  # fc2
    _norm(w, rng, "v.post_ln", n_embd)

    merged = n_embd * n_merge * n_merge
    if projector == "idefics3":
        _lin(w, rng, "mm.model.fc", text_embd, merged, bias=False)
    elif projector == "gemma3":
        # a bare parameter used as x @ W: [n_embd, text_embd] (GGUF ne [text_embd, n_embd]);
        # clip.cpp transposes it before its mul_mat. The norm is stored with gemma's +1 added.
        proj = rng.normal(0.0, 1.0 / np.sqrt(n_embd), (n_embd, text_embd))
        w.add_tensor("mm.input_projection.weight", proj.astype(np.float32))
        _norm(w, rng, "mm.soft_emb_norm", n_embd, bias=False)
    else:
        _norm(w, rng, "mm.input_norm", merged)
        _lin(w, rng, "mm.1", mm_hidden, merged)
        _lin(w, rng, "mm.2", text_embd, mm_hidden)
    finish(w)
    return path


PIXTRAL_MEAN = (0.48145466, 0.4578275, 0.40821073)  # mistral_common's DATASET_MEAN / _STD (CLIP's)
PIXTRAL_STD = (0.26862954, 0.26130258, 0.27577711)


def _write_pixtral_mmproj(
    path: str | Path, *, seed: int, image_size: int, patch_size: int, n_embd: int, n_layer: int, n_head: int,
    n_ff: int, n_merge: int, text_embd: int, image_mean: tuple[float, float, float],
    image_std: tuple[float, float, float], eps: float, patch_merger: bool, img_break: np.ndarray | None,
) -> Path:
    """Pixtral's mmproj as convert_hf_to_gguf.py's LlavaVisionModel writes mistral-community/
    pixtral-12b (patch_merger: Mistral-Small-3.1-24B): keys without rope / scale-factor keys
    (clip.cpp fixes rope_theta 10000), SiLU (SwiGLU) FFN, RMS norms without biases, a patch conv
    without bias, no position embedding or post norm; mm.1 / mm.2 with biases for pixtral-12b,
    without for Mistral-Small-3.1 (multimodal_projector_bias false)."""
    if n_ff == n_embd:
        raise ValueError("n_ff must differ from n_embd")
    if n_embd % n_head or (n_embd // n_head) % 4:
        raise ValueError("pixtral's 2D RoPE needs head_dim = n_embd / n_head divisible by 4")
    if patch_merger and n_merge < 2:
        raise ValueError("patch_merger needs n_merge >= 2")
    path = Path(path)
    if path.is_dir():
        path = path / f"mmproj-tiny-pixtral{'-merger' if patch_merger else ''}-f32.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)

    w = _clip_writer(path, f"tiny pixtral{' (patch merger)' if patch_merger else ''} mmproj", "pixtral", text_embd,
                     image_size, patch_size, n_embd, n_ff, n_layer, n_head, image_mean, image_std, eps)
    w.add_vision_use_silu(True)
    if patch_merger:
        w.add_vision_spatial_merge_size(n_merge)

    rng = np.random.default_rng(seed)
    patch = rng.normal(0.0, 1.0 / np.sqrt(3 * patch_size**2), (n_embd, 3, patch_size, patch_size))
    w.add_tensor("v.patch_embd.weight", patch.astype(np.float32))  # GGUF ne [p, p, 3, n_embd]
    _norm(w, rng, "v.pre_ln", n_embd, bias=False)
    for i in range(n_layer):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            _lin(w, rng, p + name, n_embd, n_embd, bias=False)
        _norm(w, rng, p + "ln1", n_embd, bias=False)
        _norm(w, rng, p + "ln2", n_embd, bias=False)
        _lin(w, rng, p + "ffn_gate", n_ff, n_embd, bias=False)  # w1
        _lin(w, rng, p + "ffn_up", n_ff, n_embd, bias=False)  # w3
        _lin(w, rng, p + "ffn_down", n_embd, n_ff, bias=False)  # w2
    if patch_merger:
        # merging_layer: input feature c * n_merge^2 + dy * n_merge + dx (torch unfold's order)
        _norm(w, rng, "mm.input_norm", n_embd, bias=False)
        _lin(w, rng, "mm.patch_merger", n_embd, n_embd * n_merge * n_merge, bias=False)
    _lin(w, rng, "mm.1", text_embd, n_embd, bias=not patch_merger)
    _lin(w, rng, "mm.2", text_embd, text_embd, bias=not patch_merger)
    if img_break is None:
        img_break = rng.normal(0.0, 0.5, text_embd)
    img_break = np.asarray(img_break, np.float32).reshape(-1)
    if img_break.shape != (text_embd,):
        raise ValueError(f"img_break must have text_embd={text_embd} values")
    w.add_tensor("v.token_embd.img_break", img_break)
    finish(w)
    return path


def add_tiny_vocab(w: GGUFWriter, tokens: list[str], types: list[int], merges: list[str]) -> None:
    """The byte-level BPE tokenizer keys of a tiny text model: <|endoftext|> as BOS (added) and
    EOS, the ChatML template."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eot = tokens.index("<|endoftext|>")
    w.add_bos_token_id(eot)
    w.add_eos_token_id(eot)
    w.add_add_bos_token(True)
    w.add_chat_template(CHATML)


def write_tiny_vlm_text(
    path: str | Path,
    projector: str,
    *,
    seed: int = 0,
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn: int = 128,
    context_length: int = 4096,
    sliding_window: int = 512,
) -> Path:
    """The text model for `projector` (llama / gemma3 / lfm2, F32, BOS added) whose vocabulary
    holds the marker tokens; d_model must equal the mmproj's text_embd. gemma3: head_dim 32,
    every 2nd layer global, the others `sliding_window` wide; lfm2: LFM2_TEXT_LAYERS
    (n_layers ignored)."""
    marker_tokens(projector)  # validates the name
    arch = TEXT_ARCH[projector]
    path = Path(path)
    if path.is_dir():
        path = path / f"tiny-{projector}-{arch}-f32.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    gemma, lfm2 = arch == "gemma3", arch == "lfm2"
    layers = LFM2_TEXT_LAYERS if lfm2 else ("attn",) * n_layers
    hd = 32 if gemma else d_model // n_heads
    tokens, types, merges = vlm_vocab(projector)
    n_vocab = len(tokens)

    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny {projector} text {arch}")
    meta: dict[str, object] = {"block_count": len(layers), "embedding_length": d_model, "attention.head_count": n_heads,
                               "feed_forward_length": ffn, "context_length": context_length,
                               "rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": 1e-6 if gemma else 1e-5}
    if gemma:
        meta.update({"attention.key_length": hd, "attention.value_length": hd, "rope.dimension_count": hd,
                     "attention.sliding_window": sliding_window, "attention.sliding_window_pattern": 2,
                     "rope.freq_base_swa": 10000.0})
    elif lfm2:
        meta.update({"shortconv.l_cache": 3, "vocab_size": n_vocab})
        w.add_array(f"{arch}.attention.head_count_kv", [n_kv_heads if k == "attn" else 0 for k in layers])
    else:
        meta["rope.dimension_count"] = hd
    if not lfm2:
        meta["attention.head_count_kv"] = n_kv_heads
    for key, value in meta.items():
        if isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", int(value))  # type: ignore[call-overload]
    add_tiny_vocab(w, tokens, types, merges)

    wt = _Weights(w, "F32", seed)
    q_dim, kv_dim = n_heads * hd, n_kv_heads * hd
    wt.matrix("token_embd.weight", n_vocab, d_model, std=0.5 / np.sqrt(d_model) if gemma else 0.5)
    if lfm2:
        wt.vector("token_embd_norm.weight", d_model, mean=1.0)  # lfm2's final norm
    else:
        wt.vector("output_norm.weight", d_model, mean=1.0)
    if arch == "llama":
        wt.matrix("output.weight", n_vocab, d_model, std=0.5)
    block_std = 0.05 if arch == "llama" else 0.3 if lfm2 else 0.8  # tied outputs need bigger blocks
    for i, kind in enumerate(layers):
        p = f"blk.{i}."
        wt.vector(p + "attn_norm.weight", d_model, mean=1.0)
        wt.vector(p + "ffn_norm.weight", d_model, mean=1.0)
        if kind == "conv":
            wt.matrix(p + "shortconv.in_proj.weight", 3 * d_model, d_model, std=0.3)
            w.add_tensor(p + "shortconv.conv.weight", wt.rng.normal(0.0, 0.6, (d_model, 3)).astype(np.float32))
            wt.matrix(p + "shortconv.out_proj.weight", d_model, d_model, std=0.3)
        else:
            wt.matrix(p + "attn_q.weight", q_dim, d_model, std=0.2)
            wt.matrix(p + "attn_k.weight", kv_dim, d_model, std=0.2)
            wt.matrix(p + "attn_v.weight", kv_dim, d_model, std=block_std)
            wt.matrix(p + "attn_output.weight", d_model, q_dim, std=block_std)
            if gemma or lfm2:
                wt.vector(p + "attn_q_norm.weight", hd, mean=1.0)
                wt.vector(p + "attn_k_norm.weight", hd, mean=1.0)
        if gemma:
            wt.vector(p + "post_attention_norm.weight", d_model, mean=4.0)
            wt.vector(p + "post_ffw_norm.weight", d_model, mean=4.0)
        wt.matrix(p + "ffn_gate.weight", ffn, d_model)
        wt.matrix(p + "ffn_up.weight", ffn, d_model)
        wt.matrix(p + "ffn_down.weight", d_model, ffn, std=block_std)
    finish(w)
    return path


def write_tiny_vlm(folder: str | Path, projector: str, *, seed: int = 0, **mmproj: object) -> tuple[Path, Path]:
    """(text model, mmproj) for `projector` in `folder`, with matching widths. pixtral: the
    mmproj's [IMG_BREAK] embedding is the text model's token_embd row, as the converter copies it."""
    folder = Path(folder)
    text_embd = int(mmproj.get("text_embd", 64))  # type: ignore[call-overload]
    text = write_tiny_vlm_text(folder / f"tiny-{projector}-text.gguf", projector, seed=seed, d_model=text_embd)
    if projector == "pixtral" and mmproj.get("img_break") is None:
        from gguf import GGUFReader

        embd = next(t for t in GGUFReader(str(text)).tensors if t.name == "token_embd.weight")
        row = vlm_vocab(projector)[0].index("[IMG_BREAK]")
        mmproj["img_break"] = np.array(embd.data, np.float32).reshape(-1, text_embd)[row].copy()
    proj = write_tiny_mmproj(folder / f"tiny-{projector}-mmproj.gguf", projector, seed=seed + 1, **mmproj)  # type: ignore[arg-type]
    return text, proj


def test_image(width: int, height: int, seed: int = 0) -> np.ndarray:
    """uint8 [height, width, 3]: smooth per-channel gradients and waves plus pixel noise, so
    resizing filters and channel order both matter."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    phase = rng.uniform(0, 2 * np.pi, 3)
    r = 60 + 140 * u + 30 * np.sin(7 * v + phase[0])
    g = 200 - 150 * v + 25 * np.sin(9 * u + 5 * v + phase[1])
    b = 128 + 90 * np.sin(4 * (u + v) + phase[2]) * np.cos(3 * u)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0.0, 12.0, (height, width, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


test_image.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def png_bytes(img: np.ndarray) -> bytes:
    """The image (uint8 [H, W, 3]) as PNG bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img, dtype=np.uint8), "RGB").save(buf, format="PNG")
    return buf.getvalue()
