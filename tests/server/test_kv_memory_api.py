"""The server's KV memory options (smollm2): --kv-cache-dtype and the pool's bytes per token in
/metrics; slot save / restore / erase on the disk prefix cache (a saved prefix survives a
restart: restored into a new server's pool, a request starting with it computes only the rest
and answers as before); --context-shift past max_model_len; the errors name what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

TEXT = Path("/usr/share/common-licenses/GPL-3").read_text()[:2500]


def _complete(url: str, prompt: str, **extra: object) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(url + "/v1/completions", json=body, timeout=600)


def test_slots_save_and_restore_across_servers(start_server, get_metrics, smollm2_path: Path,  # type: ignore[no-untyped-def]
                                               tmp_path: Path) -> None:
    cache = str(tmp_path / "kv")
    srv = start_server(smollm2_path, "--prefix-cache-dir", cache, "--kv-cache-dtype", "q8_0")
    saved = httpx.post(srv.url + "/slots/gpl?action=save", json={"prompt": TEXT}, timeout=600)
    assert saved.status_code == 200, saved.text
    body = saved.json()
    assert body["id_slot"] == "gpl" and body["n_saved"] >= 400 and body["n_written"] > 0 and "save_ms" in body["timings"]
    want = _complete(srv.url, TEXT + " In short,").json()["choices"][0]["text"]
    m = get_metrics(srv.url)
    assert m["edge_infer_kv_cache_bytes_per_token"] == 30 * 3 * 2 * 34 * 2  # layers x heads x blocks x q8_0 bytes x K,V
    srv.stop()

    srv = start_server(smollm2_path, "--prefix-cache-dir", cache, "--kv-cache-dtype", "q8_0")
    restored = httpx.post(srv.url + "/slots/gpl?action=restore", json={}, timeout=600).json()
    assert restored["n_restored"] == body["n_saved"] and restored["n_read"] > 0
    assert _complete(srv.url, TEXT + " In short,").json()["choices"][0]["text"] == want
    assert get_metrics(srv.url)["edge_infer_prefix_cache_hit_rate"] > 0.5
    erased = httpx.post(srv.url + "/slots/gpl?action=erase", json={}, timeout=60).json()
    assert erased["n_erased"] == body["n_saved"]
    gone = httpx.post(srv.url + "/slots/gpl?action=restore", json={}, timeout=60)
    assert gone.status_code == 400 and "no prefix is saved under the name 'gpl'" in gone.json()["error"]["message"]
    for path, payload, words in (("/slots/gpl?action=load", {}, "action must be one of save, restore, erase"),
                                 ("/slots/-x?action=save", {"prompt": "x"}, "must be 1-64 letters"),
                                 ("/slots/a?action=save", {}, "save needs either prompt or messages")):
        r = httpx.post(srv.url + path, json=payload, timeout=60)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_slots_need_the_disk_cache_and_context_shift_runs_past_the_context(start_server,  # type: ignore[no-untyped-def]
                                                                           smollm2_path: Path) -> None:
    srv = start_server(smollm2_path, "--context-shift", "--keep", "4", "--max-model-len", "64")
    r = httpx.post(srv.url + "/slots/x?action=save", json={"prompt": "hello"}, timeout=60)
    assert r.status_code == 400 and "--prefix-cache-dir" in r.json()["error"]["message"]
    out = _complete(srv.url, "Once upon a time", max_tokens=150, ignore_eos=True).json()
    assert out["usage"]["completion_tokens"] == 150 and out["choices"][0]["finish_reason"] == "length"


def test_a_chat_past_the_context_keeps_its_system_prompt(start_server, smollm2_path: Path) -> None:  # type: ignore[no-untyped-def]
    """--context-shift without --keep: a chat's shift keeps its system prompt and cuts where one
    of its messages begins (the server's log at -v names each shift)."""
    from edge_infer.chat import ChatTemplate
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.tokenizer import Tokenizer

    msgs = [{"role": "system", "content": "You are a pirate. Answer like one."}]
    msgs += [{"role": "user" if i % 2 == 0 else "assistant", "content": TEXT[i * 160 : (i + 1) * 160]} for i in range(5)]
    with GGUFFile(smollm2_path) as f:
        tok = Tokenizer.from_gguf(f)
    template = ChatTemplate.from_gguf(str(smollm2_path))
    ids = template.encode(msgs, tok)
    starts = template.message_starts(msgs, tok, ids)
    srv = start_server(smollm2_path, "--context-shift", "--max-model-len", "256", "-v")
    body = {"messages": msgs, "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 200, r.text
    line = next(ln for ln in srv.log().splitlines() if "context shift of request chatcmpl-" in ln)
    kept, dropped = map(int, line.rsplit("kept ", 1)[1].split(", dropped "))
    assert kept == starts[0] and kept + dropped in starts[1:], (line, starts)


def test_usage_counts_the_prompt_tokens_the_prefix_cache_served(start_server, smollm2_path: Path) -> None:  # type: ignore[no-untyped-def]
    """OpenAI's usage.prompt_tokens_details.cached_tokens (completions, chat, streamed chat) and
    the Responses API's input_tokens_details: 0 for a new prompt, its full blocks again."""
    srv = start_server(smollm2_path)
    first = _complete(srv.url, TEXT[:1200]).json()["usage"]
    again = _complete(srv.url, TEXT[:1200]).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    n = again["prompt_tokens"]
    assert again["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16
    chat = {"messages": [{"role": "user", "content": TEXT[:1200]}], "max_tokens": 4, "temperature": 0}
    httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=600)
    for extra in ({}, {"stream": True, "stream_options": {"include_usage": True}}):
        r = httpx.post(srv.url + "/v1/chat/completions", json={**chat, **extra}, timeout=600)
        body = r.json() if not extra else json.loads(r.text.split("data: ")[-2])
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= body["usage"]["prompt_tokens"] - 16, body
    resp = httpx.post(srv.url + "/v1/responses", json={"input": TEXT[:1200], "max_output_tokens": 4}, timeout=600).json()
    assert resp["usage"]["input_tokens_details"]["cached_tokens"] >= resp["usage"]["input_tokens"] - 16, resp["usage"]
