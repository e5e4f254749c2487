"""What the chat and text-completion encodings share: OpenAI's chunk envelope (`head`),
the ending (finish, usage when asked for, `[DONE]`; an error envelope for a turn that did
not complete) and the compacted replay. Each says only how its one choice reads."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from api.encoding import (
    COMPACTED,
    DONE,
    Frame,
    final_event,
    json_frame,
    terminal_error,
    usage_body,
)
from shared.events import Done, Event
from shared.results import TurnResult
from shared.turn_record import TurnRecord


class ChunkEncoder(ABC):
    """An OpenAI chunk encoding of one turn (api/encoding.py `Encoder`)."""

    END: ClassVar[Frame | None] = DONE
    keep: ClassVar[tuple[type[Event], ...]] = ()
    reads_result: ClassVar[bool] = True
    shows_rows: ClassVar[bool] = False
    subject_prefix: ClassVar[str] = ""
    # The completion's id is this prefix and the turn's id; `object` of its chunks.
    ID_PREFIX: ClassVar[str]
    CHUNK_OBJECT: ClassVar[str]

    def __init__(self, record: TurnRecord) -> None:
        self.record = record
        self.delivery = record.request.delivery
        self.head = {
            "id": f"{self.ID_PREFIX}-{record.id}",
            "object": self.CHUNK_OBJECT,
            "created": int(record.created_at),
            "model": record.model,
        }

    @abstractmethod
    def _answer(self, content: str, extra: dict[str, Any]) -> Frame:
        """The whole answer in one chunk (a compacted replay)."""

    @abstractmethod
    def _finish(self, finish_reason: str, extra: dict[str, Any] | None) -> Frame:
        """The chunk that carries the finish reason."""

    @abstractmethod
    def frames(self, event: Event) -> list[Frame]: ...

    @abstractmethod
    def body(self, result: TurnResult) -> dict[str, Any]: ...

    def done_frames(self, done: Done, extra: dict[str, Any] | None = None) -> list[Frame]:
        error = terminal_error(done)
        if error is not None:
            return [json_frame({"error": {**error, "param": None}}), DONE]
        frames = [self._finish(done.finish_reason or "stop", extra)]
        if self.delivery.include_usage:
            usage = {**self.head, "choices": [], "usage": usage_body(done.usage), **(extra or {})}
            frames.append(json_frame(usage))
        return [*frames, DONE]

    def compacted(self, record: TurnRecord) -> list[Frame]:
        """The replay of a finished turn whose stream expired: its answer in one chunk,
        then its ending, every chunk marked `bernard: COMPACTED`."""
        marked = {"bernard": COMPACTED}
        frames = []
        if record.status == "completed":
            frames = self._replay(record.result or TurnResult(), marked)
        return [*frames, *self.done_frames(final_event(record), marked)]

    def _replay(self, result: TurnResult, extra: dict[str, Any]) -> list[Frame]:
        """What a completed turn's compacted replay holds before its ending."""
        return [self._answer(result.content, extra)]

    def answer(self, done: Done, kept: list[Event], result: TurnResult) -> dict[str, Any]:
        """The non-stream completion: the polled body."""
        return self.body(result)
