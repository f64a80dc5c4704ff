"""The special tokens of a Hugging Face folder, as llama.cpp's converter finds them.

The same reading as the gguf-py that llama.cpp's converter ships (`gguf.SpecialVocab`): a BPE
tokenizer's merges (tokenizer.json's, else merges.txt), the special token ids from
tokenizer_config.json's `*_token` names looked up in tokenizer.json's added tokens, then
config.json's `*_token_id`; whether to add BOS / EOS / SEP
from the post-processor; the BertNormalizer's lowercase and strip_accents flags; a chat
template. It lives here rather than being imported because the released gguf package lags that
copy: its SpecialVocab does not write the normalizer flags, without which llama.cpp's WordPiece
tokenizer neither lowercases nor strips accents.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUFWriter

from edge_infer.errors import ConversionError

log = logging.getLogger(__name__)

TOKEN_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
# gguf.Keys.Tokenizer.NORMALIZER_* in llama.cpp's gguf-py (not yet in the released package)
KEY_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
KEY_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"


@dataclass(slots=True)
class Specials:
    """What goes into the file: merges, ids by type, add-flags by type, template, normalizer flags."""

    merges: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    add: dict[str, bool] = field(default_factory=dict)
    chat_template: str | list[dict[str, str]] | None = None
    lowercase: bool | None = None
    strip_accents: bool | None = None

    def write(self, w: GGUFWriter) -> None:
        """Add the keys in gguf-py's order; a type without a writer method (cls) is skipped, as there."""
        if self.merges:
            w.add_token_merges(self.merges)
        for typ, tid in self.ids.items():
            if (add_id := getattr(w, f"add_{typ}_token_id", None)) is not None:
                add_id(tid)
        for typ, value in self.add.items():
            if (add_flag := getattr(w, f"add_add_{typ}_token", None)) is not None:
                add_flag(value)
        if self.chat_template is not None:
            w.add_chat_template(self.chat_template)
        if self.lowercase is not None:
            w.add_bool(KEY_LOWERCASE, self.lowercase)
        if self.strip_accents is not None:
            w.add_bool(KEY_STRIP_ACCENTS, self.strip_accents)


def read_json(path: Path) -> Any:
    """A JSON file's value, or a ConversionError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConversionError(f"{path}: cannot read it as JSON ({e})") from None


def read_specials(folder: Path, n_vocab: int | None, load_merges: bool = False) -> Specials:
    """The folder's special tokens, ids at or past n_vocab skipped (as gguf-py does; None: none
    skipped), and with load_merges its BPE merges."""
    s = Specials()
    types = list(TOKEN_TYPES)
    tok = read_json(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else None
    conf = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else None
    tok = tok if isinstance(tok, dict) else None
    conf = conf if isinstance(conf, dict) else None
    added: list[Any] = []
    if tok:
        if isinstance(norm := tok.get("normalizer"), dict):
            _normalizer(s, norm)
        if load_merges:
            s.merges = _merges(folder / "tokenizer.json", tok.get("model", {}).get("merges"))
        added = tok.get("added_tokens") or []
        _post_processor(s, tok.get("post_processor"), conf, types)
    if conf:
        s.chat_template = _chat_template(folder, conf)
        for typ in types:
            add_entry = conf.get(f"add_{typ}_token")
            if isinstance(add_entry, bool):
                s.add.setdefault(typ, add_entry)  # the post-processor's answer wins
            entry = conf.get(f"{typ}_token")
            content = entry.get("content") if isinstance(entry, dict) else entry
            if isinstance(content, str):
                tid = next((a.get("id") for a in added if isinstance(a, dict) and a.get("content") == content), None)
                _set(s, typ, tid, n_vocab)
    if (folder / "config.json").is_file():
        config = read_json(folder / "config.json")
        if isinstance(config, dict):
            for typ in types:
                tid = config.get(f"{typ}_token_id")
                if tid is None and isinstance(config.get("text_config"), dict):
                    tid = config["text_config"].get(f"{typ}_token_id")
                _set(s, typ, tid, n_vocab)
    if load_merges and not s.merges:
        s.merges = _merges_txt(folder / "merges.txt")
    return s


def _merges(path: Path, merges: Any) -> list[str]:
    """tokenizer.json's merges as "a b" strings; the pair form (transformers >= 4.45) joined with
    its spaces written as U+0120, as gguf-py does."""
    if not isinstance(merges, list) or not merges:
        return []
    if all(isinstance(m, str) for m in merges):
        return list(merges)
    if all(isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m) for m in merges):
        return [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in m) for m in merges]
    raise ConversionError(f"{path}: model.merges is neither a list of strings nor a list of pairs")


def _merges_txt(path: Path) -> list[str]:
    """merges.txt's "a b" lines (a leading #version line skipped, malformed lines dropped)."""
    if not path.is_file():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path}: cannot read it ({e})") from None
    if lines and lines[0].strip().startswith("#"):
        lines = lines[1:]
    pairs = [line.split(None, 3) for line in lines if line.strip()]
    return [f"{p[0]} {p[1]}" for p in pairs if len(p) == 2]


def _set(s: Specials, typ: str, tid: Any, n_vocab: int | None) -> None:
    """The first id found for a type stays (a JSON true is no id, though Python counts it an int)."""
    if not isinstance(tid, int) or isinstance(tid, bool):
        return
    if tid < 0:
        raise ConversionError(f"special token {typ}: invalid id {tid}")
    if n_vocab is None or tid < n_vocab:
        s.ids.setdefault(typ, tid)
    else:
        log.warning("special token %s: id %d is past the vocabulary (%d); skipped", typ, tid, n_vocab)


def _normalizer(s: Specials, norm: dict[str, Any]) -> None:
    kind = norm.get("type")
    if kind == "Lowercase":
        s.lowercase = True
    elif kind == "StripAccents":
        s.strip_accents = True
    elif kind == "BertNormalizer":
        if "lowercase" in norm:
            s.lowercase = norm["lowercase"]
        if "strip_accents" in norm:
            s.strip_accents = norm["strip_accents"]
    elif kind == "Sequence":
        for n in norm.get("normalizers", []):
            if isinstance(n, dict):
                _normalizer(s, n)


def _special_id(item: Any) -> Any:
    return item.get("SpecialToken", {}).get("id") if isinstance(item, dict) else None


def _post_processor(s: Specials, post: Any, conf: dict[str, Any] | None, types: list[str]) -> None:
    """gguf-py's reading of the post-processor, which also fills conf's missing bos/eos/cls/sep
    (bos from cls and eos from sep even without a post-processor)."""
    bos, cls = (conf or {}).get("bos_token"), (conf or {}).get("cls_token")
    eos, sep = (conf or {}).get("eos_token"), (conf or {}).get("sep_token")
    if not bos and cls and conf:
        conf["bos_token"] = bos = cls
    if not eos and sep and conf:
        conf["eos_token"] = eos = sep
    if not isinstance(post, dict):
        return
    for proc in post.get("processors", [post]):
        kind = proc.get("type") if isinstance(proc, dict) else None
        if kind == "ByteLevel":
            s.add.setdefault("bos", False)
            s.add.setdefault("eos", False)
        elif kind == "RobertaProcessing":
            s.add.update(bos=True, eos=True, sep=True)
            if not cls and conf:
                conf["cls_token"] = cls = proc.get("cls", [bos])[0]
            if not sep and conf:
                conf["sep_token"] = sep = proc.get("sep", [eos])[0]
        elif kind == "TemplateProcessing":
            bos, cls, eos = _template(s, proc, conf, types, bos, cls, eos, sep)


def _template(s: Specials, proc: dict[str, Any], conf: dict[str, Any] | None, types: list[str],
              bos: Any, cls: Any, eos: Any, sep: Any) -> tuple[Any, Any, Any]:
    """TemplateProcessing, crudely as gguf-py reads it: a leading special token means add BOS,
    a trailing one add EOS, a special token between A and B of the pair template add SEP."""
    single, pair = proc.get("single", []), proc.get("pair", [])
    first = last = None
    if len(single) > 1:
        if first := _special_id(single[0]):
            if not conf:
                bos = first
            elif first not in (bos, cls):
                if not bos:
                    conf["bos_token"] = bos = first
                if not cls:
                    conf["cls_token"] = cls = first
            s.add["bos"] = first in (bos, cls)
        if last := _special_id(single[-1]):
            if not conf:
                eos = last
            elif last != eos:
                for extra in ("eot", "eom"):
                    if extra not in types:
                        types.append(extra)
                        conf[f"{extra}_token"] = eos
                        break
                conf["eos_token"] = eos = last
            s.add["eos"] = last == eos
    if pair:
        start = 1 if first and _special_id(pair[0]) == first else 0
        stop = -1 if last and _special_id(pair[-1]) == last else None
        middle = pair[start:stop]
        if middle:
            a = middle[0].get("Sequence", {}).get("id") if isinstance(middle[0], dict) else None
            b = middle[-1].get("Sequence", {}).get("id") if isinstance(middle[-1], dict) else None
            if a == "A" and b == "B" and (middle := middle[1:-1]):
                add_sep = False
                entry = _special_id(middle[0])
                if entry and entry in (sep, eos) and not last:
                    add_sep = True
                if len(middle) == 2 and (entry := _special_id(middle[1])) and entry in (sep, eos):
                    add_sep = True
                s.add["sep"] = add_sep
                if add_sep and not sep and conf:
                    conf["sep_token"] = eos
    return bos, cls, eos


def _chat_template(folder: Path, conf: dict[str, Any]) -> str | list[dict[str, str]] | None:
    alt: Any = None
    jinja, as_json = folder / "chat_template.jinja", folder / "chat_template.json"
    try:
        if jinja.is_file():
            alt = jinja.read_text(encoding="utf-8")
            if extra := sorted((folder / "additional_chat_templates").glob("*.jinja")):
                alt = [{"name": "default", "template": alt}]
                alt += [{"name": p.stem, "template": p.read_text(encoding="utf-8")} for p in extra]
        elif as_json.is_file() and isinstance(v := read_json(as_json), dict):
            alt = v.get("chat_template")
    except (OSError, UnicodeDecodeError) as e:
        raise ConversionError(f"{folder}: cannot read its chat template ({e})") from None
    template = conf.get("chat_template", alt)
    if template is None or isinstance(template, (str, list)):
        return template
    log.warning("%s: chat_template is neither a string nor a list; ignored", folder / "tokenizer_config.json")
    return None
