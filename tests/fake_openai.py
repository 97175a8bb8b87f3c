"""A scripted OpenAI-compatible server for benchmark-harness tests: `python tests/fake_openai.py
--port P [--short] [--gap-ms G]`. Streams max_tokens chunks G ms apart (one fewer with --short)."""

from __future__ import annotations

import argparse
import asyncio
import json

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route


def app(short: bool, gap_ms: float) -> Starlette:
    async def completions(req):
        body = await req.json()
        n = body["max_tokens"] - (1 if short else 0)

        async def gen():
            for i in range(n):
                await asyncio.sleep(gap_ms / 1000)
                yield (
                    "data: "
                    + json.dumps(
                        {"choices": [{"index": 0, "text": f"t{i}", "finish_reason": "length" if i == n - 1 else None}]}
                    )
                    + "\n\n"
                )
            yield "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": n}}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/health", lambda r: JSONResponse({"status": "ok"})),
            Route("/v1/models", lambda r: JSONResponse({"data": [{"id": "fake"}]})),
        ]
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--short", action="store_true")
    p.add_argument("--gap-ms", type=float, default=5)
    a = p.parse_args()
    uvicorn.run(app(a.short, a.gap_ms), host="127.0.0.1", port=a.port, log_level="error")
