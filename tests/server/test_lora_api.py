"""LoRA adapters over the HTTP API (issue #43): `serve --lora`, a request's `model: "<adapter>"`
(vLLM's way) and llama.cpp's `lora: [{id, scale}]` field, /v1/models' adapter cards with their
`parent`, GET / POST /lora-adapters, the 400s, and --lora's parsing.

One server on the real smollm2-135m with two random adapters (`ad` by NAME=FILE, `b` by
FILE:SCALE, named by its stem); greedy outputs are checked against LLM.generate with the same
adapter on the same prompt tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from lora_files import write_lora

from edge_infer import LLM, SamplingParams
from edge_infer.cli.args import lora_options
from edge_infer.errors import InvalidRequest

pytestmark = pytest.mark.slow

PROMPT = "The lighthouse keeper climbed the stairs and"
CHAT = [{"role": "user", "content": "Name a primary colour."}]
N = 8


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("lora-api")
    return {"ad": write_lora(d / "ad.gguf", smollm2_path, rank=8, strength=0.2, seed=0),
            "b": write_lora(d / "b.gguf", smollm2_path, rank=4, strength=0.2, seed=1, targets=("attn_q", "ffn_down"))}


@pytest.fixture(scope="module")
def server(start_server, smollm2_path: Path, adapters: dict[str, Path]):  # type: ignore[no-untyped-def]
    return start_server(smollm2_path, "-t", "2", "--kv-cache-memory", "32MiB", "--max-model-len", "256",
                        "--lora", f"ad={adapters['ad']}", "--lora", f"{adapters['b']}:0.5")


@pytest.fixture(scope="module")
def base(server) -> str:  # type: ignore[no-untyped-def]
    return httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def ids(server) -> list[int]:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def post(server: Any, route: str, body: Any, status: int = 200) -> Any:
    r = httpx.post(server.url + route, json=body, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def complete(server: Any, ids: list[int], model: str, **extra: Any) -> str:
    body = post(server, "/v1/completions", {"model": model, "prompt": ids, "max_tokens": N, "temperature": 0, **extra})
    assert body["model"] == model
    return str(body["choices"][0]["text"])


@pytest.fixture(scope="module")
def texts(server, base: str, ids: list[int]) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Greedy completions of the prompt: the base model's and adapter ad's (at its default scale 1)."""
    return {"base": complete(server, ids, base), "ad": complete(server, ids, "ad")}


def test_models_list_adapters_with_parent(server, base: str, adapters: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    cards = httpx.get(server.url + "/v1/models", timeout=30).json()["data"]
    assert [c["id"] for c in cards] == [base, "ad", "b"]
    assert "parent" not in cards[0] and cards[1]["parent"] == base and cards[2]["parent"] == base
    one = httpx.get(server.url + "/v1/models/ad", timeout=30).json()
    assert one["id"] == "ad" and one["parent"] == base
    listed = httpx.get(server.url + "/lora-adapters", timeout=30).json()
    assert listed == [{"id": 0, "path": str(adapters["ad"]), "scale": 1.0, "name": "ad"},
                      {"id": 1, "path": str(adapters["b"]), "scale": 0.5, "name": "b"}]


def test_adapter_by_model_matches_offline_and_lora_field(server, base: str, ids: list[int], texts: dict[str, str],
                                                         adapters: dict[str, Path], smollm2_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert texts["ad"] != texts["base"]  # the adapter moves the greedy output
    assert complete(server, ids, base, lora=[{"id": 0, "scale": 1.0}]) == texts["ad"]
    params = SamplingParams(temperature=0, max_tokens=N)
    with LLM(str(smollm2_path), n_threads=1, kv_cache_memory="16MiB", max_model_len=256) as llm:
        assert llm.generate([ids], params)[0].text == texts["base"]  # no adapter anywhere: the server's base
        llm.load_adapter("ad", str(adapters["ad"]))
        assert llm.generate([ids], params, adapter="ad")[0].text == texts["ad"]
        llm.load_adapter("b", str(adapters["b"]), 0.5)
        want_b = llm.generate([ids], params, adapter="b")[0].text
    assert complete(server, ids, "b") == want_b  # b's default scale from --lora FILE:0.5


def test_scale_zero_is_the_base(server, base: str, ids: list[int], texts: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    assert complete(server, ids, base, lora=[{"id": 0, "scale": 0}]) == texts["base"]
    assert complete(server, ids, "ad", lora=[{"id": 0, "scale": 0.0}]) == texts["base"]  # the entry wins
    assert complete(server, ids, base, lora=[]) == texts["base"]


def test_chat_messages_and_responses_by_adapter_name(server, base: str) -> None:  # type: ignore[no-untyped-def]
    greedy = {"max_tokens": N, "temperature": 0}
    chat = post(server, "/v1/chat/completions", {"model": "ad", "messages": CHAT, **greedy})
    text = chat["choices"][0]["message"]["content"]
    assert chat["model"] == "ad"
    listed = post(server, "/v1/chat/completions", {"model": base, "messages": CHAT, "lora": [{"id": 0, "scale": 1}],
                                                   **greedy})
    assert listed["choices"][0]["message"]["content"] == text and listed["model"] == base
    msg = post(server, "/v1/messages", {"model": "ad", "messages": CHAT, **greedy})
    assert msg["model"] == "ad" and msg["content"][0]["text"] == text
    resp = post(server, "/v1/responses", {"model": "ad", "input": CHAT[0]["content"], "max_output_tokens": N,
                                          "temperature": 0})
    assert resp["model"] == "ad" and resp["output"][-1]["content"][0]["text"] == text


def test_lora_adapters_post_sets_default_scales(server, base: str, ids: list[int], texts: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    half = complete(server, ids, base, lora=[{"id": 0, "scale": 0.5}])
    try:
        out = post(server, "/lora-adapters", [{"id": 0, "scale": 0.5}])
        assert [(a["id"], a["name"], a["scale"]) for a in out] == [(0, "ad", 0.5), (1, "b", 0.5)]
        assert httpx.get(server.url + "/lora-adapters", timeout=30).json() == out
        assert complete(server, ids, "ad") == half
        post(server, "/lora-adapters", [{"id": 0, "scale": 0}])
        assert complete(server, ids, "ad") == texts["base"]  # 0 drops it
        assert complete(server, ids, base, lora=[{"id": 0, "scale": 1}]) == texts["ad"]  # an entry's own scale
    finally:
        post(server, "/lora-adapters", [{"id": 0, "scale": 1.0}])
    assert complete(server, ids, "ad") == texts["ad"]


@pytest.mark.parametrize(("lora", "param", "words"), [
    ("x", "lora", "valid list"),
    ({"id": 0, "scale": 1}, "lora", "valid list"),
    ([{"id": 7, "scale": 1}], "lora[0].id", "no LoRA adapter has id 7"),
    ([{"id": 0, "scale": "x"}], "lora[0].scale", "valid number"),
    ([{"id": 0, "scale": True}], "lora[0].scale", "valid number"),
    ([{"id": "0", "scale": 1}], "lora[0].id", "valid integer"),
    ([{"id": 0}], "lora[0].scale", "required"),
    ([{"id": 0, "scale": 1, "weight": 2}], "lora[0].weight", "not permitted"),
    ([{"id": 0, "scale": 1}, {"id": 0, "scale": 0.5}], "lora[1].id", "listed twice"),
])
def test_bad_lora_field_is_a_400_naming_it(server, base: str, lora: Any, param: str, words: str) -> None:  # type: ignore[no-untyped-def]
    for route, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", {"messages": CHAT})):
        err = post(server, route, {"model": base, "max_tokens": 1, "lora": lora, **body}, 400)["error"]
        assert err["param"] == param and words in err["message"] and param in err["message"], err


def test_other_refusals(server, base: str) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/completions", timeout=60, headers={"Content-Type": "application/json"},
                   content=b'{"prompt": "Hi", "max_tokens": 1, "lora": [{"id": 0, "scale": 1e400}]}')
    assert r.status_code == 400 and "lora[0].scale must be a finite number" in r.text, r.text
    err = post(server, "/v1/messages", {"model": base, "max_tokens": 1, "messages": CHAT, "lora": []}, 400)["error"]
    assert "lora" in err["message"]  # the field is the OpenAI / llama.cpp routes' only
    err = post(server, "/v1/embeddings", {"model": "ad", "input": "Hi"}, 400)["error"]
    assert err["param"] == "model" and "LoRA adapter" in err["message"]
    assert post(server, "/v1/completions", {"model": "nope", "prompt": "Hi"}, 404)["error"]["param"] == "model"
    for body, words in (({"id": 0, "scale": 1}, "must be a list"), ([{"id": 9, "scale": 1}], "no LoRA adapter has id 9"),
                        ([{"id": 0}], "exactly id and scale"), ([{"id": 0, "scale": "x"}], "[0].scale must be a finite"),
                        ([{"id": 1.5, "scale": 1}], "[0].id must be an integer"),
                        ([{"id": 0, "scale": 1}, {"id": 0, "scale": 1}], "listed twice")):
        assert words in post(server, "/lora-adapters", body, 400)["error"]["message"], body
    assert httpx.get(server.url + "/lora-adapters", timeout=30).json()[0]["scale"] == 1.0  # nothing was set


def test_lora_flag_parsing(tmp_path: Path) -> None:
    f = tmp_path / "style.gguf"
    f.write_bytes(b"GGUF")
    assert lora_options(None) == ()
    assert lora_options([f"a={f}", f"{f}:0.25", f"c={f}:-1"]) == (("a", str(f), 1.0), ("style", str(f), 0.25),
                                                                   ("c", str(f), -1.0))
    for value, words in ((f"={f}", "name before '=' is empty"), (f"a={tmp_path / 'no.gguf'}", "no such file"),
                         (f"a={f}:abc", "finite number, got 'abc'"), (f"a={f}:nan", "finite number"),
                         (f"a={f}:inf", "finite number"), ("a=", "no adapter file"), (f"a={tmp_path}", "is a directory"),
                         (str(tmp_path / "missing.gguf"), "no such file")):
        with pytest.raises(InvalidRequest, match="--lora") as e:
            lora_options([value])
        assert words in str(e.value), (value, e.value)
    with pytest.raises(InvalidRequest, match="two adapters are named 'style'"):
        lora_options([str(f), f"style={f}"])


def test_serve_refuses_bad_lora_without_traceback(tmp_path: Path, smollm2_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from edge_infer.cli import main

    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF")
    assert main(["serve", "-m", str(smollm2_path), "--lora", f"a={f}:fast"]) == 1
    assert main(["serve", "-m", str(smollm2_path), "--lora", f"{smollm2_path.stem}={f}"]) == 1  # the model's own name
    err = capsys.readouterr().err
    assert "--lora" in err and "finite number" in err and "is taken already" in err and "Traceback" not in err, err
