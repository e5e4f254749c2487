"""The webhook delivery job: POSTs a background turn's end to its target, signed, and tries
again from the queue until it is taken or the retry window is over (shared/webhooks.py
says what is sent and when it is queued).

Each attempt is one job run: sign with the attempt's time, POST (no redirect followed,
the answer's body never read; unless `BERNARD_WEBHOOK_ALLOW_PRIVATE`, to the public address
the host was checked to resolve to, `pinned`, or not at all when one it resolves to is not
public), within `BERNARD_WEBHOOK_TIMEOUT_S` in all, and log it in its owner's
`DeliveryLog`, which takes the pending delivery off the turn's record in the same round
trip (shared/webhooks.py `taken`: from then on the queue alone holds it). A
worker takes a job off the queue as it starts it (worker/queue.py), so before it POSTs,
the attempt puts its job back, due once the attempt is surely over, with arq's
in-progress mark lapsing then too (`_hold`): should the worker die mid-attempt (SIGKILL,
out of memory), another one tries again then, rather than the delivery being lost. An
attempt that ends takes that entry off (arq's finish) or moves it to its retry. A 2xx
answer delivers it. Anything else, or no answer, raises arq's `Retry` with the next of
`BERNARD_WEBHOOK_RETRY_DELAYS`: the job goes back on the queue due then
(worker/queue.py `finished`), holding no slot while it waits, so a worker that stops
meanwhile loses nothing. Once the delays are used up it is given up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import StrEnum
from typing import Any

import httpx
from arq import Retry
from arq.constants import in_progress_key_prefix
from redis.exceptions import RedisError

from shared.settings import Settings
from shared.webhook_targets import PrivateTarget, public_address
from shared.webhooks import (
    Attempt,
    DeliveryLog,
    event_body,
    event_id,
    logged_origin,
    secret_key,
    signed_headers,
)

logger = logging.getLogger("bernard.webhooks")

# The worker's client for deliveries, made at its first one (worker/main.py closes it).
WEBHOOK_CLIENT = "webhook_http"
# Beyond `BERNARD_WEBHOOK_TIMEOUT_S`, what an attempt may take (its log entry; arq stops
# the job there: worker/main.py), before another worker may take it for lost.
ATTEMPT_MARGIN_S = 10.0


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
        await _hold(ctx, settings)
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
        url=logged_origin(url),
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


async def _hold(ctx: dict[str, Any], settings: Settings) -> None:
    """Should this worker die during the attempt, have another try again once the attempt
    is surely over: the job back on its queue, due then, and its in-progress mark lapsing
    then (not at the turns' job timeout, minutes later)."""
    job_id = ctx.get("job_id")
    if not job_id:
        return  # called outside a worker (no queue to hold on)
    lapse_ms = round((settings.webhook_timeout_s + ATTEMPT_MARGIN_S) * 1000)
    async with ctx["redis"].pipeline(transaction=False) as pipe:
        pipe.zadd(settings.queue_name, {job_id: round(time.time() * 1000) + lapse_ms})
        pipe.pexpire(in_progress_key_prefix + job_id, lapse_ms)
        await pipe.execute()


async def _post(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    settings: Settings,
) -> tuple[int | None, str | None]:
    """POST the event: the answer's status, and why it failed if it did. Every attempt that
    got no HTTP answer reads the same in its owner's log (a refused connection, a reset, a
    server speaking another protocol, a timeout): the log is not to tell a user which ports
    of an allowed host are closed and which speak something else. The worker's log says."""
    try:
        async with asyncio.timeout(settings.webhook_timeout_s):
            target, extensions = httpx.URL(url), dict[str, Any]()
            if not settings.webhook_allow_private:
                target, pin, extensions = pinned(url, await public_address(url))
                headers = {**headers, **pin}
            async with client.stream(
                "POST", target, content=body, headers=headers, extensions=extensions
            ) as response:
                status = response.status_code
    except PrivateTarget as exc:
        logger.warning("webhook POST to %s refused: %s", logged_origin(url), exc)
        return None, "refused: the receiver is not public (BERNARD_WEBHOOK_ALLOW_PRIVATE)"
    except (TimeoutError, httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        logger.info(
            "webhook POST to %s got no HTTP answer: %s",
            logged_origin(url),
            f"{type(exc).__name__}: {exc}"[:300],
        )
        return None, f"no HTTP answer within {settings.webhook_timeout_s:g} s"
    if 200 <= status < 300:
        return status, None
    return status, f"answered {status}"


def pinned(url: str, address: str) -> tuple[httpx.URL, dict[str, str], dict[str, Any]]:
    """The POST to `url` sent to `address`, the one its host was checked to resolve to
    (shared/webhook_targets.py `public_address`): the URL with the address for its host,
    and the headers and extensions that keep the host's name where it belongs (the Host
    header; over TLS, the SNI name the certificate is checked against). `Connection: close`,
    as the client's pool knows a connection by its address alone: another name on the same
    address must not reuse a TLS connection whose certificate was checked for this one."""
    parsed = httpx.URL(url)
    extensions = {"sni_hostname": parsed.host} if parsed.scheme == "https" else {}
    headers = {"host": parsed.netloc.decode("ascii"), "connection": "close"}
    return parsed.copy_with(host=address.partition("%")[0]), headers, extensions


def _client(ctx: dict[str, Any]) -> httpx.AsyncClient:
    client: httpx.AsyncClient | None = ctx.get(WEBHOOK_CLIENT)
    if client is None:
        client = ctx[WEBHOOK_CLIENT] = httpx.AsyncClient(
            follow_redirects=False, headers={"user-agent": "Bernard-Webhooks"}
        )
    return client
