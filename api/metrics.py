"""Prometheus metrics of this API process, served at `/metrics`.

What an operator watches: turns started by kind and mode, streams open now, frames
relayed, and how turns ended as the clients saw them.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, generate_latest

router = APIRouter()

TURNS_CREATED = Counter(
    "bernard_turns_created_total", "Turns created by this API process", ["kind", "mode"]
)
STREAMS_OPEN = Gauge("bernard_streams_open", "SSE streams this API process is relaying")
FRAMES_RELAYED = Counter("bernard_frames_relayed_total", "SSE data frames relayed to clients")
TURNS_ENDED = Counter(
    "bernard_turn_ends_relayed_total", "Terminal frames relayed, by turn status", ["status"]
)


@router.get("/metrics", include_in_schema=False)
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
