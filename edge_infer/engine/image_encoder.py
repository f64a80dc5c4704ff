"""The engine's image embeddings: a span's rows are encoded by the vision tower when a step
first needs them (on the engine thread; a prefix-cache hit never encodes), all tiles of that
image together, and kept in an LRU by (image sha256, tile) within a byte budget, so a
preempted sequence or the same image in the next request is not encoded again."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from edge_infer.engine.image_prompt import ImageSpan
from edge_infer.models.vision import VisionTower

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024


class ImageEmbeddings:
    """rows(span) -> float32 [span.length, text_dim]; counts what it encoded."""

    def __init__(self, tower: VisionTower, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.tower, self.max_bytes = tower, max_bytes
        self._cache: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._bytes = 0
        self.tiles_encoded = 0
        self.images_encoded = 0

    def rows(self, span: ImageSpan) -> np.ndarray:
        hit = self._cache.get(span.key)
        if hit is not None:
            self._cache.move_to_end(span.key)
            return hit
        missing = [i for i in range(len(span.tiles)) if (span.digest, i) not in self._cache]
        encoded = self.tower.encode([span.tiles[i] for i in missing])
        self.tiles_encoded += len(missing)
        self.images_encoded += 1
        mine = None
        for i, rows in zip(missing, encoded):
            self._put((span.digest, i), rows)
            if i == span.tile:
                mine = rows
        assert mine is not None
        return mine

    def _put(self, key: tuple[str, int], rows: np.ndarray) -> None:
        self._cache[key] = rows
        self._bytes += rows.nbytes
        while self._bytes > self.max_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._bytes -= old.nbytes
