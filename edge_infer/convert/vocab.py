"""A folder's WordPiece or byte-level BPE vocabulary, as llama.cpp's converter writes it
(get_vocab_base).

From tokenizer.json (the `tokenizers` package reads it) or, for WordPiece without one, vocab.txt
with tokenizer_config.json's options, as transformers builds its fast tokenizer from them. Every
id below vocab_size gets a token (a gap becomes `[PAD<id>]`, unused), added special tokens are
control tokens, other added tokens user-defined. WordPiece tokens are written in llama.cpp's
"phantom space" form (`##piece` -> `piece`, any other word -> `\u2581word`, control tokens as they
are); BPE tokens as the tokenizer spells them (byte-level characters).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import TokenType

from edge_infer.convert.bpe_pre import known_pre
from edge_infer.convert.special_vocab import read_json
from edge_infer.errors import ConversionError

log = logging.getLogger(__name__)

# llama.cpp refuses an unknown hash; its WordPiece tokenizer never reads the name, so we write this
UNKNOWN_PRE = "default"
MODELS = ("WordPiece", "BPE")
BERT_SPECIALS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                 "mask_token": "[MASK]"}


@dataclass(frozen=True, slots=True)
class Vocab:
    """tokens (phantom-space form) and token types, one per id below vocab_size; the pre name."""

    tokens: list[str]
    types: list[int]
    pre: str


def read_vocab(folder: Path, vocab_size: int | None, model: str = "WordPiece", arch: str = "bert",
               fallback_pre: str | None = UNKNOWN_PRE) -> Vocab:
    """The folder's vocabulary padded to vocab_size (None: the tokenizer's own size), or a
    ConversionError naming the file. model: the tokenizer.json model type `arch` needs;
    fallback_pre: the pre name for a hash llama.cpp does not know (None: refuse, as it does)."""
    tok = _tokenizer(folder, model, arch)
    vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    if vocab_size is None:
        vocab_size = len(vocab)
    if vocab and max(vocab.values()) >= vocab_size:
        raise ConversionError(f"{folder}: the tokenizer has token id {max(vocab.values())}, past config.json's "
                              f"vocab_size {vocab_size}")
    reverse = {i: t for t, i in vocab.items()}
    added_ids = {a.content: i for i, a in added.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
            continue
        token, kind = reverse[i], TokenType.NORMAL
        if token in added_ids and i in added:
            a = added[i]
            if not a.normalized:  # llama.cpp takes added tokens pre-normalized: as decode(encode(t))
                token = tok.decode(tok.encode(token, add_special_tokens=False).ids, skip_special_tokens=False)
            if a.special or looks_special(token):
                kind = TokenType.CONTROL
            else:
                token, kind = token.replace("\u2581", " "), TokenType.USER_DEFINED
        tokens.append(token)
        types.append(kind)
    if model == "WordPiece":
        tokens = [_phantom(t, k) for t, k in zip(tokens, types)]
    return Vocab(tokens, [int(k) for k in types], _pre_name(tok, folder, fallback_pre))


def _tokenizer(folder: Path, model: str, arch: str) -> Any:
    """tokenizers' Tokenizer for the folder, as transformers' fast tokenizer encodes."""
    from tokenizers import Tokenizer

    if (folder / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # the Rust side raises plain Exception for a malformed file
            raise ConversionError(f"{folder / 'tokenizer.json'}: cannot load it ({e})") from None
        found = read_json(folder / "tokenizer.json").get("model", {}).get("type")
        if found != model:
            raise ConversionError(f"{folder / 'tokenizer.json'}: a {found} tokenizer; {arch} needs {model}")
    elif model == "WordPiece" and (folder / "vocab.txt").is_file():
        tok = _from_vocab_txt(folder)
    else:
        raise ConversionError(f"{folder}: no tokenizer.json" + (" or vocab.txt" if model == "WordPiece" else ""))
    tok.no_truncation()  # as transformers' encode() without truncation or padding
    tok.no_padding()
    return tok


def _from_vocab_txt(folder: Path) -> Any:
    """transformers' BertTokenizerFast from vocab.txt (its BertConverter), options from
    tokenizer_config.json, the special tokens added as special added tokens."""
    from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    conf = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    conf = conf if isinstance(conf, dict) else {}
    names = {k: _content(conf.get(k)) or v for k, v in BERT_SPECIALS.items()}
    try:
        lines = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise ConversionError(f"{folder / 'vocab.txt'}: cannot read it ({e})") from None
    if lines and lines[-1] == "":
        lines.pop()
    vocab = {t.rstrip("\n"): i for i, t in enumerate(lines)}  # a repeated token keeps its last id, as there
    tok = Tokenizer(WordPiece(vocab, unk_token=names["unk_token"], max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=conf.get("tokenize_chinese_chars", True) is not False,
        strip_accents=conf.get("strip_accents"), lowercase=conf.get("do_lower_case", True) is not False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = names["cls_token"], names["sep_token"]
    if cls in vocab and sep in vocab:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(names.values())])
    return tok


def _content(entry: Any) -> str | None:
    v = entry.get("content") if isinstance(entry, dict) else entry
    return v if isinstance(v, str) else None


def looks_special(token: str) -> bool:
    """llama.cpp's does_token_look_special, for added tokens not marked special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
            or (token.startswith("<unused") and token.endswith(">")))


def _phantom(token: str, kind: int) -> str:
    if kind == TokenType.CONTROL:
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def _pre_name(tok: Any, folder: Path, fallback: str | None) -> str:
    digest, name = known_pre(tok)
    if name is not None:
        return name
    if fallback is None:
        raise ConversionError(f"{folder / 'tokenizer.json'}: its pre-tokenizer (hash {digest}) is not one llama.cpp "
                              "knows, so it cannot say how to split text before BPE")
    log.info("pre-tokenizer hash %s is not one llama.cpp knows; writing %r", digest, fallback)
    return fallback
