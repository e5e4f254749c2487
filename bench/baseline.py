"""The baseline the pipeline is held to: the same turn in one process, no queue, no stream.

`uvicorn bench.baseline:app` serves `POST /v1/chat/completions` like the API does (FastAPI,
the same request model and validation, the same `ChatEncoder`, the same
response, `api.sse.FrameResponse`), but runs the turn in the request itself: it builds the
`TurnContext` the worker would build, iterates the worker's own `worker.turn.turn_items`
(whose `ChatOpenAI` calls the same scripted upstream) and encodes each event into SSE
frames the moment it is yielded. There is no Redis, no arq job, no turn record, no stream
and no relay: that is exactly what the pipeline adds.

Each frame's SSE `id` is `b<wall-clock time the event was yielded>`, the counterpart of the
`at` the worker stamps on a stream entry, so the benchmark can measure "event produced →
client receipt" here the way it measures "XADD → client receipt" through the pipeline. A
client that disconnects closes the turn's generator, which closes the upstream response.
"""

from __future__ import annotations

import gc
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing

from fastapi import FastAPI

from api.encodings.chat import ChatEncoder
from api.relay import sse_text
from api.schemas import ChatCompletionRequest
from api.sse import FrameResponse
from shared.endings import completed
from shared.events import Event, Start
from shared.settings import MODEL_ID, Settings, get_settings
from shared.turn_record import TurnRecord
from worker.calls import stream_events
from worker.context import TurnContext
from worker.llm import build_models
from worker.tools import default_tools
from worker.turn import turn_items


def create_baseline_app(settings: Settings | None = None) -> FastAPI:
    """The in-process baseline for `settings` (read from the environment when not given)."""
    settings = settings or get_settings()
    models = build_models(settings)
    router, responder = models.router, models.responder
    tools = default_tools()
    app = FastAPI(title="Bernard benchmark baseline")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest) -> FrameResponse:
        body.check_honourable()
        request = body.to_turn()
        record = TurnRecord(id=uuid.uuid4().hex, owner="local", request=request, model=MODEL_ID)
        encoder = ChatEncoder(record)

        def frames(event: Event) -> bytes:
            frame_id = f"b{time.time():.6f}"
            return "".join(sse_text(f, frame_id) for f in encoder.frames(event)).encode()

        async def events() -> AsyncGenerator[bytes, None]:
            yield frames(Start())
            ctx = TurnContext.for_request(
                record.id, request.agent, settings, router, responder, tools=tools
            )
            async with aclosing(turn_items(ctx)) as items:
                async for item in items:
                    for event in stream_events(item):
                        yield frames(event)
            yield frames(completed(ctx.finish_reason, ctx.usage))

        return FrameResponse(events(), headers={"X-Bernard-Turn-Id": record.id})

    # As the API and the worker do once started: startup objects stay out of full GC passes.
    gc.freeze()
    return app


app = create_baseline_app()
