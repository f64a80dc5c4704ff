"""/v1/embeddings with the official `openai` client: the vectors LLM.embed gives, as floats and
as base64; token-id inputs; usage counts; `dimensions` other than the width and bad inputs are
400s naming the field."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import pytest

from edge_infer import LLM

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

KEY = "sk-test-embed"
MODEL = "smollm2-135m"
TEXTS = ["The cat sat on the mat.", "Share prices dropped steeply."]


@pytest.fixture(scope="module")
def server(start_server, smollm2_path: Path):  # type: ignore[no-untyped-def]
    return start_server(smollm2_path, "-t", "2", "--kv-cache-memory", "32MiB", "--api-key", KEY)


@pytest.fixture(scope="module")
def client(server):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_float_and_base64_equal_llm_embed(client, smollm2_path: Path) -> None:  # type: ignore[no-untyped-def]
    with LLM(str(smollm2_path), n_threads=1, kv_cache_memory="16MiB") as llm:
        want = llm.embed(TEXTS)
        ids = llm.tokenizer.encode(TEXTS[0])
    r = client.embeddings.create(model=MODEL, input=TEXTS)
    got = np.array([d.embedding for d in r.data], np.float32)
    np.testing.assert_array_equal(got, want)
    assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens > 0
    # asked for explicitly, base64 comes back as the string: little-endian float32 bytes
    b64 = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="base64")
    np.testing.assert_array_equal(np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in b64.data]), want)
    tok = client.embeddings.create(model=MODEL, input=[ids], dimensions=want.shape[1])
    np.testing.assert_array_equal(np.array(tok.data[0].embedding, np.float32), want[0])


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "dimensions": 64}, "dimensions"),
    ({"input": ""}, "input"),
    ({"input": [1, "a"]}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "pooling": "mean"}, "pooling"),
], ids=["dimensions", "empty", "mixed", "encoding", "unknown-field"])
def test_bad_requests_are_400(server, body, param) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/embeddings", json={"model": MODEL, **body},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
