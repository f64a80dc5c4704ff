"""OpenAI-compatible HTTP server: an asyncio (FastAPI/uvicorn) front to one engine thread.

protocol.py validates requests, engine_client.py bridges the engine thread to the event loop,
completions.py and chat.py build OpenAI's responses and SSE streams, metrics.py renders
Prometheus text and app.py wires the routes (the `edge-infer serve` command that starts it
is edge_infer/cli/serve.py). Importing this package is cheap: FastAPI is imported only when a server is built.
"""
