"""The peer Bernard's CPU per turn is held to (bench/peers.py): LangGraph used as a library in
one FastAPI process, as a team would serve an agent without a queue, a stream or a relay.

`uvicorn bench.langgraph_app:app` serves `POST /v1/chat/completions` streamed: LangGraph's
prebuilt ReAct agent on `ChatOpenAI` (the calculator offered, `OPENAI_BASE_URL` the bench's
upstream), its model's tokens (`stream_mode="messages"`) sent as chat-completion chunks
the moment they come. Nothing is stored: no checkpointer, no records.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from bench.langgraph_agent import react_agent, text_pieces


class ChatRequest(BaseModel):
    messages: list[dict[str, Any]]
    stream: bool = True


def _chunk(chunk_id: str, delta: dict[str, str], finish: str | None = None) -> bytes:
    body = {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "langgraph",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def create_langgraph_app() -> FastAPI:
    """The app, its agent built once (its model reads `OPENAI_*` from the environment)."""
    agent = react_agent()
    app = FastAPI(title="LangGraph as a library (bench peer)")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest) -> StreamingResponse:
        chunk_id = f"chatcmpl-{uuid.uuid4().hex}"

        async def frames() -> AsyncIterator[bytes]:
            yield _chunk(chunk_id, {"role": "assistant", "content": ""})
            async for piece in text_pieces(agent, body.messages):
                yield _chunk(chunk_id, {"content": piece})
            yield _chunk(chunk_id, {}, "stop")
            yield b"data: [DONE]\n\n"

        return StreamingResponse(frames(), media_type="text/event-stream")

    return app


app = create_langgraph_app()
