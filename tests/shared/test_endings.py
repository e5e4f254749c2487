"""shared/endings.py: how each ending reads to a client, and what a stream ends with.

Every expected value is written out: the table is what clients see, so a change to it must
change this file too.
"""

from __future__ import annotations

import pytest

from shared.endings import (
    ENDINGS,
    as_code,
    completed,
    ended,
    ending_events,
    error_of,
    http_status,
    retryable,
)
from shared.errors import ErrorCode
from shared.events import Done, Error

# code, status, envelope type, words, HTTP status of a non-stream answer, Retry-After.
ROWS = [
    ("turn_cancelled", "cancelled", "cancelled", "the turn was cancelled", 409, False),
    (
        "turn_interrupted",
        "cancelled",
        "cancelled",
        "the turn was interrupted by a newer message in its conversation, which runs next; "
        "what it said so far is kept in the conversation",
        409,
        False,
    ),
    (
        "conversation_deleted",
        "cancelled",
        "cancelled",
        "the turn's conversation was deleted while it ran",
        409,
        False,
    ),
    ("upstream_error", "failed", "server_error", "the upstream model failed", 502, True),
    ("upstream_timeout", "failed", "server_error", "the upstream model timed out", 504, True),
    (
        "turn_timeout",
        "failed",
        "server_error",
        "the turn took too long and was stopped",
        504,
        False,
    ),
    (
        "worker_lost",
        "failed",
        "server_error",
        "the worker running this turn stopped responding",
        503,
        True,
    ),
    (
        "worker_shutdown",
        "failed",
        "server_error",
        "the worker shut down during the turn",
        503,
        True,
    ),
    (
        "turn_lost",
        "failed",
        "server_error",
        "the turn was lost: Redis no longer holds it (restarted without persistence?)",
        503,
        True,
    ),
    (
        "invalid_turn",
        "failed",
        "invalid_request_error",
        "the request could not be run as a turn",
        400,
        False,
    ),
    (
        "conversation_too_large",
        "failed",
        "invalid_request_error",
        "the conversation is full",
        413,
        False,
    ),
    (
        "stream_unreadable",
        "failed",
        "server_error",
        "the turn's stream could not be read",
        503,
        True,
    ),
    (
        "stream_trimmed",
        "failed",
        "invalid_request_error",
        "the stream's events after the last one this client read are gone: the stream keeps "
        "only its latest (BERNARD_STREAM_MAXLEN for a turn's) and this client fell further "
        "behind; a turn's whole result is at GET /v1/turns/{id} once it ends, and the "
        "user's event stream goes on from a reconnect without a cursor",
        409,
        False,
    ),
    ("internal_error", "failed", "server_error", "the turn failed inside Bernard", 500, False),
    (
        "store_failover",
        "failed",
        "server_error",
        "Redis failed, or failed over to a replica, while the turn ran: the turn was "
        "stopped, and its stream may lack part of what was sent",
        503,
        True,
    ),
    (
        "store_full",
        "failed",
        "server_error",
        "Redis is full (at its maxmemory) and refused the turn's writes: the turn was "
        "stopped; try again once it has room",
        503,
        True,
    ),
]


def test_the_table_has_a_row_for_every_ending_and_no_other() -> None:
    assert sorted(ENDINGS) == sorted(row[0] for row in ROWS)


@pytest.mark.parametrize(("code", "status", "kind", "words", "http", "retry"), ROWS)
def test_each_ending_reads_the_same_whichever_way_a_client_reads_it(
    code: str, status: str, kind: str, words: str, http: int, retry: bool
) -> None:
    error = {"message": words, "type": kind, "code": code}
    done = Done(status=status, error=error)  # type: ignore[arg-type]
    assert ended(ErrorCode(code)) == done
    expected = [Error(message=words, code=code), done] if status == "failed" else [done]
    assert ending_events(ErrorCode(code)) == expected
    assert http_status(code) == http
    assert retryable(code) is retry
    assert error_of(status, error) == error


def test_a_message_given_replaces_the_tables_in_both_events() -> None:
    error, done = ending_events(ErrorCode.UPSTREAM_ERROR, "the model said 500")
    assert error == Error(message="the model said 500", code="upstream_error")
    assert done == Done(
        status="failed",  # type: ignore[arg-type]
        error={"message": "the model said 500", "type": "server_error", "code": "upstream_error"},
    )


@pytest.mark.parametrize("status", ["completed", "running", "awaiting_confirmation"])
def test_a_turn_that_did_not_fail_shows_no_error(status: str) -> None:
    assert error_of(status, {"message": "m", "type": "server_error", "code": "c"}) is None


@pytest.mark.parametrize(
    ("code", "known", "http", "retry"),
    [
        ("worker_lost", "worker_lost", 503, True),
        # A code another version wrote: an internal error to this one.
        ("a_code_from_the_future", "internal_error", 500, False),
    ],
)
def test_a_stored_code_this_version_does_not_know_reads_as_internal_error(
    code: str, known: str, http: int, retry: bool
) -> None:
    assert as_code(code) == known
    assert http_status(code) == http
    assert retryable(code) is retry


def test_a_completed_turns_done_says_stop_unless_the_model_said_otherwise() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert completed(None, usage) == Done(status="completed", finish_reason="stop", usage=usage)  # type: ignore[arg-type]
    assert completed("length", None) == Done(status="completed", finish_reason="length")  # type: ignore[arg-type]
