"""The engine's side of images: the projector file loaded beside the text model (--mmproj),
prompts with images built on the caller's thread (preprocessing with Pillow, the markers), and
their embeddings encoded on the engine thread when a step needs them."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from edge_infer.engine.image_encoder import ImageEmbeddings
from edge_infer.engine.image_prompt import ImageLayout, MultimodalPrompt, build_prompt
from edge_infer.engine.model_runner import ModelRunner
from edge_infer.errors import InvalidRequest, UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.images.source import Image
from edge_infer.models.config import ModelConfig
from edge_infer.models.vision_config import QWEN25VL, VisionConfig, vision_config_from_gguf
from edge_infer.models.vision_qwen import vision_tower
from edge_infer.models.vision_weights import load_vision_weights
from edge_infer.tokenizer import Tokenizer

log = logging.getLogger("edge_infer.engine")


class Vision:
    """A loaded projector: its config, the marker layout over the text model's vocabulary and
    the embeddings' encoder and cache."""

    def __init__(self, path: str, tokenizer: Tokenizer, model_config: ModelConfig, runner: ModelRunner) -> None:
        t0 = time.perf_counter()
        backend = runner.backend
        if backend.name != "cpu":
            raise InvalidRequest("images are encoded on the CPU backend only: load the model with device='cpu' "
                                 "to use an mmproj")
        self.file = GGUFFile(path)
        self.config: VisionConfig = vision_config_from_gguf(self.file)
        if self.config.text_dim != model_config.d_model:
            raise UnsupportedModelError(
                f"{path}: the projector gives embeddings of width {self.config.text_dim}, but the text model "
                f"({model_config.arch}) is {model_config.d_model} wide: this mmproj belongs to another model")
        mrope = bool(model_config.rope_sections)
        if mrope != (self.config.projector == QWEN25VL):  # libmtmd places qwen2.5vl's images in 2-D, no others
            raise UnsupportedModelError(f"{path}: a {self.config.projector} projector beside a {model_config.arch} text "
                                        f"model {'with' if mrope else 'without'} M-RoPE: this mmproj belongs to "
                                        "another model")
        weights = load_vision_weights(self.file, self.config, backend)
        self.tower = vision_tower(self.config, weights, backend)  # type: ignore[arg-type]
        self.layout = ImageLayout(self.config, tokenizer)
        self.embeddings = ImageEmbeddings(self.tower)
        runner.image_rows = self.embeddings.rows
        runner.image_noncausal = self.config.projector == "gemma3"  # mtmd_decode_use_non_causal
        runner.mrope = mrope  # qwen2vl: every row rotates by its M-RoPE positions (engine/mrope.py)
        log.info("loaded projector %s (%s, %d layers at %d px) in %.2fs", path, self.config.projector,
                 self.config.n_layers, self.config.image_size, time.perf_counter() - t0)

    def prompt(self, runs: Sequence[list[int]], images: Sequence[Image]) -> MultimodalPrompt:
        """The prompt of text token runs around images (runs[i] before images[i])."""
        return build_prompt(self.layout, runs, images)

    def close(self) -> None:
        self.tower.close()
        self.file.close()


def open_vision(mmproj: str | None, tokenizer: Tokenizer, model_config: ModelConfig,
                runner: ModelRunner) -> Vision | None:
    if mmproj is None:
        return None
    return Vision(mmproj, tokenizer, model_config, runner)
