"""A GGUF vocabulary as llama.cpp loads it: token attributes, special ids, stop (EOG) tokens.

llama.cpp does more than read the token types: it fills special ids from defaults when
keys are missing, recognises end-of-turn and fill-in-the-middle tokens by their text,
marks those as control tokens, and collects the end-of-generation set from the same
texts. We mirror that (llama-vocab.cpp, `load()`) so encode, decode and stop tokens agree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from edge_infer.errors import TokenizerError, UnsupportedModelError
from edge_infer.tokenizer.pretok import PreTokenizerSpec, pre_tokenizer_spec

__all__ = ["Attr", "Vocab", "load_vocab", "special_id_key"]


class Attr:
    """llama_token_attr bits."""

    UNDEFINED, UNKNOWN, UNUSED, NORMAL, CONTROL = 0, 1, 2, 4, 8
    USER_DEFINED, BYTE, NORMALIZED, LSTRIP, RSTRIP = 16, 32, 64, 128, 256


# GGUF token_type -> attribute (anything else is UNDEFINED).
_TYPE_ATTR = {
    1: Attr.NORMAL,
    2: Attr.UNKNOWN,
    3: Attr.CONTROL,
    4: Attr.USER_DEFINED,
    5: Attr.UNUSED,
    6: Attr.BYTE,
}

# Texts llama.cpp recognises, in the order we try them (llama.cpp walks a hash map, so
# when a vocabulary has two candidates for one role its pick is arbitrary).
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
)
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

# Control, user-defined and unknown tokens are found in prompt text by one regex over all their
# texts (special.py), built at the first request at ~20-40 us a token: 200k of them took seconds.
# Real vocabularies have up to ~6.4k (gemma3); more than this is refused at load.
MAX_SPECIAL_TOKENS = 1 << 15
_SPECIAL = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN

_ID_KEYS = (
    ("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"), ("eom", "eom_token_id"),
    ("unk", "unknown_token_id"), ("sep", "seperator_token_id"), ("pad", "padding_token_id"),
    ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"), ("fim_suf", "fim_suf_token_id"),
    ("fim_mid", "fim_mid_token_id"), ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
    ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"), ("fim_suf", "suffix_token_id"),
    ("fim_mid", "middle_token_id"),
)


def special_id_key(role: str) -> str:
    """The GGUF key that names a special token's id ("sep" -> tokenizer.ggml.seperator_token_id)."""
    return "tokenizer.ggml." + next(key for name, key in _ID_KEYS if name == role)


@dataclass(slots=True, eq=False)
class Vocab:
    """Everything the tokenizer needs from the GGUF metadata, resolved as llama.cpp does."""

    kind: str  # "bpe", "spm" or "wpm"
    tokens: list[str]
    token_to_id: dict[str, int]
    attrs: list[int]
    scores: list[float] | None
    merges: list[str]
    pre: PreTokenizerSpec | None
    special: dict[str, int | None]  # bos, eos, eot, eom, unk, sep, pad, mask, fim_*
    eog: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    add_sep: bool = False  # llama_vocab_get_add_sep: SEP between the two texts of a pair (rerank)
    lowercase: bool = True  # WPM normalizer (tokenizer.ggml.normalizer.*)
    strip_accents: bool = True


def _get(meta: dict[str, Any], key: str, kind: type, where: str) -> Any:
    v = meta.get(key)
    if v is not None and not isinstance(v, kind):
        raise TokenizerError(f"{where}: {key} has type {type(v).__name__}, expected {kind.__name__}")
    return v


def load_vocab(meta: dict[str, Any], where: str = "GGUF") -> Vocab:
    """Build the Vocab from GGUF metadata; `where` names the file in error messages."""
    model = _get(meta, "tokenizer.ggml.model", str, where)
    if model is None:
        raise TokenizerError(f"{where}: no tokenizer.ggml.model in the metadata")
    if model not in ("gpt2", "gemma4", "llama", "bert"):
        raise UnsupportedModelError(
            f"{where}: tokenizer.ggml.model {model!r} is not supported (gpt2, gemma4, llama, bert)"
        )
    tokens = _get(meta, "tokenizer.ggml.tokens", list, where)
    if not tokens:
        raise TokenizerError(f"{where}: tokenizer.ggml.tokens is missing or empty")
    n = len(tokens)
    if "" in tokens:  # llama.cpp renames empty tokens so that each text stays unique
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    token_to_id = {t: i for i, t in enumerate(tokens)}  # a repeated text maps to its last id

    types = _get(meta, "tokenizer.ggml.token_type", list, where)
    if types is None:
        attrs = [Attr.NORMAL] * n
    elif len(types) < n:
        raise TokenizerError(f"{where}: tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    else:
        attrs = [_TYPE_ATTR.get(t, Attr.UNDEFINED) for t in types[:n]]
    scores = _get(meta, "tokenizer.ggml.scores", list, where)
    if scores is not None and len(scores) < n:
        raise TokenizerError(f"{where}: tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")

    if model in ("gpt2", "gemma4"):
        kind = "bpe"
        merges = _get(meta, "tokenizer.ggml.merges", list, where)
        if merges is None:
            raise TokenizerError(f"{where}: a {model} (BPE) vocabulary needs tokenizer.ggml.merges")
        # llama.cpp ignores tokenizer.ggml.pre for gemma4 and has no default special ids for it.
        pre_name = "gemma4" if model == "gemma4" else _get(meta, "tokenizer.ggml.pre", str, where)
        pre = pre_tokenizer_spec(pre_name)
        if pre is None:
            raise UnsupportedModelError(f"{where}: tokenizer.ggml.pre {pre_name!r} is not supported")
        special: dict[str, int | None] = {"bos": None, "eos": None} if model == "gemma4" else {"bos": 11, "eos": 11}
        special["unk"] = None
        add_bos, add_space_prefix, clean_spaces = bool(pre.add_bos), False, pre.clean_spaces
        add_sep = pre_name in ("jina-v1-en", "jina-v2-code", "roberta-bpe")
        if pre.no_bos:
            special["bos"] = None
    elif model == "bert":
        # llama.cpp's WPM defaults (bert-base ids); tokenizer.ggml.pre is not read for WPM
        kind, merges, pre = "wpm", [], None
        special = {"bos": 101, "eos": None, "unk": 100, "sep": 102, "pad": 0, "mask": 103}
        add_bos, add_sep, add_space_prefix, clean_spaces = True, True, False, True
    else:
        kind, merges, pre = "spm", [], None
        if scores is None:
            scores = [0.0] * n
        special = {"bos": 1, "eos": 2, "unk": 0}
        add_bos, add_sep, add_space_prefix, clean_spaces = True, False, True, False
    for name in ("eot", "eom", "sep", "pad", "mask", *_FIM_TEXTS):
        special.setdefault(name, None)
    for name, key in _ID_KEYS:
        cur = special[name]
        if cur is not None and cur >= n:
            special[name] = None
        v = meta.get("tokenizer.ggml." + key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n:
            special[name] = v
    if pre is not None and pre.no_bos:
        special["bos"] = None

    flags = {
        k: meta.get("tokenizer.ggml." + k)
        for k in ("add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix",
                  "normalizer.lowercase", "normalizer.strip_accents")
    }
    add_bos = flags["add_bos_token"] if isinstance(flags["add_bos_token"], bool) else add_bos
    add_eos = flags["add_eos_token"] if isinstance(flags["add_eos_token"], bool) else False
    add_sep = flags["add_sep_token"] if isinstance(flags["add_sep_token"], bool) else add_sep
    lowercase = flags["normalizer.lowercase"] if isinstance(flags["normalizer.lowercase"], bool) else True
    strip = flags["normalizer.strip_accents"]
    strip_accents = strip if isinstance(strip, bool) else lowercase  # llama.cpp: follows lowercase
    if pre is not None and pre.gemma4:
        add_bos = True  # llama.cpp overrides a false add_bos_token for gemma4
    if isinstance(flags["add_space_prefix"], bool):
        add_space_prefix = flags["add_space_prefix"]

    eog = _detect_special_texts(tokens, token_to_id, attrs, special)
    vocab = Vocab(kind, tokens, token_to_id, attrs, scores, merges, pre, special, eog,
                  add_bos, add_eos, add_space_prefix, clean_spaces, add_sep, lowercase, strip_accents)
    _name_based_attrs(vocab, str(meta.get("general.name") or ""))
    n_special = sum(k for a, k in Counter(attrs).items() if a & _SPECIAL)
    if n_special > MAX_SPECIAL_TOKENS:
        raise UnsupportedModelError(
            f"{where}: {n_special} control, user-defined and unknown tokens (tokenizer.ggml.token_type), "
            f"more than the {MAX_SPECIAL_TOKENS} edge-infer looks for in prompts"
        )
    return vocab


def _detect_special_texts(
    tokens: list[str], tid: dict[str, int], attrs: list[int], special: dict[str, int | None]
) -> frozenset[int]:
    def mark_control(i: int) -> None:
        attrs[i] |= Attr.CONTROL

    def first_present(texts: tuple[str, ...]) -> int | None:
        return next((tid[t] for t in texts if t in tid), None)

    for role, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), *_FIM_TEXTS.items()):
        if special[role] is None:
            found = first_present(texts)
            if found is not None:
                special[role] = found
                mark_control(found)
    for i, a in enumerate(attrs):  # control tokens named "unused" are unused
        if a & Attr.CONTROL and "unused" in tokens[i]:
            attrs[i] = a | Attr.UNUSED
    eog = {t for t in (special[r] for r in ("fim_pad", "fim_rep", "fim_sep")) if t is not None}
    for t in _EOG_TEXTS:
        if t in tid:
            eog.add(tid[t])
            mark_control(tid[t])
    for t in _ALWAYS_RENDERED:
        if t in tid:
            attrs[tid[t]] = Attr.USER_DEFINED
    eog.update(t for t in (special[r] for r in ("eos", "eot", "eom")) if t is not None)
    by_text = {tokens[i]: i for i in eog}
    end = by_text.get("<|end|>")
    if end is not None and (
        ("<|return|>" in by_text and "<|call|>" in by_text) or ("<|calls|>" in by_text and "<|flush|>" in by_text)
    ):
        eog.discard(end)
        attrs[end] = Attr.USER_DEFINED
    s = by_text.get("</s>")
    if s is not None and ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text):
        eog.discard(s)
        attrs[s] = Attr.NORMAL
    return frozenset(eog)


def _name_based_attrs(vocab: Vocab, name: str) -> None:
    # llama.cpp sets strip attributes for a few models by name; only phi-3 uses SPM/BPE.
    name = name.lower()
    if "phi-3" in name or "phi3" in name:
        tid, attrs = vocab.token_to_id, vocab.attrs
        for i, a in enumerate(attrs):
            if a & (Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN):
                attrs[i] = a | Attr.RSTRIP
        if "</s>" in tid:
            attrs[tid["</s>"]] |= Attr.RSTRIP
        for t in ("<unk>", "<s>", "<|endoftext|>"):
            if t in tid:
                attrs[tid[t]] &= ~Attr.RSTRIP
