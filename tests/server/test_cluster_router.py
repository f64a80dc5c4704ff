"""PrefixAffinityRouter's choice, without a Ray cluster: a prompt sharing a long prefix with
one routed before prefers that replica, a short or unknown one goes to the replica with the
fewest requests in flight, and a replica no longer among the candidates is passed over."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve")

from edge_infer.cluster.request import EngineRequest  # noqa: E402
from edge_infer.cluster.router import CHUNK, MIN_MATCH, PrefixAffinityRouter, prefix_keys  # noqa: E402
from edge_infer.sampling_params import SamplingParams  # noqa: E402


def _router() -> PrefixAffinityRouter:
    r = object.__new__(PrefixAffinityRouter)  # the state only: no Serve controller to talk to
    r.initialize_state()
    return r


_ids = itertools.count()


def _pending(prompt: list[int]) -> SimpleNamespace:
    return SimpleNamespace(args=[EngineRequest(prompt, SamplingParams(), "r")], kwargs={},
                           metadata=SimpleNamespace(internal_request_id=f"req-{next(_ids)}"))


def test_prefix_keys_are_cumulative_whole_chunks() -> None:
    a = list(range(3 * CHUNK + 5))
    keys = prefix_keys(a)
    assert len(keys) == 3 and keys == prefix_keys(a[: 3 * CHUNK])
    b = a.copy()
    b[CHUNK + 1] = -1  # differs in the second chunk: the first key is shared, the rest are not
    assert prefix_keys(b)[0] == keys[0] and not set(prefix_keys(b)[1:]) & set(keys)


def test_a_shared_long_prefix_prefers_its_replica() -> None:
    r = _router()
    one, two = SimpleNamespace(replica_id="one"), SimpleNamespace(replica_id="two")
    shared = list(range(10 * CHUNK))
    r.on_request_routed(_pending(shared + [1, 2, 3]), "two", None)  # type: ignore[arg-type]
    p = _pending(shared + [9])
    assert asyncio.run(r.choose_replicas([one, two], p)) == [[two], [one]]  # type: ignore[arg-type,list-item]
    r.on_request_routed(p, "two", None)  # type: ignore[arg-type]
    short = shared[: MIN_MATCH - 1] + [7] * CHUNK * 3  # shares less than MIN_MATCH tokens
    # two holds two requests in flight: anything without a long shared prefix prefers one
    p = _pending(short)
    assert asyncio.run(r.choose_replicas([one, two], p)) == [[one], [two]]  # type: ignore[arg-type,list-item]
    r.on_request_routed(p, "one", None)  # type: ignore[arg-type]
    p = _pending(shared)
    assert asyncio.run(r.choose_replicas([one], p)) == [[one]]  # its replica is gone  # type: ignore[arg-type,list-item]
    r.on_request_routed(p, "one", None)  # type: ignore[arg-type]
    r.on_request_completed("two", "x")  # type: ignore[arg-type]
    assert asyncio.run(r.choose_replicas([one, two], None)) == [[two], [one]]  # type: ignore[arg-type,list-item]
    for _ in range(2):
        r.on_request_completed("one", "x")  # type: ignore[arg-type]
    assert asyncio.run(r.choose_replicas([two, one], None)) == [[one], [two]]  # type: ignore[arg-type,list-item]


def test_a_burst_without_shared_prefixes_spreads_over_the_replicas() -> None:
    r = _router()
    replicas = [SimpleNamespace(replica_id=n) for n in ("a", "b", "c")]
    routed = []
    for i in range(9):  # routed back to back, none complete: Serve's queue probes would all see 0
        p = _pending([1000 + i] * 5)
        first = asyncio.run(r.choose_replicas(replicas, p))[0][0]  # type: ignore[arg-type]
        r.on_request_routed(p, first.replica_id, None)  # type: ignore[arg-type]
        routed.append(first.replica_id)
    assert sorted(routed) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    for _ in range(3):
        r.on_request_completed("c", "x")  # type: ignore[arg-type]
    assert asyncio.run(r.choose_replicas(replicas, _pending([5])))[0][0].replica_id == "c"  # type: ignore[arg-type]


def test_a_burst_chosen_before_any_is_routed_spreads_over_the_replicas() -> None:
    r = _router()
    replicas = [SimpleNamespace(replica_id=n) for n in ("a", "b")]
    burst = [_pending([2000 + i] * 5) for i in range(6)]
    # Serve chooses for every request of a burst before it reports any of them routed
    firsts = [asyncio.run(r.choose_replicas(replicas, p))[0][0].replica_id for p in burst]  # type: ignore[arg-type]
    assert sorted(firsts) == ["a"] * 3 + ["b"] * 3
    again = asyncio.run(r.choose_replicas(replicas, burst[0]))[0][0].replica_id  # type: ignore[arg-type]
    assert again == firsts[0]  # a retry replaces its own earlier choice, it does not add to it
    for p, first in zip(burst, firsts):
        r.on_request_routed(p, first, None)  # type: ignore[arg-type]
    assert not r._chosen  # reported: now counted as in flight, not as chosen
    assert r._in_flight == {"a": 3, "b": 3}


def test_deltas_rebuild_the_cumulative_outputs() -> None:
    from edge_infer.cluster.delta import apply, diff
    from edge_infer.outputs import CompletionOutput, RequestMetrics, RequestOutput

    def out(texts: list[str], ids: list[list[int]], finished: bool = False) -> RequestOutput:
        samples = [CompletionOutput(i, t, d, "stop" if finished else None, [{x: -0.5} for x in d], None, -1.0)
                   for i, (t, d) in enumerate(zip(texts, ids))]
        return RequestOutput("r", None, list(range(2000)), samples, finished, RequestMetrics(1.0) if finished else None)

    steps = [out(["a", ""], [[1], []]), out(["ab", "x"], [[1, 2], [7]]), out(["abc", "xy"], [[1, 2, 3], [7, 8]], True)]
    rebuilt = steps[0]
    for prev, cur in zip(steps, steps[1:]):
        d = diff(prev, cur)
        assert all(len(s.token_ids) == 1 for s in d.samples)  # only what the step added travels
        rebuilt = apply(rebuilt, d)
        assert rebuilt == cur
