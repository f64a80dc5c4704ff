"""Talk to `edge-infer serve` with the official OpenAI client (`pip install openai`).

    edge-infer serve -m smollm2-135m --port 8000 &
    python examples/openai_client.py
"""

from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
stream = client.chat.completions.create(
    model="smollm2-135m",
    messages=[{"role": "user", "content": "Name three uses of a paperclip."}],
    max_tokens=64,
    stream=True,
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
print()
