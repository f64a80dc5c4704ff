"""Message content given as a list of parts (OpenAI's `[{"type": "text", ...}, {"type":
"image_url", ...}]`) made into the string a chat template prints, as llama.cpp's common/chat.cpp
joins them: text parts with "\\n" between them, an image part as a media marker with no newline
before or after it. The images themselves are returned in order for the caller to load."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from edge_infer.errors import ChatTemplateError


def media_marker() -> str:
    """A marker no request text holds (private-use characters around a random number)."""
    return f"\ue010media{secrets.randbelow(10**12)}\ue011"


def image_ref(part: Mapping[str, Any], where: str) -> Any:
    """What an image part names: image_url.url (or image_url given as a string), or `image`
    (the offline API: a path, bytes or a pixel array)."""
    if part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, Mapping) else url
        if not isinstance(url, str) or not url:
            raise ChatTemplateError(f"{where}: an image_url part needs image_url.url (a data: URL, a URL or a path)")
        return url
    if "image" not in part:
        raise ChatTemplateError(f"{where}: an image part needs an 'image' (a path, bytes or a pixel array)")
    return part["image"]


def split_parts(messages: Sequence[Mapping[str, Any]], marker: str) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages whose list contents are joined into strings with `marker` where each image was,
    and the images' references in prompt order. Without an image part anywhere the messages
    are returned as they are (a template may print text parts itself)."""
    if not any(isinstance(m, Mapping) and isinstance(m.get("content"), list)
               and any(isinstance(p, Mapping) and p.get("type") in ("image_url", "image") for p in m["content"])
               for m in messages):
        return list(messages), []  # type: ignore[arg-type]
    out: list[dict[str, Any]] = []
    refs: list[Any] = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list):
            out.append(dict(m) if isinstance(m, Mapping) else m)
            continue
        text, last_media = "", False
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text" and isinstance(part.get("text"), str):
                if not last_media and text:
                    text += "\n"
                text += part["text"]
                last_media = False
            elif kind in ("image_url", "image"):
                refs.append(image_ref(part, where))
                text += marker
                last_media = True
            else:
                raise ChatTemplateError(f"{where}: a content part must be text, image_url or image, got {kind!r}")
        out.append({**m, "content": text})
    return out, refs
