"""Reasoning text (`<think>...</think>`) into `reasoning_content`: the split of whole replies
written in the Qwen3 and R1 shapes, streaming char by char giving the same split, and through
the server on a tiny model whose template (ours) thinks, with the reply forced by a grammar
so the reasoning is certain, whole and streamed, and on a template that opens <think> itself."""

from __future__ import annotations

import json

import httpx
import pytest
from arch_models import write_arch_model

from edge_infer.server.reasoning import ReasoningStream, split_reasoning, thinks

pytestmark = pytest.mark.slow

# a template of our own in Qwen3's manner; the second opens <think> in the generation prompt (R1's)
THINK = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{# may reply <think>..</think> #}")
OPENED = THINK.replace("<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<think>\n{% endif %}")


@pytest.mark.parametrize(("text", "opened", "reasoning", "content"), [
    ("<think>\nadd the numbers\n</think>\n\nThe sum is 4.", False, "add the numbers", "The sum is 4."),
    ("plain answer", False, None, "plain answer"),
    ("still thinking when cut", True, "still thinking when cut", ""),
    ("step one\n</think>\n\nDone.", True, "step one", "Done."),
    ("<think>unfinished", False, "unfinished", ""),
])
def test_split_and_stream_agree(text: str, opened: bool, reasoning: str | None, content: str) -> None:
    assert split_reasoning(text, opened) == (reasoning, content)
    router, r_all, c_all = ReasoningStream(opened), "", ""
    for i in range(1, len(text) + 1):
        r, c = router.feed(text[:i], i == len(text))
        r_all, c_all = r_all + r, c_all + c
    assert (r_all.strip() if reasoning is not None else None, c_all) == (reasoning, content)
    assert thinks(THINK) and thinks(OPENED) and not thinks("{{ messages }}")


@pytest.fixture(scope="module")
def servers(start_server, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    out = {}
    for name, template in (("think", THINK), ("opened", OPENED)):
        path = write_arch_model(tmp_path_factory.mktemp(name) / "m.gguf", "llama", chat_template=template)
        out[name] = start_server(path, "-t", "1", "--kv-cache-memory", "8MiB")
    return out


FORCED = {"think": 'root ::= "<think>" [a-z ]{3,12} "</think>" [a-z]{2,8}',
          "opened": 'root ::= [a-z ]{3,12} "</think>" [a-z]{2,8}'}


@pytest.mark.parametrize("name", ["think", "opened"])
def test_reasoning_content_whole_and_streamed(servers, name: str) -> None:  # type: ignore[no-untyped-def]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "temperature": 0,
            "guided_grammar": FORCED[name]}
    url = servers[name].url + "/v1/chat/completions"
    msg = httpx.post(url, json=body, timeout=60).json()["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"] and "<think>" not in msg["content"] + msg["reasoning_content"]
    reasoning, content = "", ""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for ch in json.loads(line[6:])["choices"]:
                    reasoning += ch["delta"].get("reasoning_content", "")
                    content += ch["delta"].get("content", "")
    assert (reasoning.strip(), content) == (msg["reasoning_content"], msg["content"])
