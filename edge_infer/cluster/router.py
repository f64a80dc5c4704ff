"""PrefixAffinityRouter: Ray Serve request routing that sends a prompt to the replica holding
its longest cached prefix, else to the least loaded replica.

The router remembers, for each prompt it routed, the hashes of its token prefixes at every
CHUNK tokens and the replica it went to (an LRU of MAX_KEYS entries). A new prompt looks up
its own prefix hashes from the longest down; the first known one names the preferred replica.
Ray Serve then tries that rank first and falls back to the other replicas, least loaded first,
when the preferred one is at max_ongoing_requests or gone. "Load" is the router's own count of
the requests it has routed to a replica and not seen complete: Ray's queue-length probes of a
burst of requests routed at once all see the same empty queues and would send the whole burst
to one replica. Nor is the count alone enough: Ray chooses for a whole burst before it reports
any of them routed, so a choice not yet reported counts as load on the replica ranked first
for it (for TENTATIVE_S at most: a request cancelled before routing is never reported). The
engine replica's own prefix cache is exact; this map only steers requests to where the blocks
probably are.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

from edge_infer.cluster.request import EngineRequest

CHUNK = 64  # tokens per prefix step (a few KV blocks)
MIN_MATCH = 2 * CHUNK  # a shorter shared prefix is not worth steering for
MAX_KEYS = 200_000
TENTATIVE_S = 5.0  # how long a choice not yet reported routed counts as load (seconds)


def prefix_keys(prompt: list[int], chunk: int = CHUNK) -> list[int]:
    """Hashes of prompt[:chunk], prompt[:2 * chunk], ... (whole chunks only), shortest first."""
    keys, h = [], 0
    for end in range(chunk, len(prompt) + 1, chunk):
        h = hash((h, tuple(prompt[end - chunk : end])))
        keys.append(h)
    return keys


def _request_id(pending: PendingRequest | None) -> str | None:
    return None if pending is None else pending.metadata.internal_request_id


def _prompt(pending: PendingRequest | None) -> list[int] | None:
    if pending is None:
        return None
    for a in (*pending.args, *pending.kwargs.values()):
        if isinstance(a, EngineRequest):
            return a.prompt
    return None


class PrefixAffinityRouter(RequestRouter):
    """Ranks: [the replica with the longest known prefix of the prompt], then every other
    replica alone, fewest in-flight requests first."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._owner: OrderedDict[int, ReplicaID] = OrderedDict()
        self._in_flight: dict[ReplicaID, int] = {}
        # request id -> (the replica ranked first for it, monotonic time), until reported routed
        self._chosen: OrderedDict[str, tuple[ReplicaID, float]] = OrderedDict()

    def _by_load(self, replicas: list[RunningReplica]) -> list[list[RunningReplica]]:
        now = time.monotonic()
        while self._chosen and next(iter(self._chosen.values()))[1] < now - TENTATIVE_S:
            self._chosen.popitem(last=False)
        tentative = Counter(r for r, _ in self._chosen.values())
        # stable: ties keep order
        ordered = sorted(replicas, key=lambda r: self._in_flight.get(r.replica_id, 0) + tentative[r.replica_id])
        return [[r] for r in ordered]

    def _ranked(self, ranks: list[list[RunningReplica]], pending: PendingRequest | None) -> list[list[RunningReplica]]:
        """`ranks`, its first replica noted as this request's tentative choice."""
        request_id = _request_id(pending)
        if request_id is not None and ranks:
            self._chosen.pop(request_id, None)  # a retry re-ranks: only its newest choice counts
            self._chosen[request_id] = (ranks[0][0].replica_id, time.monotonic())
        return ranks

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        prompt = _prompt(pending_request)
        if prompt is None or not candidate_replicas:
            return self._ranked(self._by_load(candidate_replicas), pending_request)
        by_id = {r.replica_id: r for r in candidate_replicas}
        keys = prefix_keys(prompt)
        for n in range(len(keys), MIN_MATCH // CHUNK - 1, -1):
            owner = self._owner.get(keys[n - 1])
            if owner in by_id:
                best = by_id[owner]
                return self._ranked([[best], *self._by_load([r for r in candidate_replicas if r is not best])],
                                    pending_request)
        return self._ranked(self._by_load(candidate_replicas), pending_request)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: ReplicaResult) -> None:
        self._in_flight[replica_id] = self._in_flight.get(replica_id, 0) + 1
        request_id = _request_id(pending_request)
        if request_id is not None:
            self._chosen.pop(request_id, None)
        prompt = _prompt(pending_request)
        if prompt is None:
            return
        for k in prefix_keys(prompt):
            self._owner[k] = replica_id
            self._owner.move_to_end(k)
        while len(self._owner) > MAX_KEYS:
            self._owner.popitem(last=False)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        n = self._in_flight.get(replica_id, 0) - 1
        if n > 0:
            self._in_flight[replica_id] = n
        else:
            self._in_flight.pop(replica_id, None)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._in_flight.pop(replica_id, None)
        for request_id in [i for i, (r, _) in self._chosen.items() if r == replica_id]:
            del self._chosen[request_id]
        for k in [k for k, r in self._owner.items() if r == replica_id]:
            del self._owner[k]
