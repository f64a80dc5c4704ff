"""The WordPiece vocabulary of a BERT folder, as llama.cpp's converter writes it.

From tokenizer.json (the `tokenizers` package reads it) or, without one, vocab.txt with
tokenizer_config.json's options, as transformers builds its fast tokenizer from them. Every id
below vocab_size gets a token (a gap becomes `[PAD<id>]`, unused), added special tokens are
control tokens, and the tokens are written in llama.cpp's "phantom space" form: `##piece` ->
`piece`, any other word -> `\u2581word`, control tokens as they are.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import TokenType

from edge_infer.convert.special_vocab import read_json
from edge_infer.errors import ConversionError

log = logging.getLogger(__name__)

# llama.cpp's get_vocab_base_pre: the tokens of this text (special tokens added) identify the
# pre-tokenizer by their sha256. Copied from its convert_hf_to_gguf.py.
CHKTXT = (
    '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d'
    '\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 333'
    '3 33333 333333 3333333 33333333 3.3 3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2'
    '\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001f601 ?\u6211\u60f3\u5728apple'
    '\u5de5\u4f5c1314151\u5929\uff5e ------======= \u043d\u0435\u0449\u043e \u043d\u0430 '
    '\u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 \'\'\'\'\'\'```````""""......!!!!'
    '!!?????? I\'ve been \'told he\'s there, \'RE you sure? \'M not sure I\'ll make it, \'D y'
    'ou like some tea? We\'Ve a\'lL'
)
# Those of its hashes a WordPiece tokenizer gives; its table is a chain of `if`s, so where a hash
# appears twice the later name wins (bge-small's hash also stands for jina-v2-en, later).
KNOWN_PRE = {
    "0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f": "jina-v2-en",  # bert-base-uncased, bge-small
    "8e62295832751ca1e8f92f2226f403dea30dc5165e448b5bfa05af5340c64ec7": "bert-bge-large",  # bge-large-zh
    "c7699093ba4255a91e702aa38a596aa81669f3525dae06c2953267dde580f448": "jina-v1-en",
}
# llama.cpp refuses an unknown hash; its WordPiece tokenizer never reads the name, so we write this
UNKNOWN_PRE = "default"
BERT_SPECIALS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                 "mask_token": "[MASK]"}


@dataclass(frozen=True, slots=True)
class Vocab:
    """tokens (phantom-space form) and token types, one per id below vocab_size; the pre name."""

    tokens: list[str]
    types: list[int]
    pre: str


def read_vocab(folder: Path, vocab_size: int) -> Vocab:
    """The folder's vocabulary padded to vocab_size, or a ConversionError naming the file."""
    tok = _tokenizer(folder)
    vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
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
            if a.special or _looks_special(token):
                kind = TokenType.CONTROL
            else:
                token, kind = token.replace("\u2581", " "), TokenType.USER_DEFINED
        tokens.append(token)
        types.append(kind)
    tokens = [_phantom(t, k) for t, k in zip(tokens, types)]
    return Vocab(tokens, [int(k) for k in types], _pre_name(tok))


def _tokenizer(folder: Path) -> Any:
    """tokenizers' Tokenizer for the folder, as transformers' fast tokenizer encodes."""
    from tokenizers import Tokenizer

    if (folder / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # the Rust side raises plain Exception for a malformed file
            raise ConversionError(f"{folder / 'tokenizer.json'}: cannot load it ({e})") from None
        model = read_json(folder / "tokenizer.json").get("model", {}).get("type")
        if model != "WordPiece":
            raise ConversionError(f"{folder / 'tokenizer.json'}: a {model} tokenizer; bert needs WordPiece")
    elif (folder / "vocab.txt").is_file():
        tok = _from_vocab_txt(folder)
    else:
        raise ConversionError(f"{folder}: no tokenizer.json or vocab.txt")
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


def _looks_special(token: str) -> bool:
    """llama.cpp's does_token_look_special, for added tokens not marked special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
            or (token.startswith("<unused") and token.endswith(">")))


def _phantom(token: str, kind: int) -> str:
    if kind == TokenType.CONTROL:
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def _pre_name(tok: Any) -> str:
    digest = hashlib.sha256(str(tok.encode(CHKTXT).ids).encode()).hexdigest()
    if digest not in KNOWN_PRE:
        log.info("pre-tokenizer hash %s is not one llama.cpp knows; writing %r", digest, UNKNOWN_PRE)
    return KNOWN_PRE.get(digest, UNKNOWN_PRE)
