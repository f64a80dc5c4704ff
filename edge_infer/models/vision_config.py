"""VisionConfig: a multimodal projector file's (`general.type = mmproj`, `clip.*` keys) vision
encoder and projector, as llama.cpp's clip.cpp (clip_model_loader::load_hparams) reads them.

Supported projectors run the SigLIP / CLIP vision transformer (models/siglip.cpp's build_vit)
and then their own head: gemma3 (average pool, soft-embedding RMSNorm, projection), idefics3
(SmolVLM: pixel shuffle, projection) and lfm2 (LFM2-VL: SigLIP2 at the image's own size, its
position embeddings resized; pixel unshuffle, LayerNorm, a GELU MLP); pixtral and qwen2.5vl
(Qwen2.5-VL: an RMS-norm SwiGLU ViT with 2-D RoPE, window attention in all but every
n_wa_pattern-th block, 2 x 2 patches merged by an MLP) run their own blocks (vision.py,
vision_qwen.py). Every other projector llama.cpp knows is refused by name."""

from __future__ import annotations

from dataclasses import dataclass

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.images.preprocess import PixelParams

QWEN25VL = "qwen2.5vl_merger"
SUPPORTED_PROJECTORS = ("gemma3", "idefics3", "lfm2", "pixtral", QWEN25VL)
_RMS_SILU = ("pixtral", QWEN25VL)  # RMS-norm blocks with a SwiGLU MLP and 2-D RoPE
# (clip.use_gelu, clip.use_silu) -> the vision FFN's activation (clip.cpp: neither is GELU-quick)
_FFN = {(True, False): "gelu", (False, True): "silu", (False, False): "gelu_quick"}


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """A vision tower of n_layers pre-norm blocks over patch_size x patch_size patches of an
    image_size square, width d_model; text_dim: the text model's width its tokens come out at."""

    path: str
    projector: str
    image_size: int
    patch_size: int
    d_model: int
    ffn_dim: int
    n_layers: int
    n_heads: int
    text_dim: int
    norm_eps: float
    n_merge: int
    ffn: str  # "gelu" (ggml's tanh GELU) or "silu" (pixtral: gated, SwiGLU)
    pixels: PixelParams
    norm: str = "layer"  # the blocks' norms: LayerNorm, or "rms" (pixtral)
    rope_theta: float = 0.0  # pixtral's and qwen2.5vl's 2-D RoPE base (0: learned position embeddings instead)
    n_wa_pattern: int = 0  # qwen2.5vl: every n-th block attends over the whole image, the rest within windows
    window_size: int = 0  # qwen2.5vl: a window's side in pixels (clip.cpp: 112)

    def __post_init__(self) -> None:
        side = self.image_size // self.patch_size
        if self.image_size % self.patch_size or side < 1:
            raise UnsupportedModelError(f"{self.path}: image_size {self.image_size} is not a multiple of "
                                        f"patch_size {self.patch_size}")
        if self.d_model % self.n_heads:
            raise UnsupportedModelError(f"{self.path}: embedding_length {self.d_model} is not a multiple of "
                                        f"head_count {self.n_heads}")
        if self.projector == QWEN25VL and (self.head_dim % 4 or self.n_merge != 2):
            raise UnsupportedModelError(f"{self.path}: a qwen2.5vl tower needs a head size divisible by 4 (its "
                                        f"2-D RoPE) and 2 x 2 merging, got {self.head_dim} and {self.n_merge}")
        if self.n_merge < 1 or (self.projector == "gemma3" and side % self.n_merge):
            raise UnsupportedModelError(f"{self.path}: projector scale_factor {self.n_merge} does not divide the "
                                        f"{side} patches per side")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.patches_per_side**2

    def tile_tokens(self, height: int, width: int) -> int:
        """Embeddings a height x width tile gives: its patch grid merged n_merge x n_merge (the
        pixel shuffle pads a partial block; gemma3's pooling divides exactly; qwen2.5vl's sides
        are multiples of 2 patches); pixtral: one [IMG_BREAK] after each row but the last."""
        s, p = self.n_merge, self.patch_size
        rows, cols = -(-(height // p) // s), -(-(width // p) // s)
        return rows * cols + (rows - 1 if self.projector == "pixtral" else 0)


def is_mmproj(f: GGUFFile) -> bool:
    return f.metadata.get("general.type") == "mmproj" or f.metadata.get("general.architecture") == "clip"


def _int(f: GGUFFile, key: str, default: int | None = None) -> int:
    v = f.metadata.get(key, default)
    if v is None:
        raise UnsupportedModelError(f"{f.path}: missing metadata key {key!r}")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise UnsupportedModelError(f"{f.path}: metadata {key!r} must be a positive integer, got {v!r}")
    return v


def _float(f: GGUFFile, key: str) -> float:
    v = f.metadata.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UnsupportedModelError(f"{f.path}: metadata {key!r} must be a number, got {v!r}")
    return float(v)


def _triple(f: GGUFFile, key: str) -> tuple[float, float, float]:
    v = f.metadata.get(key)
    if not isinstance(v, list) or len(v) < 3 or not all(isinstance(x, (int, float)) for x in v[:3]):
        raise UnsupportedModelError(f"{f.path}: metadata {key!r} must be an array of 3 numbers")
    return float(v[0]), float(v[1]), float(v[2])


def vision_config_from_gguf(f: GGUFFile) -> VisionConfig:
    """The file's vision tower and projector; UnsupportedModelError naming what is not supported."""
    if not is_mmproj(f):
        raise UnsupportedModelError(f"{f.path}: not a multimodal projector file (general.type is not 'mmproj')")
    if f.metadata.get("clip.has_vision_encoder") is not True:
        raise UnsupportedModelError(f"{f.path}: this projector has no vision encoder (audio projectors are not "
                                    "supported)")
    proj = f.metadata.get("clip.vision.projector_type", f.metadata.get("clip.projector_type"))
    if not isinstance(proj, str):
        raise UnsupportedModelError(f"{f.path}: missing metadata key 'clip.projector_type'")
    if proj not in SUPPORTED_PROJECTORS:
        raise UnsupportedModelError(f"{f.path}: projector type {proj!r} is not supported (supported: "
                                    f"{', '.join(SUPPORTED_PROJECTORS)})")
    n_heads = _int(f, "clip.vision.attention.head_count")
    if f.metadata.get("clip.vision.attention.head_count_kv", n_heads) != n_heads:
        raise UnsupportedModelError(f"{f.path}: vision attention with fewer KV heads is not supported")
    gelu, silu = f.metadata.get("clip.use_gelu") is True, f.metadata.get("clip.use_silu") is True
    if gelu and silu:
        raise UnsupportedModelError(f"{f.path}: both clip.use_gelu and clip.use_silu are set")
    ffn = _FFN[(gelu, silu)]
    if ffn != ("silu" if proj in _RMS_SILU else "gelu"):
        raise UnsupportedModelError(f"{f.path}: the {proj} vision FFN activation {ffn!r} is not supported")
    image_size, patch = _int(f, "clip.vision.image_size"), _int(f, "clip.vision.patch_size")
    longest = 0
    if proj == "idefics3":
        longest = f.metadata.get("clip.vision.preproc_image_size", 0)
        if not isinstance(longest, int) or isinstance(longest, bool) or longest <= 0:
            raise UnsupportedModelError(f"{f.path}: an idefics3 projector needs clip.vision.preproc_image_size "
                                        "(older conversions lack it: convert the model again)")
    if proj in _RMS_SILU:  # Mistral Small 3.1's patch merger sets spatial_merge_size; Pixtral-12B has none
        n_merge = _int(f, "clip.vision.spatial_merge_size", 1 if proj == "pixtral" else 2)
    else:  # gemma3's files may omit it (4); idefics3's and lfm2's may not
        n_merge = _int(f, "clip.vision.projector.scale_factor", 4 if proj == "gemma3" else None)
    pixels = PixelParams(proj, image_size, patch, _triple(f, "clip.vision.image_mean"),
                         _triple(f, "clip.vision.image_std"), longest, n_merge)
    return VisionConfig(
        path=f.path, projector=proj, image_size=image_size, patch_size=patch,
        d_model=_int(f, "clip.vision.embedding_length"), ffn_dim=_int(f, "clip.vision.feed_forward_length"),
        n_layers=_int(f, "clip.vision.block_count"), n_heads=n_heads, text_dim=_int(f, "clip.vision.projection_dim"),
        norm_eps=_float(f, "clip.vision.attention.layer_norm_epsilon"),
        n_merge=n_merge, ffn=ffn, pixels=pixels, norm="rms" if proj in _RMS_SILU else "layer",
        rope_theta=10000.0 if proj in _RMS_SILU else 0.0,
        # clip.cpp reads no window size (attn_window_size stays 0: 112 px); the converter requires the pattern
        n_wa_pattern=_int(f, "clip.vision.n_wa_pattern") if proj == QWEN25VL else 0,
        window_size=112 if proj == QWEN25VL else 0)
