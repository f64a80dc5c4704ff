"""Tokenizer built from GGUF metadata, token for token identical to llama.cpp's.

`Tokenizer.from_gguf(path)` reads the vocabulary; `encode` and `decode` follow llama.cpp's
`llama_tokenize(add_special, parse_special)` and `llama_detokenize`. The pieces live in
this package's modules: pre-tokenizers (pretok), byte-level BPE (bpe), SentencePiece BPE
(spm), WordPiece (wpm), special-token splitting (special), vocab loading with llama.cpp's
special-token rules (vocab) and streaming decode (detok).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from edge_infer.errors import TokenizerError
from edge_infer.tokenizer.bpe import BYTE_DECODER, BPEModel
from edge_infer.tokenizer.detok import IncrementalDetokenizer, clean_spaces
from edge_infer.tokenizer.pretok import PreTokenizer
from edge_infer.tokenizer.special import SpecialMatcher
from edge_infer.tokenizer.spm import SPACE, SPMModel
from edge_infer.tokenizer.vocab import Attr, Vocab, load_vocab, special_id_key
from edge_infer.tokenizer.wpm import WPMModel

if TYPE_CHECKING:
    from edge_infer.formats.gguf import GGUFFile

__all__ = ["IncrementalDetokenizer", "Tokenizer"]

_HIDDEN = Attr.CONTROL | Attr.UNKNOWN  # not rendered unless special tokens are asked for
_RAW = Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED  # rendered as their stored text
_SURROGATES = re.compile("[\ud800-\udfff]")


class Tokenizer:
    """Encode text to token ids and back, for one GGUF vocabulary (BPE, SPM or WordPiece)."""

    def __init__(self, vocab: Vocab) -> None:
        self._v = vocab
        self._attrs = vocab.attrs
        self._tokens = vocab.tokens
        self._pieces: list[bytes | None] = [None] * len(vocab.tokens)
        self._matchers: dict[bool, SpecialMatcher] = {}
        self._bpe: BPEModel | None = None
        self._spm: SPMModel | None = None
        self._wpm: WPMModel | None = None
        if vocab.kind == "bpe":
            assert vocab.pre is not None
            self._bpe = BPEModel(
                vocab.token_to_id, vocab.merges, PreTokenizer(vocab.pre.splitter),
                ignore_merges=vocab.pre.ignore_merges, escape_whitespace=vocab.pre.escape_whitespace,
                whole_newlines=vocab.pre.gemma4,
            )
        elif vocab.kind == "wpm":
            self._wpm = WPMModel(vocab.token_to_id, vocab.special["unk"], vocab.lowercase, vocab.strip_accents)
        else:
            assert vocab.scores is not None
            self._spm = SPMModel(vocab.token_to_id, vocab.scores)

    @classmethod
    def from_gguf(cls, source: str | os.PathLike[str] | GGUFFile) -> Tokenizer:
        """Build the tokenizer from a GGUF file (a path or an opened GGUFFile)."""
        from edge_infer.formats.gguf import GGUFFile

        if isinstance(source, GGUFFile):
            return cls(load_vocab(source.metadata, source.path))
        with GGUFFile(source) as f:
            return cls(load_vocab(f.metadata, f.path))

    # -- properties -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of tokens."""
        return len(self._tokens)

    @property
    def kind(self) -> str:
        """ "bpe" (GGUF model gpt2 or gemma4), "spm" (SentencePiece, llama) or "wpm" (WordPiece, bert)."""
        return self._v.kind

    @property
    def bos_id(self) -> int | None:
        """BOS token ([CLS] in a WordPiece vocabulary), if any."""
        return self._v.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self._v.special["eos"]

    @property
    def sep_id(self) -> int | None:
        """Separator token ([SEP] in WordPiece vocabularies, whose EOS is unset unless the file names one)."""
        return self._v.special["sep"]

    @property
    def eot_id(self) -> int | None:
        """End-of-turn token (e.g. <|im_end|>, <end_of_turn>), if the vocabulary has one."""
        return self._v.special["eot"]

    @property
    def stop_ids(self) -> frozenset[int]:
        """Tokens that end generation: EOS, end-of-turn and the others llama.cpp calls EOG."""
        return self._v.eog

    @property
    def add_bos(self) -> bool:
        """llama_vocab_get_add_bos: whether encode(add_special=True) starts with BOS (WordPiece: always)."""
        return self._v.add_bos

    @property
    def add_eos(self) -> bool:
        """llama_vocab_get_add_eos (WordPiece's encode ends with SEP instead, whatever this says)."""
        return self._v.add_eos

    @property
    def add_sep(self) -> bool:
        """llama_vocab_get_add_sep: whether a pair of texts (rerank) is joined by SEP."""
        return self._v.add_sep

    @property
    def add_space_prefix(self) -> bool:
        return self._v.add_space_prefix

    @property
    def clean_spaces(self) -> bool:
        """Whether decoding removes spaces before punctuation (clean_up_tokenization_spaces)."""
        return self._v.clean_spaces

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary (e.g. "Ġthe", "▁the", "<0x0A>")."""
        return self._tokens[self._check_id(token_id)]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose stored text is exactly `text`, if any."""
        return self._v.token_to_id.get(text)

    def token_attr(self, token_id: int) -> int:
        """llama.cpp's attribute bits for the token (see tokenizer.vocab.Attr)."""
        return self._attrs[self._check_id(token_id)]

    def is_special(self, token_id: int) -> bool:
        """True for control and unknown tokens: the ones decode(skip_special=True) leaves out."""
        return bool(self._attrs[self._check_id(token_id)] & _HIDDEN)

    # -- encoding ---------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, as llama_tokenize(text, add_special, parse_special).

        add_special: add BOS/EOS as the vocabulary asks (add_bos_token / add_eos_token); WordPiece: BOS ... SEP.
        parse_special: turn control-token text such as "<|im_end|>" into that token;
        otherwise it is plain text (user-defined tokens are always recognised, as in llama.cpp).
        """
        return self.encode_segments([(text, parse_special)], add_special=add_special)

    def encode_segments(self, segments: Iterable[tuple[str, bool]], add_special: bool = True) -> list[int]:
        """Encode text pieces, each with its own parse_special, as one text.

        Special tokens are only recognised inside a piece whose flag is True and never
        across pieces; plain text of neighbouring pieces is tokenized together, so the
        result equals encode("".join(texts)) unless special-token text would be found.
        Chat templates use this to keep message content from producing control tokens.
        """
        frags: list[str | int] = []
        for text, parse_special in segments:
            if not text:
                continue
            if not text.isascii() and _SURROGATES.search(text):
                text = _SURROGATES.sub("\ufffd", text)  # lone surrogates are not UTF-8
            for f in self._matcher(parse_special).partition(text):
                if isinstance(f, str) and frags and isinstance(frags[-1], str):
                    frags[-1] += f
                else:
                    frags.append(f)
        return self._encode_fragments(frags, add_special)

    def _matcher(self, parse_special: bool) -> SpecialMatcher:
        m = self._matchers.get(parse_special)
        if m is None:
            # llama.cpp's special-token cache: control, user-defined and unknown tokens,
            # longest text first; without parse_special only user-defined ones count.
            want = _RAW if parse_special else Attr.USER_DEFINED
            ids = [i for i, a in enumerate(self._attrs) if a & want and (parse_special or not a & _HIDDEN)]
            ids.sort(key=lambda i: -len(self._tokens[i].encode("utf-8", "surrogateescape")))
            specials = [(self._tokens[i], i) for i in ids]
            lstrip = {i for i in ids if self._attrs[i] & Attr.LSTRIP}
            rstrip = {i for i in ids if self._attrs[i] & Attr.RSTRIP}
            m = self._matchers[parse_special] = SpecialMatcher(specials, lstrip, rstrip)
        return m

    def _encode_fragments(self, frags: Sequence[str | int], add_special: bool) -> list[int]:
        v = self._v
        out: list[int] = []
        if self._wpm is not None:  # llama.cpp adds [CLS] ... [SEP] whatever add_bos/add_eos say
            ids = self._wpm.encode_fragments(frags)
            return [self._required("bos"), *ids, self._required("sep")] if add_special else ids
        if add_special and v.add_bos:
            out.append(self._required("bos"))
        if self._bpe is not None:
            bpe = self._bpe
            for f in frags:
                if isinstance(f, str):
                    bpe.encode(f, out)
                else:
                    out.append(f)
        else:
            assert self._spm is not None
            spm, prefix = self._spm, v.add_space_prefix
            prev_special = True  # llama.cpp: the first fragment counts as after a special token
            for f in frags:
                if isinstance(f, str):
                    text = " " + f if prefix and prev_special else f
                    spm.encode(text.replace(" ", SPACE), out)
                    prev_special = False
                else:
                    out.append(f)
                    prev_special = True
        if add_special and v.add_eos:
            out.append(self._required("eos"))
        return out

    def _required(self, role: str) -> int:
        i = self._v.special[role]
        if i is None:
            raise TokenizerError(f"the vocabulary has no {role.upper()} token to add ({special_id_key(role)})")
        return i

    # -- decoding ---------------------------------------------------------------------------
    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """The token's bytes as llama.cpp's token_to_piece gives them (lstrip 0).

        With special=False control and unknown tokens give b"" (they are not rendered).
        """
        if self._attrs[self._check_id(token_id)] & _HIDDEN and not special:
            return b""
        p = self._pieces[token_id]
        if p is None:
            p = self._pieces[token_id] = self._make_piece(token_id)
        return p

    def _make_piece(self, i: int) -> bytes:
        attr, text = self._attrs[i], self._tokens[i]
        if attr & _RAW:
            return text.encode("utf-8", "surrogateescape")
        if attr & Attr.NORMAL:
            if self._v.pre is None or self._v.pre.escape_whitespace:  # SPM, WPM, or SPM-style BPE
                return text.replace(SPACE, " ").encode("utf-8", "surrogateescape")
            return _bpe_piece(text)
        if attr & Attr.BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                raise TokenizerError(f"byte token {i} has text {text!r}, expected <0xNN>") from None
        return b""  # unused and undefined tokens render as nothing

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """Raw bytes of the ids, as llama_detokenize(remove_special=False, unparse_special=not skip_special)."""
        piece = self.token_to_piece
        special = not skip_special
        parts = [piece(i, special) for i in ids]
        if parts and self._v.add_space_prefix and parts[0][:1] == b" ":
            parts[0] = parts[0][1:]  # the space SPM put in front of the text
        data = b"".join(parts)
        return clean_spaces(data) if self._v.clean_spaces else data

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of the ids; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", "replace")

    def detokenizer(self, skip_special: bool = False) -> IncrementalDetokenizer:
        """A fresh streaming decoder for one sequence."""
        return IncrementalDetokenizer(self, skip_special=skip_special)

    def _check_id(self, token_id: int) -> int:
        if not 0 <= token_id < len(self._tokens):
            raise TokenizerError(f"token id {token_id} is out of range [0, {len(self._tokens)})")
        return token_id

    def __repr__(self) -> str:
        pre = f", pre={self._v.pre.splitter}" if self._v.pre else ""
        return f"Tokenizer({self._v.kind}{pre}, vocab_size={self.vocab_size}, bos={self.bos_id}, eos={self.eos_id})"


def _bpe_piece(text: str) -> bytes:
    # Byte-level token text back to bytes; llama.cpp marks characters outside the byte map.
    try:
        return bytes([BYTE_DECODER[c] for c in text])
    except KeyError:
        pass
    raw = text.encode("utf-8", "surrogateescape")
    out = bytearray()
    for c in text:
        b = BYTE_DECODER.get(c)
        if b is not None:
            out.append(b)
            continue
        utf8 = (c if not "\ud800" <= c <= "\udfff" else "\ufffd").encode("utf-8")
        out += b"[UNK_BYTE_0x" + utf8.hex().encode() + raw + b"]"
    return bytes(out)
