"""Signed webhooks: what is POSTed when a background turn ends, how it is signed, where it
goes, and each user's log of the attempts.

The event is OpenAI's webhook event, signed per Standard Webhooks as OpenAI signs its own, so
the `openai` SDK's `client.webhooks.unwrap` verifies it (the ten lines of HMAC are here rather
than a dependency). Whichever process ends the turn queues its delivery, and the target stays
in the turn's record until the delivery takes it, so a crash between the two loses nothing
(docs/redis.md, "Webhook deliveries"). worker/webhooks.py sends it and retries from the queue.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from shared import keys
from shared.events import Done, TurnStatus
from shared.queue import BackgroundKind, background_job_id, enqueue_due
from shared.webhook_targets import WebhookTargetError, check_targets

if TYPE_CHECKING:
    from shared.settings import Settings

DELIVER_WEBHOOK = "deliver_webhook"
# The record's field holding a background turn's webhook target (`Target`), if it has one.
TARGET_FIELD = "webhook"
# The most attempts a user's log keeps (the newest).
LOG_MAX = 100
# The retry window must end before arq's job key (a day from the enqueue) does.
_WINDOW_MAX_S = 20 * 3600
_SECRET_PREFIX = "whsec_"


class WebhookSettingsError(ValueError):
    """The webhook settings cannot work as given."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret; `WebhookSettingsError` when it is not one."""
    if not secret.startswith(_SECRET_PREFIX):
        raise WebhookSettingsError("BERNARD_WEBHOOK_SECRET must start with whsec_")
    try:
        key = base64.b64decode(secret[len(_SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise WebhookSettingsError(
            "BERNARD_WEBHOOK_SECRET must be whsec_ followed by base64"
        ) from None
    if not key:
        raise WebhookSettingsError("BERNARD_WEBHOOK_SECRET must not be empty")
    return key


def check_webhook_settings(settings: Settings) -> None:
    """Refuse webhook settings that cannot work: a target without a secret to sign with, a
    secret that is not `whsec_<base64>`, targets shared/webhook_targets.py refuses, retry
    delays that are not positive numbers or outlast the queue's hold on a job."""
    if settings.webhook_secret is not None:
        secret_key(settings.webhook_secret)
    elif settings.webhook_url or settings.webhook_origins.strip():
        raise WebhookSettingsError(
            "BERNARD_WEBHOOK_URL and BERNARD_WEBHOOK_ORIGINS need BERNARD_WEBHOOK_SECRET "
            "(whsec_ and base64) to sign with"
        )
    try:
        check_targets(settings)
    except WebhookTargetError as exc:
        raise WebhookSettingsError(str(exc)) from None
    try:
        delays = settings.webhook_retry_delays_s()
    except ValueError:
        raise WebhookSettingsError(
            "BERNARD_WEBHOOK_RETRY_DELAYS must be comma-separated seconds"
        ) from None
    if any(delay <= 0 for delay in delays) or sum(delays) > _WINDOW_MAX_S:
        raise WebhookSettingsError(
            "BERNARD_WEBHOOK_RETRY_DELAYS must be positive seconds adding up to at most "
            f"{_WINDOW_MAX_S} (20 hours)"
        )


@dataclass(frozen=True, slots=True)
class Target:
    """Where a turn's webhook goes: the URL, the queue its delivery job goes on, and the
    id the event names: the one its client was given (api/encodings/ `subject_of`)."""

    url: str
    queue: str
    subject: str

    def stored(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def restored(cls, raw: bytes | str) -> Target:
        return cls(**orjson.loads(raw))


def event_type(done: Done) -> str:
    """OpenAI's webhook event type for a turn that ended with `done`. A turn paused for a
    confirmation, or ended on a client's tool call, has completed its response."""
    if done.status is TurnStatus.FAILED:
        return "response.failed"
    if done.status is TurnStatus.CANCELLED:
        return "response.cancelled"
    if done.finish_reason == "length":
        return "response.incomplete"
    return "response.completed"


def event_id(turn_id: str) -> str:
    """The id of the event a turn's end sends, also its `webhook-id`: one per turn."""
    return f"evt_{turn_id}"


def event_body(turn_id: str, kind: str, created_at: int, subject: str | None = None) -> bytes:
    """The event's JSON body, as OpenAI's webhook events are; `data.id` is `subject`
    (default: the turn id)."""
    return orjson.dumps(
        {
            "id": event_id(turn_id),
            "object": "event",
            "created_at": created_at,
            "type": kind,
            "data": {"id": subject or turn_id},
        }
    )


def sign(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """Standard Webhooks' `webhook-signature` value for one attempt."""
    signed = b"%s.%d.%s" % (message_id.encode(), timestamp, body)
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(key: bytes, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one attempt."""
    return {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(key, message_id, timestamp, body),
    }


def delivery_job_id(owner: str, turn_id: str) -> str:
    """The delivery job of a turn's end: one per turn."""
    return background_job_id(BackgroundKind.WEBHOOK, owner, turn_id)


def enqueue_delivery(
    pipe: Pipeline, target: Target, owner: str, turn_id: str, done: Done, ended_at: float
) -> None:
    """Queue the delivery of the turn's end to `target`, in `pipe` (on the queue role)."""
    enqueue_due(
        pipe,
        target.queue,
        delivery_job_id(owner, turn_id),
        DELIVER_WEBHOOK,
        owner,
        turn_id,
        event_type(done),
        target.url,
        int(ended_at),
        target.subject,
    )


def taken(pipe: Pipeline, turn_id: str) -> None:
    """Its job took the turn's delivery: the target leaves the ended record, so a later
    ending of the turn (FINISH's "over") no longer queues it. HDEL creates no key: a
    record gone meanwhile stays gone."""
    pipe.hdel(keys.turn(turn_id), TARGET_FIELD)


def logged_origin(url: str) -> str:
    """What the log shows of a URL: scheme, host and port, never its path or query (a
    deployment's URL may carry a token its users are not to read)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


@dataclass(slots=True)
class Attempt:
    """One attempt at a delivery, as its owner's log shows it."""

    event_id: str
    turn_id: str
    type: str
    url: str  # `logged_origin` the target
    attempt: int  # 1 for the first
    at: float  # when it was sent (epoch s)
    status_code: int | None  # the receiver's answer; None when none came
    error: str | None  # why it failed, when it did
    # When it is tried again (epoch s); None once it was delivered or given up.
    next_attempt_at: float | None
    outcome: str  # "delivered", "retrying", "gave_up"


class DeliveryLog:
    """One user's log of webhook attempts (data role, `keys.webhook_deliveries`)."""

    def __init__(self, redis: Redis, owner: str, *, retention_s: int) -> None:
        self.redis = redis
        self.key = keys.webhook_deliveries(owner)
        self.retention_s = retention_s

    async def add(self, attempt: Attempt) -> None:
        """Log the attempt and, in the same round trip, take its turn's delivery (`taken`)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.lpush(self.key, orjson.dumps(asdict(attempt)))
            pipe.ltrim(self.key, 0, LOG_MAX - 1)
            pipe.expire(self.key, self.retention_s)
            taken(pipe, attempt.turn_id)
            await pipe.execute()

    async def recent(self) -> list[dict[str, Any]]:
        """The attempts, newest first."""
        raw = await self.redis.lrange(self.key, 0, LOG_MAX - 1)  # type: ignore[misc]
        return [orjson.loads(entry) for entry in raw]
