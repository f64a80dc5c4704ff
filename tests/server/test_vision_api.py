"""Images through the server (a tiny SmolVLM-shaped model and projector, tests/support/tiny_vlm.py):
OpenAI image_url parts with data: URLs answer as LLM.chat does offline, and so do Anthropic's
image blocks and the Responses API's input_image parts; http(s) URLs need
--allow-image-urls; /v1/models says which models take images; a model without a projector, a
broken image and a malformed part are 400s that name the problem."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
from tiny_vlm import png_bytes, test_image, write_tiny_vlm

from edge_infer import LLM, SamplingParams


def _chat(url: str, image_url: str, **extra: object) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                                      {"type": "text", "text": "what is it?"}]}],
            "max_tokens": 5, "temperature": 0, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_image_url_parts(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    text, mm = write_tiny_vlm(tmp_path, "idefics3")
    img = test_image(120, 80, seed=5)
    url = "data:image/png;base64," + base64.b64encode(png_bytes(img)).decode()
    srv = start_server(text, "--mmproj", str(mm))
    r = _chat(srv.url, url)
    assert r.status_code == 200, r.text
    body = r.json()
    with LLM(str(text), mmproj=str(mm), n_threads=2, kv_cache_memory="16MiB") as llm:
        msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "what is it?"}]}]
        want = llm.chat(msgs, SamplingParams(max_tokens=5, temperature=0))[0]
        assert body["usage"]["prompt_tokens"] == len(llm.chat_prompt(msgs))
    assert body["choices"][0]["message"]["content"] == want.outputs[0].text
    b64 = url.split(",", 1)[1]
    anthropic = httpx.post(srv.url + "/v1/messages", timeout=120, json={
        "model": "tiny-idefics3-text", "max_tokens": 5, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": "what is it?"}]}]})
    assert anthropic.status_code == 200, anthropic.text
    assert anthropic.json()["content"][0]["text"] == want.outputs[0].text  # the same prompt, the same answer
    responses = httpx.post(srv.url + "/v1/responses", timeout=120, json={
        "model": "tiny-idefics3-text", "max_output_tokens": 5, "temperature": 0, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": url}, {"type": "input_text", "text": "what is it?"}]}]})
    assert responses.status_code == 200, responses.text
    assert responses.json()["output"][0]["content"][0]["text"] == want.outputs[0].text
    cards = httpx.get(srv.url + "/v1/models", timeout=30).json()["data"]
    assert cards[0]["input_modalities"] == ["text", "image"]
    for bad, words in (("https://example.com/cat.png", "--allow-image-urls"),
                       ("data:image/png;base64,bm90IGFuIGltYWdl", "not an image"),
                       ("/etc/passwd", "not valid base64")):
        r = _chat(srv.url, bad)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": [{"type": "image_url"}]}], "max_tokens": 2})
    assert r.status_code == 400 and "image_url" in r.json()["error"]["message"], r.text

    plain = start_server(text)
    r = _chat(plain.url, url)
    assert r.status_code == 400 and "--mmproj" in r.json()["error"]["message"], r.text
    assert httpx.get(plain.url + "/v1/models", timeout=30).json()["data"][0]["input_modalities"] == ["text"]
