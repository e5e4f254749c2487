"""The `chat` encoding: `chat.completion.chunk` frames and the `chat.completion` body.

Bernard's own events (tool calls, results, progress, traces, non-fatal errors) travel as
`choices: []` chunks with a top-level `bernard` object: every client tested ignores
those and reads the answer from `content` alone (../shared/notes/client-compatibility.md).
With `tool_events: "delta"` tool calls and results go in the choice's delta instead; with
`"none"` they are left out.

Calls of the client's own tools (`client_tool_call`) are the choice's `tool_calls`, as
OpenAI sends them: in the stream, a delta with each call's index, id, type and name, then
one with its arguments (the SDKs join a call's pieces by `index`), and the finish chunk's
finish_reason "tool_calls"; in the body, `message.tool_calls` beside the text the model
wrote before them (`content`, null when it wrote none).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, ClassVar

from api.encoding import Frame, json_frame, usage_body
from api.encodings.chunks import ChunkEncoder
from shared.events import (
    AwaitingConfirmation,
    ClientToolCall,
    Delta,
    Done,
    Error,
    Event,
    Start,
    ToolCall,
    ToolProgress,
    ToolResult,
    Trace,
)
from shared.results import TurnResult


class ChatEncoder(ChunkEncoder):
    """Frames of `chat.completion.chunk` for one turn."""

    ID_PREFIX: ClassVar[str] = "chatcmpl"
    CHUNK_OBJECT: ClassVar[str] = "chat.completion.chunk"

    def _chunk(
        self,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Frame:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return json_frame({**self.head, "choices": [choice], **(extra or {})})

    def _answer(self, content: str, extra: dict[str, Any]) -> Frame:
        return self._chunk({"role": "assistant", "content": content}, None, extra)

    def _finish(self, finish_reason: str, extra: dict[str, Any] | None) -> Frame:
        return self._chunk({}, finish_reason, extra)

    def _extension(self, kind: str, body: dict[str, Any]) -> Frame:
        return json_frame({**self.head, "choices": [], "bernard": {"type": kind, **body}})

    def keepalive(self) -> Frame:
        return self._extension("keepalive", {})

    def frames(self, event: Event) -> list[Frame]:
        mode = self.delivery.tool_events
        match event:
            case Start():
                return [self._chunk({"role": "assistant", "content": ""})]
            case ClientToolCall(id=call_id, name=name, arguments=arguments, index=index):
                # Whatever the tool-event mode: the call is the client's to run.
                head = {"index": index, "id": call_id, "type": "function"}
                named = {**head, "function": {"name": name, "arguments": ""}}
                pieces = {"index": index, "function": {"arguments": arguments}}
                return [self._chunk({"tool_calls": [named]}), self._chunk({"tool_calls": [pieces]})]
            case Delta(text=text):
                return [self._chunk({"content": text})]
            case ToolCall() if mode == "delta":
                call = {
                    "index": event.index,
                    "id": event.id,
                    "type": "function",
                    "function": {"name": event.name, "arguments": event.arguments},
                }
                return [self._chunk({"tool_calls": [call]})]
            case ToolResult() if mode == "delta":
                output: dict[str, Any] = {"id": event.tool_call_id, "content": event.content}
                if event.index is not None:
                    # The openai SDK's stream helper merges list entries by `index`.
                    output = {"index": event.index, **output}
                return [self._chunk({"tool_outputs": [output]})]
            case ToolCall() if mode != "none":
                body = asdict(event)
                if body["policy"] is None:  # no rule was asked: the frame as it always was
                    del body["policy"]
                return [self._extension(event.type, body)]
            case ToolResult() | ToolProgress() if mode != "none":
                return [self._extension(event.type, asdict(event))]
            case Trace():
                # In the stream only when the client asked to trace the turn (the worker
                # publishes them then: worker/supervisor.py).
                return [self._extension(event.type, asdict(event))]
            case AwaitingConfirmation():
                # Whatever the tool-event mode: the client must be able to decide on it.
                return [self._extension(event.type, asdict(event))]
            case Error():
                return [self._extension("error", asdict(event))]
            case Done():
                return self.done_frames(event)
        return []

    def _replay(self, result: TurnResult, extra: dict[str, Any]) -> list[Frame]:
        if not result.client_calls:
            return [self._answer(result.content, extra)]
        calls = [{"index": i, **call} for i, call in enumerate(result.client_calls)]
        delta = {"role": "assistant", "content": result.content or None, "tool_calls": calls}
        return [self._chunk(delta, None, extra)]

    def body(self, result: TurnResult) -> dict[str, Any]:
        """The non-stream `chat.completion` for a completed turn."""
        message: dict[str, Any] = {"role": "assistant", "content": result.content, "refusal": None}
        if result.client_calls:
            content = result.content or None
            message = {**message, "content": content, "tool_calls": result.client_calls}
        return {
            **self.head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": result.finish_reason,
                }
            ],
            "usage": usage_body(result.usage),
            "bernard": {
                "turn_id": self.record.id,
                "conversation_id": self.record.conversation_id,
                "tool_calls": result.tool_calls,
                "tool_outputs": result.tool_outputs,
                # Tool calls waiting for the user's decision (turn `awaiting_confirmation`).
                "pending_confirmations": result.pending,
            },
        }
