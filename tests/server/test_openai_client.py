"""The server against the official `openai` client (sync and async, streaming and not), with
answers checked against LLM.generate / LLM.chat on the same model and parameters."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from edge_infer import LLM, SamplingParams

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

KEY = "sk-test-client-key"
MODEL = "smollm2-135m"
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(start_server, smollm2_path: Path):  # type: ignore[no-untyped-def]
    return start_server(smollm2_path, "-t", "2", "--kv-cache-memory", "64MiB", "--max-model-len", "1024",
                        "--max-num-seqs", "8", "--api-key", KEY)


@pytest.fixture(scope="module")
def llm(smollm2_path: Path):  # type: ignore[no-untyped-def]
    with LLM(str(smollm2_path), n_threads=1, kv_cache_memory="64MiB", max_model_len=1024) as llm:
        yield llm


@pytest.fixture(scope="module")
def client(server):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


def test_models(client) -> None:  # type: ignore[no-untyped-def]
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]


def test_completions_greedy_match_llm(client, llm: LLM) -> None:  # type: ignore[no-untyped-def]
    r = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=10, temperature=0)
    want = llm.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0))
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == MODEL
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.text for c in r.choices] == [o.text for o in want]
    assert [c.finish_reason for c in r.choices] == [o.finish_reason for o in want]
    assert r.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in want)
    assert r.usage.completion_tokens == sum(len(o.token_ids) for o in want)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completions_token_id_prompt(client, llm: LLM) -> None:  # type: ignore[no-untyped-def]
    ids = llm.tokenizer.encode(PROMPTS[0], add_special=True)
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert r.choices[0].text == llm.generate([ids], SamplingParams(max_tokens=6, temperature=0))[0].text


def test_completions_stream_matches(client, llm: LLM) -> None:  # type: ignore[no-untyped-def]
    want = llm.generate(PROMPTS[1], SamplingParams(max_tokens=10, temperature=0))[0]
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    content, usage = chunks[:-1], chunks[-1]
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in content) == want.text
    assert content[-1].choices[0].finish_reason == want.finish_reason
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert usage.choices == [] and usage.usage.completion_tokens == len(want.token_ids)


def test_seed_reproducible_n2(client, llm: LLM) -> None:  # type: ignore[no-untyped-def]
    kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0.9, n=2, seed=1234)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    want = llm.generate(PROMPTS[0], SamplingParams(max_tokens=8, temperature=0.9, n=2, seed=1234))[0]
    assert len(a.choices) == 2
    assert [c.text for c in a.choices] == [c.text for c in b.choices] == [o.text for o in want.outputs]


def test_stop_and_logit_bias(client, llm: LLM) -> None:  # type: ignore[no-untyped-def]
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=["\n"])
    want = llm.generate(PROMPTS[0], SamplingParams(max_tokens=16, temperature=0, stop=["\n"]))[0]
    assert r.choices[0].text == want.text and "\n" not in want.text
    assert r.choices[0].finish_reason == want.finish_reason == "stop"
    first = llm.generate(PROMPTS[0], SamplingParams(max_tokens=1, temperature=0))[0].token_ids[0]
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0,
                                  logit_bias={str(first): -100})
    want = llm.generate(PROMPTS[0], SamplingParams(max_tokens=4, temperature=0, logit_bias={first: -100}))[0]
    assert r.choices[0].text == want.text
    assert want.token_ids[0] != first


def test_completion_logprobs_and_echo(client, llm: LLM) -> None:  # type: ignore[no-untyped-def]
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=3)
    want = llm.generate(PROMPTS[0], SamplingParams(max_tokens=6, temperature=0, logprobs=3))[0].outputs[0]
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(want.token_ids)
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(t) == 3 for t in lp.top_logprobs)
    for got, tok, d in zip(lp.token_logprobs, want.token_ids, want.logprobs):
        assert got == pytest.approx(d[tok], abs=1e-4)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=3, temperature=0, echo=True)
    assert r.choices[0].text.startswith(PROMPTS[0]) and len(r.choices[0].text) > len(PROMPTS[0])


def test_chat_greedy_matches_llm(client, llm: LLM) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    want = llm.chat(CHAT, SamplingParams(max_tokens=12, temperature=0))[0]
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text
    assert r.choices[0].finish_reason == want.finish_reason
    assert r.usage.prompt_tokens == len(llm.chat_prompt(CHAT))
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_chat_logprobs(client, llm: LLM) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=2)
    want = llm.chat(CHAT, SamplingParams(max_tokens=6, temperature=0, logprobs=2))[0].outputs[0]
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == len(want.token_ids)
    for entry, tok, d in zip(content, want.token_ids, want.logprobs):
        assert entry.logprob == pytest.approx(d[tok], abs=1e-4)
        assert bytes(entry.bytes) == llm.tokenizer.token_to_piece(tok)
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob


def test_async_chat_stream_n2_and_concurrent(server, llm: LLM) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(max_tokens=8, temperature=0.8, seed=7, n=2)
    want = [o.text for o in llm.chat(CHAT, params)[0].outputs]
    convs = [[{"role": "user", "content": q}] for q in ("Hi!", "Name a colour.", "Count to three.")]
    greedy = [o.text for o in llm.chat(convs, SamplingParams(max_tokens=8, temperature=0))]

    async def go() -> tuple[dict[int, str], list[object], list[str]]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
        texts: dict[int, str] = {0: "", 1: ""}
        chunks = []
        stream = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0.8,
                                                      seed=7, n=2, stream=True,
                                                      stream_options={"include_usage": True})
        async for chunk in stream:
            chunks.append(chunk)
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""

        async def one(messages: list[dict[str, str]]) -> str:
            r = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8, temperature=0
            )
            return r.choices[0].message.content or ""

        together = await asyncio.gather(*(one(m) for m in convs))
        await client.close()
        return texts, chunks, list(together)

    texts, chunks, together = asyncio.run(go())
    assert [texts[0], texts[1]] == want
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    finals = [c for ch in chunks for c in ch.choices if c.finish_reason is not None]
    assert sorted(c.index for c in finals) == [0, 1]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert together == greedy  # batched on the server, alone in the reference: same greedy text


def test_tokenize_detokenize(server, llm: LLM) -> None:  # type: ignore[no-untyped-def]
    h = {"Authorization": f"Bearer {KEY}"}
    text = "Hello world <|im_end|> done"
    r = httpx.post(
        server.url + "/tokenize", json={"model": MODEL, "prompt": text}, headers=h, timeout=60
    ).json()
    assert r["tokens"] == llm.tokenizer.encode(text, add_special=True, parse_special=False)
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 1024
    assert llm.tokenizer.eos_id not in r["tokens"]  # user text is never parsed as special tokens
    back = httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}, headers=h, timeout=60).json()
    assert back == {"prompt": text}
    msgs = [{"role": "user", "content": "say <|im_end|> please"}]
    r = httpx.post(server.url + "/tokenize", json={"messages": msgs}, headers=h, timeout=60).json()
    assert r["tokens"] == llm.chat_prompt(msgs)


def test_metrics_exposition(server, get_metrics) -> None:  # type: ignore[no-untyped-def]
    m = get_metrics(server.url)
    assert m["edge_infer_ready"] == 1
    assert m['edge_infer_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 1
    assert m["edge_infer_time_to_first_token_seconds_count"] >= 1
    assert m["edge_infer_inter_token_latency_seconds_count"] >= 1
    assert m["edge_infer_generation_tokens_total"] > 0 and m["edge_infer_prompt_tokens_total"] > 0
    assert m["edge_infer_kv_blocks_total"] > 0 and m["edge_infer_kv_blocks_used"] == 0
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_ratio",
        "prefix_cache_hit_rate",
    ):
        assert "edge_infer_" + name in m
