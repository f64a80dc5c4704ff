"""LangChain drives edge-infer's OpenAI server: a tool-calling agent loop with ChatOpenAI.

    edge-infer serve -m qwen2.5-coder-1.5b --port 8000 &
    python examples/langchain_tools.py [--base-url http://127.0.0.1:8000/v1]

The model is bound to two tools; the first turn must call one (tool_choice names it, so the
call always parses), the tool runs here, its result goes back as a ToolMessage, and the final
turn answers with tools off (tool_choice "none": small models otherwise call again).
"""

from __future__ import annotations

import argparse
import json

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return json.dumps({"city": city, "temperature_celsius": 31, "sky": "sunny"})


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def run(base_url: str, model: str, api_key: str = "none") -> tuple[list, str]:
    """(the tool calls of the first turn, the final answer)."""
    llm = ChatOpenAI(base_url=base_url, api_key=api_key, model=model, temperature=0, max_tokens=96)
    messages: list = [HumanMessage("What is the weather in Paris right now?")]
    first = llm.bind_tools([get_weather, add], tool_choice="get_weather").invoke(messages)
    messages.append(first)
    tools = {"get_weather": get_weather, "add": add}
    for call in first.tool_calls:
        messages.append(ToolMessage(tools[call["name"]].invoke(call["args"]), tool_call_id=call["id"]))
    final = llm.bind_tools([get_weather, add], tool_choice="none").invoke(messages)
    return first.tool_calls, str(final.content)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    a = ap.parse_args()
    calls, answer = run(a.base_url, a.model)
    print("tool calls:", calls)
    print("answer:", answer)


if __name__ == "__main__":
    main()
