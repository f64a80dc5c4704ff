"""A prompt with images in it: token ids where each image tile's embeddings go (placeholder
ids), and the spans naming which tile's embeddings fill which positions.

The layout around a tile is libmtmd's (tools/mtmd/mtmd.cpp's add_media) per projector:
    gemma3:   <start_of_image> [tile] <end_of_image>
    qwen2.5vl: <|vision_start|> [tile] <|vision_end|> (the tile's grid kept for M-RoPE positions)
    pixtral:  [tile] [IMG_END] (the tile's rows end in [IMG_BREAK] embeddings of the projector's)
    lfm2:     <|image_start|> [tile] <|image_end|>, or when tiled <|image_start|> then per tile
              <|img_row_y_col_x|> [tile], then <|img_thumbnail|> [thumbnail] <|image_end|>
    idefics3: per grid row y, column x: <fake_token_around_image><row_y_col_x> [tile], "\n"
              between rows; then "\n\n" <fake_token_around_image> <global-img> [overview]
              <fake_token_around_image>
Text around the images is tokenized apart from them, as mtmd_tokenize cuts the prompt at each
image marker.

The prefix cache keys a block by its token ids; a span's positions count in that key as ids of
their own, derived from the image's sha256 and the position within the tile (`cache_key_ids`),
so the same image at the same place is a hit and two different images never share a block."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_infer.errors import InvalidRequest
from edge_infer.images.preprocess import ImageTiles, preprocess
from edge_infer.images.source import Image
from edge_infer.models.vision_config import QWEN25VL, VisionConfig
from edge_infer.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True, eq=False)
class ImageSpan:
    """Positions start .. start + length - 1 of a prompt hold tile `tile` of an image (`digest`:
    its bytes' sha256); `tiles` all that image's tiles (encoded together, cached by digest);
    grid: (columns, rows) of its tokens where the text model places them in 2-D (M-RoPE:
    qwen2.5vl), else (0, 0)."""

    start: int
    length: int
    digest: str
    tile: int
    tiles: tuple[np.ndarray, ...]
    grid: tuple[int, int] = (0, 0)

    @property
    def key(self) -> tuple[str, int]:
        return self.digest, self.tile

    def cache_key_ids(self) -> list[int]:
        """Negative ids (never a vocabulary id) standing for this span's positions in block keys."""
        base = int(self.digest[:15], 16) * 1_000 + self.tile
        return [-1 - (hash((base, j)) & 0x7FFFFFFF) for j in range(self.length)]


@dataclass(frozen=True, slots=True)
class MultimodalPrompt:
    """Token ids (placeholders where images go) and the image spans, in position order."""

    ids: list[int]
    spans: tuple[ImageSpan, ...]

    def cache_key_ids(self) -> list[int]:
        return with_image_keys(self.ids, self.spans)

    # read like its token ids where a prompt's ids are read (lengths, the last tokens, a continuation)
    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: Any) -> Any:
        return self.ids[i]

    def __add__(self, more: list[int]) -> MultimodalPrompt:
        return MultimodalPrompt(self.ids + list(more), self.spans)


def with_image_keys(ids: list[int], spans: Sequence[ImageSpan]) -> list[int]:
    """ids with each span's positions replaced by its cache key ids."""
    if not spans:
        return ids
    out = list(ids)
    for s in spans:
        if s.start < len(out):
            keys = s.cache_key_ids()
            n = min(s.length, len(out) - s.start)
            out[s.start : s.start + n] = keys[:n]
    return out


class ImageLayout:
    """The marker tokens of one projector over one tokenizer (found once)."""

    def __init__(self, cfg: VisionConfig, tokenizer: Tokenizer) -> None:
        self.cfg, self.tok = cfg, tokenizer
        self._pieces: dict[str, int] | None = None
        if cfg.projector == "idefics3":
            self.ov_start = [self.lookup("\n\n"), self.lookup("<fake_token_around_image>"), self.lookup("<global-img>")]
            self.ov_end = [self.lookup("<fake_token_around_image>")]
            self.row_end = [self.lookup("\n")]
        if cfg.projector == "lfm2":
            self.thumbnail = [self.lookup("<|img_thumbnail|>")]
        self.placeholder = self._placeholder()

    def lookup(self, text: str) -> int:
        """mtmd's lookup_token: the first id whose piece (specials included) is `text`."""
        if self._pieces is None:
            self._pieces = {}
            for i in range(self.tok.vocab_size):
                piece = self.tok.token_to_piece(i, special=True).decode("utf-8", "replace")
                self._pieces.setdefault(piece, i)
        found = self._pieces.get(text)
        if found is None:
            raise InvalidRequest(f"the text model's vocabulary has no {text!r} token, which the "
                                 f"{self.cfg.projector} projector's image layout needs")
        return found

    def _placeholder(self) -> int:
        """The id placeholders carry (what a prompt's text shows where an image is)."""
        for text in ("<image_soft_token>", "<image>", "[IMG]", "<|image_pad|>"):
            ids = self.tok.encode(text, add_special=False, parse_special=True)
            if len(ids) == 1:
                return ids[0]
        return 0

    def special(self, text: str) -> list[int]:
        """Marker text tokenized with special tokens parsed (mtmd's add_text(text, true))."""
        return self.tok.encode(text, add_special=False, parse_special=True)

    def place(self, tiles: ImageTiles, digest: str, ids: list[int], spans: list[ImageSpan]) -> None:
        """Append one image's markers and placeholders to ids, its spans to spans."""
        all_tiles = tiles.tiles + ((tiles.overview,) if tiles.overview is not None else ())

        def tile(i: int, grid: tuple[int, int] = (0, 0)) -> None:
            n = self.cfg.tile_tokens(all_tiles[i].shape[1], all_tiles[i].shape[2])
            spans.append(ImageSpan(len(ids), n, digest, i, all_tiles, grid))
            ids.extend([self.placeholder] * n)

        if self.cfg.projector == "gemma3":
            ids += self.special("<start_of_image>")
            tile(0)
            ids += self.special("<end_of_image>")
            return
        if self.cfg.projector == QWEN25VL:
            side = self.cfg.patch_size * self.cfg.n_merge
            ids += self.special("<|vision_start|>")
            tile(0, (all_tiles[0].shape[2] // side, all_tiles[0].shape[1] // side))
            ids += self.special("<|vision_end|>")
            return
        if self.cfg.projector == "pixtral":  # the rows' [IMG_BREAK]s come from the projector
            tile(0)
            ids += self.special("[IMG_END]")
            return
        if self.cfg.projector == "lfm2":  # tiles after their row/column marker, then the thumbnail
            ids += self.special("<|image_start|>")
            gx, gy = tiles.grid
            if gx and gy:
                for y in range(gy):
                    for x in range(gx):
                        ids += self.special(f"<|img_row_{y + 1}_col_{x + 1}|>")
                        tile(y * gx + x)
                ids += self.thumbnail
                tile(len(tiles.tiles))
            else:
                tile(0)
            ids += self.special("<|image_end|>")
            return
        gx, gy = tiles.grid
        for y in range(gy):
            for x in range(gx):
                ids += self.special(f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>")
                tile(y * gx + x)
            if y != gy - 1:
                ids += self.row_end
        ids += self.ov_start
        tile(len(tiles.tiles))
        ids += self.ov_end


def build_prompt(layout: ImageLayout, runs: Sequence[list[int]], images: Sequence[Image],
                 preprocess_fn: Callable[[np.ndarray], ImageTiles] | None = None) -> MultimodalPrompt:
    """runs[0] image 0 runs[1] ... image k-1 runs[k]: the text token runs around the images."""
    if len(runs) != len(images) + 1:
        raise InvalidRequest(f"the prompt has {len(runs) - 1} image place(s) for {len(images)} image(s) (a chat "
                             "template that drops a message's content drops its images)")
    prep = preprocess_fn or (lambda px: preprocess(px, layout.cfg.pixels))
    ids: list[int] = list(runs[0])
    spans: list[ImageSpan] = []
    for img, after in zip(images, runs[1:]):
        layout.place(prep(img.pixels), img.digest, ids, spans)
        ids += after
    return MultimodalPrompt(ids, tuple(spans))
