"""The webhook delivery job: POSTs a background turn's end to its target, signed, and tries
again from the queue until it is taken or the retry window is over (shared/webhooks.py
says what is sent and when it is queued).

Each attempt is one job run: sign with the attempt's time, POST (no redirect followed,
the answer's body never read), within `BERNARD_WEBHOOK_TIMEOUT_S` in all, and log it in
its owner's `DeliveryLog`. A 2xx answer delivers it. Anything else, or no answer, raises
arq's `Retry` with the next of `BERNARD_WEBHOOK_RETRY_DELAYS`: the job goes back on the
queue due then (worker/queue.py `finished`), holding no slot while it waits, so a worker
that stops meanwhile loses nothing. Once the delays are used up it is given up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import StrEnum
from typing import Any

import httpx
from arq import Retry
from redis.exceptions import RedisError

from shared.settings import Settings
from shared.webhooks import (
    Attempt,
    DeliveryLog,
    event_body,
    event_id,
    origin_of,
    secret_key,
    signed_headers,
)

logger = logging.getLogger("bernard.webhooks")

# The worker's client for deliveries, made at its first one (worker/main.py closes it).
CLIENT = "webhook_http"


class Delivered(StrEnum):
    """What became of a delivery (the job's result, or its log entry's `outcome`)."""

    DELIVERED = "delivered"
    RETRYING = "retrying"
    GAVE_UP = "gave_up"


async def deliver(
    ctx: dict[str, Any],
    owner: str,
    turn_id: str,
    kind: str,
    url: str,
    created_at: int,
    subject: str | None = None,
) -> Delivered:
    """One attempt at delivering the event `kind` of `owner`'s turn `turn_id` to `url`,
    naming the turn `subject` (shared/webhooks.py `subject_of`)."""
    settings: Settings = ctx["settings"]
    attempt = int(ctx.get("job_try") or 1)
    message_id = event_id(turn_id)
    body = event_body(turn_id, kind, created_at, subject)
    sent_at = time.time()
    status_code, error = None, None
    if settings.webhook_secret is None:
        error = "BERNARD_WEBHOOK_SECRET is no longer set: nothing to sign with"
    else:
        headers = signed_headers(
            secret_key(settings.webhook_secret), message_id, int(sent_at), body
        )
        status_code, error = await _post(_client(ctx), url, body, headers, settings)
    delays = settings.webhook_retry_delays_s()
    # Without a secret no later attempt can do better.
    retryable = error is not None and settings.webhook_secret is not None
    retry_in = delays[attempt - 1] if retryable and attempt <= len(delays) else None
    outcome = (
        Delivered.DELIVERED
        if error is None
        else Delivered.RETRYING
        if retry_in is not None
        else Delivered.GAVE_UP
    )
    entry = Attempt(
        event_id=message_id,
        turn_id=turn_id,
        type=kind,
        url=origin_of(url),
        attempt=attempt,
        at=sent_at,
        status_code=status_code,
        error=error,
        next_attempt_at=time.time() + retry_in if retry_in is not None else None,
        outcome=outcome,
    )
    log = DeliveryLog(ctx["bernard_redis"], owner, retention_s=settings.webhook_log_retention_s)
    try:
        await log.add(entry)
    except (RedisError, OSError) as exc:
        # The log is for its owner's eyes; the delivery goes on without it.
        logger.warning("webhook attempt of turn %s not logged: %s", turn_id, exc)
    if outcome is Delivered.GAVE_UP:
        logger.warning("webhook of turn %s given up after %d attempts: %s", turn_id, attempt, error)
    if retry_in is not None:
        raise Retry(defer=retry_in)
    return outcome


async def _post(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    settings: Settings,
) -> tuple[int | None, str | None]:
    """POST the event: the answer's status, and why it failed if it did."""
    try:
        async with asyncio.timeout(settings.webhook_timeout_s):
            async with client.stream("POST", url, content=body, headers=headers) as response:
                status = response.status_code
    except TimeoutError:
        return None, f"no answer within {settings.webhook_timeout_s:g} s"
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:300]
    if 200 <= status < 300:
        return status, None
    return status, f"answered {status}"


def _client(ctx: dict[str, Any]) -> httpx.AsyncClient:
    client: httpx.AsyncClient | None = ctx.get(CLIENT)
    if client is None:
        client = ctx[CLIENT] = httpx.AsyncClient(
            follow_redirects=False, headers={"user-agent": "Bernard-Webhooks"}
        )
    return client
