"""An image a request names, read into RGB pixels: a `data:image/...;base64,` URL, raw base64, a
local file (the offline API only), or an http(s) URL (the server only, behind
--allow-image-urls, capped in bytes and time). The bytes' sha256 names the image: the prefix
cache and the embedding cache key on it, so the same picture is recognised however it came."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_infer.errors import InvalidRequest

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # an encoded image's size
MAX_IMAGE_PIXELS = 40_000_000  # width x height after decoding (a decompression bomb is refused)
URL_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Image:
    """Decoded pixels uint8 [H, W, 3] (RGB) and the sha256 of the encoded bytes (hex)."""

    pixels: np.ndarray
    digest: str

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])


def decode_image(data: bytes, what: str = "image") -> Image:
    """Pixels of an encoded image (PNG, JPEG, WebP, GIF's first frame, BMP ...); alpha dropped
    onto black as Pillow's convert("RGB") does, which is what llama.cpp's stb_image loader gives."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidRequest(f"{what}: {len(data):,} bytes is over the limit of {MAX_IMAGE_BYTES:,}")
    try:
        with PILImage.open(io.BytesIO(data)) as im:
            if im.width * im.height > MAX_IMAGE_PIXELS:
                raise InvalidRequest(f"{what}: {im.width}x{im.height} pixels is over the limit of {MAX_IMAGE_PIXELS:,}")
            pixels = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise InvalidRequest(f"{what}: not an image Pillow can read ({e})") from None
    return Image(np.ascontiguousarray(pixels), hashlib.sha256(data).hexdigest())


def image_from_array(pixels: np.ndarray) -> Image:
    """An image given as pixels uint8 [H, W, 3] (the offline API); named by their bytes' hash."""
    a = np.asarray(pixels)
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3 or a.shape[0] < 1 or a.shape[1] < 1:
        raise InvalidRequest(f"an image array must be uint8 [height, width, 3], got {a.dtype} {list(a.shape)}")
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(np.asarray(a.shape, np.int64).tobytes() + a.tobytes()).hexdigest()
    return Image(a, h)


def decode_base64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{what}: not valid base64") from None


def data_url_bytes(url: str, what: str) -> bytes:
    """The bytes of a `data:image/<type>;base64,<data>` URL (llama.cpp's server accepts the same)."""
    head, sep, body = url.partition(",")
    if not sep:
        raise InvalidRequest(f"{what}: a data URL needs a comma before its data")
    if not head.startswith("data:image/"):
        raise InvalidRequest(f"{what}: a data URL must hold an image (data:image/...), got {head[:40]!r}")
    if not head.endswith(";base64"):
        raise InvalidRequest(f"{what}: a data URL must be base64 encoded (data:image/...;base64,...)")
    return decode_base64(body, what)


def fetch_url(url: str, what: str, max_bytes: int = MAX_IMAGE_BYTES, timeout_s: float = URL_TIMEOUT_S) -> bytes:
    """The body of an http(s) URL, read in pieces and abandoned past max_bytes or timeout_s."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    req = urllib.request.Request(url, headers={"User-Agent": "edge-infer"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 (http(s) only, checked by the caller)
            out = bytearray()
            while chunk := r.read(65536):
                out += chunk
                if len(out) > max_bytes:
                    raise InvalidRequest(f"{what}: the image at the URL is over the limit of {max_bytes:,} bytes")
                if time.monotonic() > deadline:
                    raise InvalidRequest(f"{what}: fetching the image took over {timeout_s:g} s")
            return bytes(out)
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as e:
        raise InvalidRequest(f"{what}: could not fetch the image ({e})") from None


def load_image(ref: str | bytes | Path | np.ndarray, what: str = "image", *, allow_files: bool = True,
               allow_urls: bool = False) -> Image:
    """An image from a data URL, an http(s) URL (allow_urls), a local path (allow_files), raw
    base64 text, encoded bytes or a pixel array."""
    if isinstance(ref, np.ndarray):
        return image_from_array(ref)
    if isinstance(ref, (bytes, bytearray)):
        return decode_image(bytes(ref), what)
    if isinstance(ref, Path):
        ref = str(ref)
    if not isinstance(ref, str):
        raise InvalidRequest(f"{what}: expected a URL, a path, bytes or a pixel array, got {type(ref).__name__}")
    if ref.startswith("data:"):
        return decode_image(data_url_bytes(ref, what), what)
    if ref.startswith(("http://", "https://")):
        if not allow_urls:
            raise InvalidRequest(f"{what}: image URLs are off on this server (start it with --allow-image-urls); "
                                 "send the image as a data: URL")
        return decode_image(fetch_url(ref, what), what)
    if ref.startswith("file://") or (allow_files and Path(ref).is_file()):
        if not allow_files:
            raise InvalidRequest(f"{what}: local files are not read by the server; send the image as a data: URL")
        path = Path(ref.removeprefix("file://"))
        try:
            return decode_image(path.read_bytes(), what)
        except OSError as e:
            raise InvalidRequest(f"{what}: cannot read {path}: {e.strerror or e}") from None
    if "://" in ref[:16]:
        raise InvalidRequest(f"{what}: unsupported URL scheme in {ref[:40]!r} (use data:, http:// or https://)")
    try:
        data = decode_base64(ref, what)
    except InvalidRequest:
        if allow_files:
            raise InvalidRequest(f"{what}: {ref[:80]!r} is neither a file nor base64 image data") from None
        raise
    return decode_image(data, what)
