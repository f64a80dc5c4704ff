"""A SentencePiece vocabulary (tokenizer.model) as llama.cpp's converter reads it
(TextModel._create_vocab_sentencepiece): every id below the config's vocab_size gets a piece, a
score and a type (unknown, control, unused, byte from the model; normal otherwise), ids the model
lacks become `[PAD<id>]` (unused, score -10000); then added_tokens.json's tokens (user-defined)
and tokenizer_config.json's added_tokens_decoder (control when special or looking special, else
user-defined with its U+2581 written as spaces), both at score -1000, override their ids.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import TokenType

from edge_infer.convert.special_vocab import read_json
from edge_infer.convert.vocab import looks_special
from edge_infer.errors import ConversionError

log = logging.getLogger(__name__)

PAD_SCORE = -10000.0  # llama.cpp's score for an id the tokenizer does not have
ADDED_SCORE = -1000.0  # and for an added token


@dataclass(frozen=True, slots=True)
class SpmVocab:
    """pieces, scores and token types, one per id below vocab_size."""

    tokens: list[str]
    scores: list[float]
    types: list[int]


def read_spm_vocab(folder: Path, vocab_size: int) -> SpmVocab:
    """The folder's tokenizer.model padded to vocab_size, its added tokens applied; a
    ConversionError naming the file when it cannot be read or has more pieces than vocab_size."""
    from sentencepiece import SentencePieceProcessor  # only to convert a SentencePiece model

    path = folder / "tokenizer.model"
    if not path.is_file():
        raise ConversionError(f"{folder}: no tokenizer.model (the SentencePiece model this architecture's "
                              "vocabulary is read from)")
    sp = SentencePieceProcessor()
    try:
        sp.LoadFromFile(str(path))
    except (OSError, RuntimeError) as e:
        raise ConversionError(f"{path}: not a readable SentencePiece model ({e})") from None
    if sp.vocab_size() > vocab_size:
        raise ConversionError(f"{path}: {sp.vocab_size()} pieces, more than config.json's vocab_size {vocab_size}")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores = [PAD_SCORE] * vocab_size
    types = [int(TokenType.UNUSED)] * vocab_size
    for i in range(sp.vocab_size()):
        kind = TokenType.NORMAL
        if sp.IsUnknown(i):
            kind = TokenType.UNKNOWN
        elif sp.IsControl(i):
            kind = TokenType.CONTROL
        elif sp.IsUnused(i):
            kind = TokenType.UNUSED
        elif sp.IsByte(i):
            kind = TokenType.BYTE
        tokens[i], scores[i], types[i] = sp.IdToPiece(i), sp.GetScore(i), int(kind)
    for i, token, added_type in _added(folder, vocab_size):
        tokens[i], scores[i], types[i] = token, ADDED_SCORE, added_type
    return SpmVocab(tokens, scores, types)


def _added(folder: Path, vocab_size: int) -> list[tuple[int, str, int]]:
    """(id, token, type) of added_tokens.json's then added_tokens_decoder's tokens, in order;
    ids at or past vocab_size skipped with a log line, as llama.cpp does."""
    out: list[tuple[int, str, int]] = []
    if (path := folder / "added_tokens.json").is_file():
        entries = read_json(path)
        if not isinstance(entries, dict):
            raise ConversionError(f"{path}: expected an object of token -> id")
        for token, i in entries.items():
            if _in_range(path, i, vocab_size):
                out.append((i, token, int(TokenType.USER_DEFINED)))
    if (path := folder / "tokenizer_config.json").is_file():
        conf = read_json(path)
        decoder = conf.get("added_tokens_decoder", {}) if isinstance(conf, dict) else {}
        if not isinstance(decoder, dict):
            raise ConversionError(f"{path}: added_tokens_decoder must be an object")
        for key, entry in decoder.items():
            i, token = _decoder_entry(path, key, entry)
            if not _in_range(path, i, vocab_size):
                continue
            if entry.get("special") or looks_special(token):
                out.append((i, token, int(TokenType.CONTROL)))
            else:  # llama.cpp takes user-defined tokens pre-normalized: spaces as spaces
                out.append((i, token.replace("\u2581", " "), int(TokenType.USER_DEFINED)))
    return out


def _decoder_entry(path: Path, key: str, entry: Any) -> tuple[int, str]:
    try:
        i = int(key)
    except ValueError:
        raise ConversionError(f"{path}: added_tokens_decoder key {key!r} is not a token id") from None
    if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
        raise ConversionError(f"{path}: added_tokens_decoder[{key!r}] has no content string")
    return i, entry["content"]


def _in_range(path: Path, i: Any, vocab_size: int) -> bool:
    if not isinstance(i, int) or isinstance(i, bool) or i < 0:
        raise ConversionError(f"{path}: token id {i!r} is not a non-negative integer")
    if i >= vocab_size:
        log.warning("%s: token id %d is past the vocabulary (%d); ignored", path, i, vocab_size)
        return False
    return True
