"""How a turn ends, as every client sees it: one table, used by every path.

A turn ends once, with a `done` entry in its stream (shared/turns/moves.py, `TurnStore.finish`).
Unless it completed, that `Done` carries the error the client sees, built here from
`ENDINGS`; the turn record stores the same error. Every way a client can learn the
ending reads one of those two and renders it with the same code:

- the live stream and a resumed one (api/encodings/chunks.py: the error frame),
- the replay after the stream's retention (api/encodings/, `compacted`),
- the non-stream answer (api/turn_service.py: the HTTP status and envelope from `http_status`),
- the polled turn object (api/turn_service.py, `turn_object`: the record's `error`).

So a cancelled turn says `turn_cancelled` with type `cancelled` whichever way it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.errors import ErrorCode
from shared.events import Done, Error, Event, TurnStatus


@dataclass(frozen=True, slots=True)
class Ending:
    """One way a turn can end short of completing."""

    status: TurnStatus
    type: str  # the envelope's `type`
    message: str  # what the client reads unless the ending names a more specific reason
    http_status: int  # of a non-stream request whose turn ended this way
    # Whether trying again later may work: such answers carry `Retry-After`.
    retry: bool = False


FAILED, CANCELLED = TurnStatus.FAILED, TurnStatus.CANCELLED
ENDINGS: dict[ErrorCode, Ending] = {
    ErrorCode.TURN_CANCELLED: Ending(CANCELLED, "cancelled", "the turn was cancelled", 409),
    ErrorCode.TURN_INTERRUPTED: Ending(
        CANCELLED,
        "cancelled",
        "the turn was interrupted by a newer message in its conversation, which runs next; "
        "what it said so far is kept in the conversation",
        409,
    ),
    ErrorCode.CONVERSATION_DELETED: Ending(
        CANCELLED, "cancelled", "the turn's conversation was deleted while it ran", 409
    ),
    ErrorCode.UPSTREAM_ERROR: Ending(
        FAILED, "server_error", "the upstream model failed", 502, retry=True
    ),
    ErrorCode.UPSTREAM_TIMEOUT: Ending(
        FAILED, "server_error", "the upstream model timed out", 504, retry=True
    ),
    ErrorCode.TURN_TIMEOUT: Ending(
        FAILED, "server_error", "the turn took too long and was stopped", 504
    ),
    ErrorCode.WORKER_LOST: Ending(
        FAILED, "server_error", "the worker running this turn stopped responding", 503, True
    ),
    ErrorCode.WORKER_SHUTDOWN: Ending(
        FAILED, "server_error", "the worker shut down during the turn", 503, retry=True
    ),
    ErrorCode.TURN_LOST: Ending(
        FAILED,
        "server_error",
        "the turn was lost: Redis no longer holds it (restarted without persistence?)",
        503,
        retry=True,
    ),
    ErrorCode.INVALID_TURN: Ending(
        FAILED, "invalid_request_error", "the request could not be run as a turn", 400
    ),
    # The request's messages would take its conversation over its cap (shared/budgets.py).
    ErrorCode.CONVERSATION_TOO_LARGE: Ending(
        FAILED, "invalid_request_error", "the conversation is full", 413
    ),
    ErrorCode.STREAM_UNREADABLE: Ending(
        FAILED, "server_error", "the turn's stream could not be read", 503, retry=True
    ),
    # Only what this client reads: the turn goes on (api/hub.py `StreamTrimmedError`).
    ErrorCode.STREAM_TRIMMED: Ending(
        FAILED,
        "invalid_request_error",
        "the stream's events after the last one this client read are gone: the stream keeps "
        "only its latest (BERNARD_STREAM_MAXLEN for a turn's) and this client fell further "
        "behind; a turn's whole result is at GET /v1/turns/{id} once it ends, and the "
        "user's event stream goes on from a reconnect without a cursor",
        409,
    ),
    ErrorCode.INTERNAL_ERROR: Ending(FAILED, "server_error", "the turn failed inside Bernard", 500),
    # Redis refused the turn's writes: it is at its maxmemory (`noeviction`).
    ErrorCode.STORE_FULL: Ending(
        FAILED,
        "server_error",
        "Redis is full (at its maxmemory) and refused the turn's writes: the turn was "
        "stopped; try again once it has room",
        503,
        retry=True,
    ),
    ErrorCode.STORE_FAILOVER: Ending(
        FAILED,
        "server_error",
        "Redis failed, or failed over to a replica, while the turn ran: the turn was "
        "stopped, and its stream may lack part of what was sent",
        503,
        retry=True,
    ),
}


def ended(code: ErrorCode, message: str | None = None) -> Done:
    """The terminal event of a turn that ended with `code` (`message` overrides the table's)."""
    ending = ENDINGS[code]
    error = {"message": message or ending.message, "type": ending.type, "code": str(code)}
    return Done(status=ending.status, error=error)


def ending_events(code: ErrorCode, message: str | None = None) -> list[Event]:
    """What a stream that ends with `code` ends with: its `done`, after a failed turn's
    `error` event (for clients that show Bernard's events but not the terminal frame)."""
    done = ended(code, message)
    if done.status == "failed" and done.error is not None:
        return [Error(message=done.error["message"], code=code), done]
    return [done]


def completed(finish_reason: str | None, usage: dict[str, int] | None) -> Done:
    """The terminal event of a turn that completed."""
    return Done(status=TurnStatus.COMPLETED, finish_reason=finish_reason or "stop", usage=usage)


def error_of(status: str, error: dict[str, Any] | None) -> dict[str, Any] | None:
    """The error a client sees for a turn that ended with `status` and stored `error`: None
    for a turn that completed (or has not ended)."""
    return error if status in ("failed", "cancelled") else None


def http_status(code: str) -> int:
    """The HTTP status of a non-stream answer whose turn ended with `code`."""
    ending = _ending(code)
    return ending.http_status if ending is not None else 500


def retryable(code: str) -> bool:
    """Whether a turn that ended with `code` may work if tried again later."""
    ending = _ending(code)
    return ending is not None and ending.retry


def as_code(code: str) -> ErrorCode:
    """`code` as an `ErrorCode`; one this version does not know (a record written by
    another version) reads as `internal_error`."""
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.INTERNAL_ERROR


def _ending(code: str) -> Ending | None:
    return ENDINGS.get(as_code(code))
