"""Which engine runs a model: an EncoderEngine for an encoder's file (bert, nomic-bert, modern-bert,
jina-bert-v2, gemma-embedding: embeddings and rerank), an LLMEngine for everything else."""

from __future__ import annotations

from edge_infer import hub
from edge_infer.config import EngineConfig
from edge_infer.engine.encoder_engine import EncoderEngine
from edge_infer.engine.engine import LLMEngine
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models.encoder_config import is_encoder

Engine = LLMEngine | EncoderEngine


def make_engine(config: EngineConfig) -> Engine:
    """The engine of config.model (pulled first when it is a known name)."""
    path = hub.resolve_model(config.model)
    f = GGUFFile(path)
    if is_encoder(f):
        return EncoderEngine(config, f)
    f.close()
    return LLMEngine(config)
