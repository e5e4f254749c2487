"""The `Encoder` protocol: how a turn's events reach one client on the wire, and what
every encoding shares. The encodings themselves, one module each, are in api/encodings/
(its registry says which a turn uses).

An encoder turns each event of the turn's stream into zero or more SSE frames (`frames`:
`done` becomes the finish, the usage, `[DONE]`), gives the keepalive frame of its envelope,
replays a turn whose stream has expired from its record (`compacted`), and renders the
non-stream answers: the one a client waiting on the turn gets (`answer`, built from the
events it `keep`s and, if it `reads_result`, the turn's stored result) and the turn's
outcome as a polled turn shows it (`body`).

The encoder never reads Redis and never writes to the client: api/session.py reads the
stream, api/sse.py writes the frames. An encoder instance serves one client's stream and
sees that stream's events in order from where the client resumes (api/cursors.py), so an
encoding may number its frames (the Responses API's `sequence_number`) by keeping a count;
the chat encodings keep nothing, so any API process encodes any entry on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import orjson

from shared.endings import error_of
from shared.events import Done, Event
from shared.results import TurnResult
from shared.turn_record import TurnRecord

DONE = "[DONE]"


@dataclass(frozen=True, slots=True)
class Named:
    """A frame with an SSE `event:` name (the conversation endpoints' encoding)."""

    event: str
    data: str


# One SSE frame: its `data:` payload, or a named event's name and payload.
Frame = str | Named
# Marks the frames of a replay built from the turn record once its stream has expired.
COMPACTED = {"type": "replay", "compacted": True}


class Framing(Protocol):
    """How a stream's events become frames: what the relay needs (api/relay.py)."""

    def frames(self, event: Event) -> list[Frame]:
        """The frames of one event of the stream, in order."""
        ...

    def keepalive(self) -> Frame | None:
        """The frame sent after a quiet while; None: an SSE comment (`: ping`)."""
        ...


class Encoder(Framing, Protocol):
    """One turn's events as one encoding puts them on the wire (see the module's docstring)."""

    # The frame that tells a client resuming after the last one that the stream is over
    # (None: the encoding's last frame says so itself).
    END: ClassVar[Frame | None]
    # The events the non-stream `answer` is built from, kept while the turn runs.
    keep: ClassVar[tuple[type[Event], ...]]
    # Whether `answer` needs the finished turn's stored result (one more read).
    reads_result: ClassVar[bool]
    # Whether this encoding shows the conversation rows a turn stores (`message` events):
    # the turn's stream then holds them (shared/requests.py `AgentRequest.rows`).
    shows_rows: ClassVar[bool]
    # The id a client knows the turn by is this prefix and the turn id (a response's
    # `resp_<turn id>`; "": the turn id): a webhook event names the turn so.
    subject_prefix: ClassVar[str]

    def __init__(self, record: TurnRecord) -> None:
        """An encoder of `record`'s turn, for one client."""
        ...

    def compacted(self, record: TurnRecord) -> list[Frame]:
        """The replay of a finished turn whose stream has expired, from its record."""
        ...

    def body(self, result: TurnResult) -> dict[str, Any]:
        """The turn's outcome, as a polled turn shows it (and the chat encodings answer)."""
        ...

    def answer(self, done: Done, kept: list[Event], result: TurnResult) -> dict[str, Any]:
        """The non-stream answer of a turn that ended with `done` (its failures are the
        error envelope: api/turn_service.py), from the events `keep` kept and its result
        (an empty one unless `reads_result`)."""
        ...


def terminal_error(done: Done) -> dict[str, Any] | None:
    """The error a terminal event reports, or None for a completed turn (shared/endings.py)."""
    return error_of(done.status, done.error)


def final_event(record: TurnRecord) -> Done:
    """The `done` a finished turn's record stands for, as its stream ended with it."""
    result = record.result
    return Done(
        status=record.status,
        finish_reason=result.finish_reason if result is not None else None,
        usage=result.usage if result is not None else None,
        error=record.error,
    )


def json_frame(body: dict[str, Any]) -> Frame:
    return orjson.dumps(body).decode()


def named(event: str, body: object) -> Named:
    return Named(event, orjson.dumps(body).decode())


def usage_body(usage: dict[str, int] | None) -> dict[str, int]:
    usage = usage or {}
    return {
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
    }
