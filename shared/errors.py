"""Every error code a client can see, in one enum.

Codes travel in the OpenAI error envelope (`{"error": {message, type, param, code}}`) of
an HTTP answer, in a stream's error frame, in a turn object's `error` and in Bernard's own
non-fatal `error` events. A `StrEnum`, so a code is its own wire value and compares equal
to the string a client reads.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    # The request: answered before any turn exists.
    INVALID_VALUE = "invalid_value"
    INVALID_API_KEY = "invalid_api_key"
    INVALID_HOST = "invalid_host"
    PERMISSION_DENIED = "permission_denied"
    MODEL_NOT_FOUND = "model_not_found"
    TURN_NOT_FOUND = "turn_not_found"
    CONVERSATION_NOT_FOUND = "conversation_not_found"
    CONVERSATION_EXISTS = "conversation_exists"
    CONVERSATION_BUSY = "conversation_busy"
    CONFIRMATION_NOT_FOUND = "confirmation_not_found"
    CONFIRMATION_ALREADY_DECIDED = "confirmation_already_decided"
    CONFIRMATION_EXPIRED = "confirmation_expired"
    # POST /v1/conversations/{id}/undo: no change to put back (404), or its window passed (409).
    NOTHING_TO_UNDO = "nothing_to_undo"
    UNDO_EXPIRED = "undo_expired"
    NOT_FOUND = "not_found"
    # A Responses stream that can no longer number its events as it did (api/routes/responses.py).
    RESUME_UNAVAILABLE = "resume_unavailable"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TOO_LARGE = "body_too_large"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    # A storage budget (shared/budgets.py): one thing too big (413), or a budget full (429).
    CONVERSATION_TOO_LARGE = "conversation_too_large"
    STORAGE_QUOTA_EXCEEDED = "storage_quota_exceeded"
    TOO_MANY_CONVERSATIONS = "too_many_conversations"
    # Redis is nearly full: nothing new is stored until it has room (api/store_guard.py).
    STORE_FULL = "store_full"
    REDIS_UNAVAILABLE = "redis_unavailable"
    INTERNAL_ERROR = "internal_error"

    # How a turn ended, when it did not complete (shared/endings.py).
    TURN_CANCELLED = "turn_cancelled"
    # A newer message in its conversation stopped it (shared/conversation_state.py `Strategy`).
    TURN_INTERRUPTED = "turn_interrupted"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    TURN_TIMEOUT = "turn_timeout"
    WORKER_LOST = "worker_lost"
    WORKER_SHUTDOWN = "worker_shutdown"
    TURN_LOST = "turn_lost"
    INVALID_TURN = "invalid_turn"
    STREAM_UNREADABLE = "stream_unreadable"
    # A reader fell further behind than the stream keeps (`BERNARD_STREAM_MAXLEN`).
    STREAM_TRIMMED = "stream_trimmed"
    STORE_FAILOVER = "store_failover"
    CONVERSATION_DELETED = "conversation_deleted"

    # Problems inside a turn that goes on (an `error` event, never terminal).
    TOOL_ERROR = "tool_error"
    TOOL_TIMEOUT = "tool_timeout"
    ROUTER_STEP_LIMIT = "router_step_limit"
