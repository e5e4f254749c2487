"""Prometheus metrics, served at `/metrics` to a scraper on loopback, or holding
`BERNARD_METRICS_KEY` (api/auth.py).

This API process's own: turns created by kind and mode, streams open now, frames relayed.

The deployment's: how turns ended (`bernard_turns_ended_total{status, code}`). A turn ends
once, in whichever process ends it (a worker, or any process's reaper), and the script
that ends it counts it in Redis (`keys.METRICS`, shared/turns/moves.py). Every API process reads
those counts at scrape time, so they count each turn once whoever relayed it, streamed or
not, and every API process reports the same totals: aggregate them with `max`, not `sum`.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from api.auth import metrics_scraper
from api.state import State
from shared import keys
from shared.connection import reply_text

router = APIRouter()

TURNS_CREATED = Counter(
    "bernard_turns_created_total", "Turns created by this API process", ["kind", "mode"]
)
STREAMS_OPEN = Gauge("bernard_streams_open", "SSE streams this API process is relaying")
FRAMES_RELAYED = Counter("bernard_frames_relayed_total", "SSE data frames relayed to clients")


class TurnEndings(Collector):
    """`bernard_turns_ended_total` from the counts in Redis, as last read."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "bernard_turns_ended",
            "Turns ended in the whole deployment, by status and error code (each once)",
            labels=["status", "code"],
        )
        for field, count in sorted(self.counts.items()):
            status, _, code = field.partition(":")
            if code or status == "completed":
                family.add_metric([status, code], count)
        yield family


TURN_ENDINGS = TurnEndings()
REGISTRY.register(TURN_ENDINGS)


@router.get("/metrics", include_in_schema=False, dependencies=[Depends(metrics_scraper)])
async def metrics(state: State) -> Response:
    try:
        raw = await state.queue.hgetall(keys.METRICS)  # type: ignore[misc]
    except (RedisError, OSError):
        raw = None  # Redis is down: serve this process's own metrics and the last counts
    if raw is not None:
        TURN_ENDINGS.counts = {reply_text(k): int(v) for k, v in raw.items()}
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
