"""Which engine runs a model: an EncoderEngine for an encoder's file (bert, nomic-bert, modern-bert,
jina-bert-v2, gemma-embedding: embeddings and rerank), an LLMEngine for everything else."""

from __future__ import annotations

from edge_infer import hub
from edge_infer.config import EngineConfig
from edge_infer.engine.encoder_engine import EncoderEngine
from edge_infer.engine.engine import LLMEngine
from edge_infer.errors import InvalidRequest
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models.encoder_config import is_encoder
from edge_infer.models.vision_config import is_mmproj

Engine = LLMEngine | EncoderEngine


def make_engine(config: EngineConfig) -> Engine:
    """The engine of config.model (pulled first when it is a known name)."""
    path = hub.resolve_model(config.model)
    f = GGUFFile(path)
    if is_mmproj(f):
        f.close()
        raise InvalidRequest(f"{path} is a multimodal projector (mmproj), not a model: pass it as --mmproj "
                             "(LLM(model, mmproj=...)) beside the text model it belongs to")
    if is_encoder(f):
        if config.mmproj is not None:
            f.close()
            raise InvalidRequest(f"{path} is an encoder ({f.architecture}): it takes no mmproj")
        if config.adapters:
            f.close()
            raise InvalidRequest(f"{path} is an encoder ({f.architecture}): it takes no LoRA adapters")
        return EncoderEngine(config, f)
    f.close()
    return LLMEngine(config)
