"""One request never harms another, through the HTTP API (issue #33, finding 1).

A victim streams a greedy completion while hostile requests arrive: the ones that could never
be satisfied are 400s naming their field, the one that fails inside a step is a 500 for itself
alone (code generation_failed, its own cause, nothing of the victim's), and the victim's text
is the text it gets alone. Before, each attack failed every request in flight with the
attacker's error text.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

VICTIM_PROMPT = "Write a short story about a lighthouse keeper named Arvid."
VICTIM = {"prompt": VICTIM_PROMPT, "max_tokens": 128, "temperature": 0, "ignore_eos": True}
VOCAB = 49152  # SmolLM2's

# (body, the field the 400 names)
REFUSED = [
    ({"prompt": "x", "guided_choice": ["a"], "min_tokens": 4, "temperature": 1, "max_tokens": 8}, "min_tokens"),
    ({"prompt": "x", "guided_choice": ["a"], "min_tokens": 4, "temperature": 0, "max_tokens": 8}, "min_tokens"),
    ({"prompt": "x", "stop_token_ids": list(range(VOCAB)), "min_tokens": 1, "max_tokens": 8}, "stop_token_ids"),
    ({"prompt": "x", "guided_regex": "a{1000000}", "max_tokens": 8}, None),
]
FAILS_IN_A_STEP = {"prompt": "x", "guided_regex": "a", "min_tokens": 4, "temperature": 1, "max_tokens": 8}


@pytest.fixture(scope="module")
def server(start_server: Any, smollm2_path: Path) -> Any:
    return start_server(smollm2_path, "--max-body", str(4 * 2**20))


def _stream_text(url: str, body: dict[str, Any], started: threading.Event | None = None) -> str:
    text = []
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                text.append(chunk["choices"][0]["text"])
                if started is not None:
                    started.set()
    return "".join(text)


def test_attacks_beside_a_victim_stream(server: Any) -> None:
    solo = _stream_text(server.url, VICTIM)
    got: dict[str, str] = {}
    started = threading.Event()
    victim = threading.Thread(target=lambda: got.setdefault("text", _stream_text(server.url, VICTIM, started)))
    victim.start()
    assert started.wait(120)
    with httpx.Client(base_url=server.url, timeout=120) as c:
        r = c.post("/v1/completions", json=FAILS_IN_A_STEP)
        assert victim.is_alive()  # the failing request ran in the victim's batch
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["code"] == "generation_failed" and err["message"].startswith("no token can be generated")
        assert "lighthouse" not in r.text and "Arvid" not in r.text
        # streamed, the same failure is an error event for that stream only
        with c.stream("POST", "/v1/completions", json={**FAILS_IN_A_STEP, "stream": True}) as s:
            events = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: ") and x != "data: [DONE]"]
        assert events[-1]["error"]["code"] == "generation_failed"
        for body, field in REFUSED:
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == field or (field is None and "structured outputs" in err["message"]), err
    victim.join(timeout=300)
    assert got.get("text") == solo
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_a_seeded_attack_campaign_beside_a_victim(server: Any, smollm2_path: Path) -> None:
    """A short run of the campaign benchmarks/fuzz_server.py runs >= 5,000 cases of."""
    from attack_fuzz import attack

    from edge_infer.tokenizer import Tokenizer
    from edge_infer.tokenizer.vocab import Attr

    tok = Tokenizer.from_gguf(smollm2_path)
    control = {i for i in range(tok.vocab_size) if tok.token_attr(i) & Attr.CONTROL}
    report = attack(server.url, 40, tok.vocab_size, control, seed=1)
    assert report.calls == 40 and not report.failures, report.failures[:5]
    assert report.victim_runs >= 1 and not report.victim_failures, report.victim_failures[:5]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
