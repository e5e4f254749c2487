"""The `completion` encoding: legacy `text_completion` objects, the answer's text only."""

from __future__ import annotations

from typing import Any, ClassVar

from api.encoding import Frame, json_frame, usage_body
from api.encodings.chunks import ChunkEncoder
from shared.events import Delta, Done, Event
from shared.results import TurnResult


class CompletionEncoder(ChunkEncoder):
    """Frames of legacy `text_completion` objects for one turn."""

    ID_PREFIX: ClassVar[str] = "cmpl"
    CHUNK_OBJECT: ClassVar[str] = "text_completion"

    def _choice(
        self, text: str, finish_reason: str | None = None, extra: dict[str, Any] | None = None
    ) -> Frame:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        return json_frame({**self.head, "choices": [choice], **(extra or {})})

    def _answer(self, content: str, extra: dict[str, Any]) -> Frame:
        return self._choice(content, None, extra)

    def _finish(self, finish_reason: str, extra: dict[str, Any] | None) -> Frame:
        return self._choice("", finish_reason, extra)

    def keepalive(self) -> None:
        """No keepalive chunk in this envelope: the session sends a `: ping` comment."""
        return None

    def frames(self, event: Event) -> list[Frame]:
        match event:
            case Delta(text=text):
                return [self._choice(text)]
            case Done():
                return self.done_frames(event)
        return []

    def body(self, result: TurnResult) -> dict[str, Any]:
        choice = {
            "text": result.content,
            "index": 0,
            "logprobs": None,
            "finish_reason": result.finish_reason,
        }
        return {**self.head, "choices": [choice], "usage": usage_body(result.usage)}
