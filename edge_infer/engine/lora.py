"""The engine's LoRA adapters: loaded and unloaded by name on the engine thread, chosen per
request as (name, scale) pairs, and the prefix-cache key of a choice. A sequence with adapters
keys its blocks with its first id replaced by the choice's key (a hash of the adapters' file
digests and scales), so a block computed with one adapter is never reused with another or by
the base (vLLM keys its blocks by LoRA the same way)."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from edge_infer.config import finite_scale
from edge_infer.errors import InvalidRequest
from edge_infer.models.lora import read_adapter
from edge_infer.models.lora_set import LoraChoice, LoraSet
from edge_infer.models.transformer import Transformer

log = logging.getLogger("edge_infer.engine")

# a request's adapters as it names them: (name, scale or None for the adapter's default scale)
AdapterRequest = tuple[tuple[str, float | None], ...]


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """One loaded adapter as /lora-adapters and /v1/models list it."""

    id: int
    name: str
    path: str
    scale: float
    alpha: float
    ranks: tuple[int, ...]
    nbytes: int


def adapter_request(adapter: str | Sequence[str] | None, scale: float | None) -> AdapterRequest:
    """LLM's adapter= / adapter_scale= arguments as an AdapterRequest, checked: one adapter's
    name, or several names applied together (llama.cpp's --lora repeated), at `scale` (None: each
    adapter's default)."""
    if adapter is None:
        if scale is not None:
            raise InvalidRequest("adapter_scale needs adapter= (the name of a loaded LoRA adapter)")
        return ()
    names = [adapter] if isinstance(adapter, str) else list(adapter) if isinstance(adapter, (list, tuple)) else [None]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidRequest(f"adapter must be the name of a loaded LoRA adapter (or a list of names), got {adapter!r}")
    value = check_scale(scale, f"the scale of adapter {adapter!r}")
    return tuple((n, value) for n in names)  # type: ignore[misc]


def check_scale(scale: object, what: str) -> float | None:
    """A request's adapter scale: None (the adapter's default) or a finite number."""
    return None if scale is None else finite_scale(scale, what)


class EngineLoras:
    """The adapters over the engine's model (runner.model.lora once the first is loaded)."""

    def __init__(self, architecture: str, model: Transformer) -> None:
        self._arch, self._model = architecture, model
        self.scales: dict[str, float] = {}  # each adapter's default scale (--lora name=FILE:scale, /lora-adapters)

    def names(self) -> list[str]:
        return [] if self._model.lora is None else self._model.lora.names

    def load(self, name: str, path: str, scale: float = 1.0) -> AdapterInfo:
        """Read, check and bind the adapter file at `path` as `name` (engine thread)."""
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"an adapter's name must be a non-empty string, got {name!r}")
        default = check_scale(scale, f"adapter {name!r}'s scale")
        if self._model.lora is None:
            self._model.lora = LoraSet(self._arch, self._model.w, self._model.b)
        lora_set = self._model.lora
        if name in lora_set.names:
            raise InvalidRequest(f"a LoRA adapter named {name!r} is loaded already (unload it first)")
        slot = lora_set.add(read_adapter(name, path))
        self.scales[name] = 1.0 if default is None else default
        log.info("LoRA adapter %r loaded from %s (slot %d)", name, path, slot)
        return self.info(name)

    def unload(self, name: str, in_use: Iterable[LoraChoice]) -> None:
        """Drop adapter `name`; refused while a request still uses it."""
        lora_set = self._require()
        slot = lora_set.slot_of(name)
        users = sum(1 for choice in in_use if any(s == slot for s, _ in choice))
        if users:
            raise InvalidRequest(f"LoRA adapter {name!r} is in use by {users} running sequence(s); unload it when they "
                                 "finish (or abort them)")
        lora_set.remove(name)
        del self.scales[name]

    def set_scale(self, name: str, scale: float) -> None:
        self._require().slot_of(name)
        self.scales[name] = finite_scale(scale, f"adapter {name!r}'s scale")

    def info(self, name: str) -> AdapterInfo:
        lora_set = self._require()
        slot = lora_set.slot_of(name)
        a = lora_set.adapter(name)
        return AdapterInfo(slot, name, a.path, self.scales[name], a.alpha,
                           tuple(sorted({p.rank for p in a.pairs.values()})), a.nbytes)

    def infos(self) -> list[AdapterInfo]:
        return [self.info(n) for n in self.names()]

    def choose(self, wanted: AdapterRequest) -> LoraChoice:
        """A request's adapters as slots and scales (engine thread). Scale 0 drops an adapter (as
        llama-server does); no adapter left: the base model."""
        if not wanted:
            return ()
        lora_set = self._require()
        out = []
        if len({name for name, _ in wanted}) < len(wanted):
            raise InvalidRequest(f"an adapter is named twice in {[name for name, _ in wanted]}")
        for name, scale in wanted:
            slot = lora_set.slot_of(name)
            s = self.scales[name] if scale is None else scale
            if s != 0.0:
                out.append((slot, s))
        return tuple(out)

    def cache_key(self, choice: LoraChoice) -> int:
        """The prefix-cache key id of a choice: negative (never a token), the same in every
        process for the same files and scales (the disk cache shares blocks across processes)."""
        lora_set = self._require()
        parts = []
        for slot, s in choice:
            adapter = lora_set.slots[slot]
            assert adapter is not None
            parts.append((int.from_bytes(adapter.digest[:8], "little"), struct.unpack("<I", struct.pack("<f", s))[0]))
        return -1 - (hash((0x10EA, tuple(parts))) & 0x7FFFFFFF)

    def keyed(self, choice: LoraChoice, ids: Sequence[int], keys: list[int] | None) -> list[int] | None:
        """A sequence's prompt keys with its adapters' key first (keys: the image keys, or None)."""
        if not choice:
            return keys
        out = list(ids) if keys is None else list(keys)
        out[0] = self.cache_key(choice)
        return out

    def _require(self) -> LoraSet:
        if self._model.lora is None or not self._model.lora.names:
            raise InvalidRequest("no LoRA adapter is loaded (LLM(model, adapters={...}), load_adapter, or --lora)")
        return self._model.lora
