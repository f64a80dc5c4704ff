"""Stream a chat reply token by token with the model's own chat template.

    python examples/chat_stream.py "Explain what a KV cache is in two sentences."
"""

import sys

from edge_infer import LLM, SamplingParams

question = " ".join(sys.argv[1:]) or "Write a haiku about autumn."
with LLM("smollm2-135m") as llm:
    prompt = llm.chat_prompt([{"role": "user", "content": question}])  # token ids
    for delta in llm.stream(prompt, SamplingParams(max_tokens=128, temperature=0.7, seed=1)):
        print(delta, end="", flush=True)
    print()
