"""Tiny Hugging Face EmbeddingGemma folders (google/embeddinggemma-300m's layout and config keys,
shrunk: hidden 64, 6 layers (five sliding, one full, as its layer_types), 2 query heads over 1
K/V head of 32, seeded random weights) with a SentencePiece tokenizer.model trained here on a
small text (BPE, byte fallback, no dummy prefix, Gemma's <pad> <eos> <bos> <unk> ids), its
tokenizer.json / tokenizer_config.json, and sentence-transformers' modules: mean pooling, the
2_Dense / 3_Dense projections (64 -> 128 -> 64, no bias, identity) and Normalize."""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

CORPUS = """The quick brown fox jumps over the lazy dog.
A small model turns every sentence into one vector of numbers.
Search engines compare the vectors of a query and of each document.
Paris is the capital of France, and Berlin is the capital of Germany.
The weather today is sunny with a light wind from the west.
Embeddings place similar meanings close together in space.
She reads a book in the garden while the children play music.
Numbers like 12, 345 and 6789 are split into single digits.
"""
# Gemma's specials at Gemma's ids, then user-defined pieces as its tokenizer.model has them
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")
PAD, EOS, BOS, UNK = range(4)
USER_DEFINED = ("<mask>", "[multimodal]", "<start_of_turn>", "<end_of_turn>")
SPM_SIZE = 400
N_VOCAB = SPM_SIZE + 4  # config.json's vocab_size: the embedding table pads past the tokenizer
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Search engines compare the vectors of a query and of each document, one by one.",
    "Paris is the capital of France; Tokyo is the capital of Japan.",
    "Numbers like 2024 and 3.14 are split into digits!",
    "Café, naïve, 日本語: bytes for what the vocabulary lacks.",
    "An image: [multimodal] and its caption.",  # a user-defined piece, whole
)
LAYER_TYPES = ["sliding_attention"] * 5 + ["full_attention"]
DENSE = 128  # 2_Dense's output width (EmbeddingGemma's 3072)


@functools.lru_cache(maxsize=1)
def spm_model() -> bytes:
    """The serialized SentencePiece model (deterministic: one thread, a fixed text)."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines() * 3), model_writer=buf, vocab_size=SPM_SIZE, model_type="bpe",
        byte_fallback=True, add_dummy_prefix=False, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
        pad_id=PAD, eos_id=EOS, bos_id=BOS, unk_id=UNK, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
        unk_piece="<unk>", user_defined_symbols=list(USER_DEFINED), num_threads=1, minloglevel=2)
    return buf.getvalue()


def gemma_config(**over: Any) -> dict[str, Any]:
    """embeddinggemma-300m's config.json, shrunk."""
    c: dict[str, Any] = {
        "_sliding_window_pattern": 6, "architectures": ["Gemma3TextModel"], "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": BOS, "dtype": "float32",
        "eos_token_id": EOS, "final_logit_softcapping": None, "head_dim": 32, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96, "layer_types": LAYER_TYPES,
        "max_position_embeddings": 2048, "model_type": "gemma3_text", "num_attention_heads": 2,
        "num_hidden_layers": 6, "num_key_value_heads": 1, "pad_token_id": PAD, "query_pre_attn_scalar": 32,
        "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": 8, "transformers_version": "4.57.0.dev0", "use_bidirectional_attention": True,
        "use_cache": True, "vocab_size": N_VOCAB,
    }
    c.update(over)
    return c


def gemma_tensors(c: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random weights under Gemma3TextModel's names (float32). Norm weights are Gemma's
    offsets from 1 (the model multiplies by 1 + w), so small values around 0."""
    rng = np.random.default_rng(seed)
    h, f, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd

    def mat(*shape: int, std: float = 0.15) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    t = {"embed_tokens.weight": mat(c["vocab_size"], h, std=0.5 / h**0.5)}
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        t[p + "input_layernorm.weight"] = mat(h, std=0.1)
        t[p + "self_attn.q_proj.weight"] = mat(q, h, std=0.3)  # sharp enough that positions matter
        t[p + "self_attn.k_proj.weight"] = mat(kv, h, std=0.3)
        t[p + "self_attn.v_proj.weight"] = mat(kv, h)
        t[p + "self_attn.o_proj.weight"] = mat(h, q)
        t[p + "self_attn.q_norm.weight"] = mat(hd, std=0.1)
        t[p + "self_attn.k_norm.weight"] = mat(hd, std=0.1)
        t[p + "post_attention_layernorm.weight"] = mat(h, std=0.1)
        t[p + "pre_feedforward_layernorm.weight"] = mat(h, std=0.1)
        t[p + "mlp.gate_proj.weight"] = mat(f, h)
        t[p + "mlp.up_proj.weight"] = mat(f, h)
        t[p + "mlp.down_proj.weight"] = mat(h, f, std=0.1)
        t[p + "post_feedforward_layernorm.weight"] = mat(h, std=0.1)
    t["norm.weight"] = mat(h, std=0.1)
    return t


def dense_weights(c: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """2_Dense's and 3_Dense's `linear.weight` (sentence-transformers' Dense, no bias)."""
    rng = np.random.default_rng(seed + 1)
    h = c["hidden_size"]
    return {"2_Dense": (rng.standard_normal((DENSE, h)) * 0.15).astype(np.float32),
            "3_Dense": (rng.standard_normal((h, DENSE)) * 0.1).astype(np.float32)}


def added_tokens() -> list[dict[str, Any]]:
    """tokenizer.json's added tokens: the specials and user-defined pieces, Gemma's flags (<mask>
    and [multimodal] not special)."""
    return [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": t not in ("<mask>", "[multimodal]")} for i, t in enumerate(SPECIALS + USER_DEFINED)]


def tokenizer_json() -> dict[str, Any]:
    """tokenizer.json as transformers' GemmaConverter writes it, but for the model's vocabulary
    (pieces without merges): the converter reads only its added tokens and post-processor."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=spm_model())
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    special = {"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"SpecialToken": {"id": "<eos>", "type_id": 0}}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens(),
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}, "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special[0], {"Sequence": {"id": "A", "type_id": 0}}, special[1]],
            "pair": [special[0], {"Sequence": {"id": "A", "type_id": 0}}, special[1], special[0],
                     {"Sequence": {"id": "B", "type_id": 1}}, special[1]],
            "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]} for t in ("<bos>", "<eos>")}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def tokenizer_config() -> dict[str, Any]:
    """tokenizer_config.json: BOS and EOS added (EmbeddingGemma wraps every input in both)."""
    decoder = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
               for a in added_tokens()}
    return {"add_bos_token": True, "add_eos_token": True, "added_tokens_decoder": decoder, "bos_token": "<bos>",
            "clean_up_tokenization_spaces": False, "eos_token": "<eos>", "extra_special_tokens": {},
            "model_max_length": 2048, "pad_token": "<pad>", "padding_side": "right", "sp_model_kwargs": {},
            "spaces_between_special_tokens": False, "tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>",
            "use_default_system_prompt": False}


def modules(dense: bool = True) -> list[dict[str, Any]]:
    """sentence-transformers' modules.json (EmbeddingGemma's, or without its Dense modules)."""
    mods = [("", "sentence_transformers.models.Transformer"), ("1_Pooling", "sentence_transformers.models.Pooling")]
    if dense:
        mods += [("2_Dense", "sentence_transformers.models.Dense"), ("3_Dense", "sentence_transformers.models.Dense")]
    mods += [("4_Normalize", "sentence_transformers.models.Normalize")]
    return [{"idx": i, "name": str(i), "path": p, "type": t} for i, (p, t) in enumerate(mods)]


def write_dense(folder: Path, path: str, weight: np.ndarray, **over: Any) -> None:
    """One sentence-transformers Dense module: config.json and model.safetensors."""
    (folder / path).mkdir(parents=True, exist_ok=True)
    conf = {"in_features": weight.shape[1], "out_features": weight.shape[0], "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity", **over}
    (folder / path / "config.json").write_text(json.dumps(conf))
    save_file({"linear.weight": weight}, str(folder / path / "model.safetensors"), metadata={"format": "pt"})


def write_tiny_gemma_embedding(folder: Path, *, config: dict[str, Any] | None = None,
                               tensors: dict[str, np.ndarray] | None = None, dense: bool = True,
                               seed: int = 0) -> Path:
    """Write the folder (made if missing) as embeddinggemma-300m ships: config.json,
    model.safetensors, tokenizer.model, tokenizer.json, tokenizer_config.json,
    special_tokens_map.json, modules.json, 1_Pooling (mean) and, with `dense`, 2_Dense and
    3_Dense; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    c = config or gemma_config()
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    save_file(tensors if tensors is not None else gemma_tensors(c, seed), str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    (folder / "tokenizer.model").write_bytes(spm_model())
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config()))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}))
    (folder / "modules.json").write_text(json.dumps(modules(dense)))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": c["hidden_size"], "pooling_mode_cls_token": False,
         "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False, "include_prompt": True}))
    if dense:
        for path, weight in dense_weights(c, seed).items():
            write_dense(folder, path, weight)
    return folder
