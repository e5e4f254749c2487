"""Reading Bernard's SSE streams in tests, frame by frame, as a client sees them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from httpx_sse import EventSource


@dataclass
class Frame:
    """One SSE `data:` frame: its id and payload (`[DONE]` stays a string)."""

    id: str
    data: str

    @property
    def json(self) -> Any:
        return orjson.loads(self.data)

    @property
    def done(self) -> bool:
        return self.data == "[DONE]"

    @property
    def content(self) -> str:
        if self.done:
            return ""
        choices = self.json.get("choices") or []
        return (choices[0].get("delta", {}).get("content") or "") if choices else ""

    @property
    def bernard(self) -> dict[str, Any] | None:
        return None if self.done else self.json.get("bernard")


async def frames(response: httpx.Response) -> AsyncIterator[Frame]:
    """The data frames of a streaming response, in order (comments are skipped)."""
    async for event in EventSource(response).aiter_sse():
        yield Frame(id=event.id, data=event.data)


async def collect(client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> list[Frame]:
    """Every frame of one streamed request."""
    async with client.stream(method, url, **kwargs) as response:
        assert response.status_code == 200, await response.aread()
        return [frame async for frame in frames(response)]


def is_keepalive(frame: Frame) -> bool:
    return bool(frame.bernard and frame.bernard.get("type") == "keepalive")


def wire(collected: list[Frame]) -> list[tuple[str, str]]:
    """The frames as the wire carries them (id and data), keepalives left out: what a
    resumed stream must repeat exactly."""
    return [(frame.id, frame.data) for frame in collected if not is_keepalive(frame)]


def error_code(collected: list[Frame]) -> str | None:
    """The `code` of the stream's terminal error frame, None when there is none."""
    for frame in collected:
        if not frame.done and "error" in frame.json:
            return str(frame.json["error"]["code"])
    return None


def text_of(collected: list[Frame]) -> str:
    return "".join(frame.content for frame in collected)


async def named_events(response: httpx.Response) -> list[tuple[str, Any]]:
    """The (event, data) pairs of a named-event stream (the conversation API's), to its end."""
    return [(sse.event, orjson.loads(sse.data)) async for sse in EventSource(response).aiter_sse()]


async def named(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> list[tuple[str, Any]]:
    """POST `body` to `url` asking for a named-event stream; its (event, data) pairs."""
    sse_headers = {**headers, "Accept": "text/event-stream"}
    async with client.stream("POST", url, json=body, headers=sse_headers) as response:
        assert response.status_code == 200, await response.aread()
        return await named_events(response)


def of(events: list[tuple[str, Any]], name: str) -> list[Any]:
    """The data of each event called `name`, in order."""
    return [data for event, data in events if event == name]
