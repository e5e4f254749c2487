"""Bernard's HTTP API as this integration uses it, on Home Assistant's shared aiohttp session.

- `check()`: `GET /v1/models`, the config flow's proof that the URL is a Bernard and the key
  is one of its keys.
- `send(conversation_id, text, language)`: `POST /v1/conversations/{id}/messages` with
  `Accept: text/event-stream` and the user's language as `Accept-Language`; the
  conversation is created first when Bernard has none under that id
  (`POST /v1/conversations`). While the conversation waits on a confirmation, Bernard reads
  the message as its answer.
- `user_events(last_event_id)`: `GET /v1/events`, the user's event stream (`timer_fired`),
  one connection held `EVENTS_S` at most.

A turn's named events (docs/api.md, "Conversations") arrive as
typed `BernardEvent`s. A turn's stream that drops before its `done` is resumed from the last
event's id on `GET /v1/turns/{turn_id}/events` (`Last-Event-ID`), so nothing is heard twice.
Every failure is a `BernardError` whose `reason` is safe to log: it never holds the key,
which travels only in the `Authorization` header.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from .const import CHECK_S, CONNECT_S, EVENTS_S, LOGGER, READ_S
from .sse import LineTooLong, ServerEvent, SseDecoder

# The config flow's check. `GET /v1/status` (issue 24) says more once it exists: switch here.
CHECK_PATH: Final = "/v1/models"
# Pauses before each attempt to resume a dropped turn stream.
RESUME_PAUSES_S: Final = (0.2, 0.5, 1.0, 2.0)


class BernardError(Exception):
    """Bernard could not be asked, or answered with an error; `reason` says which."""

    def __init__(self, reason: str, *, status: int | None = None, code: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.code = code


class CannotConnect(BernardError):
    """No answer at the URL: refused, timed out, not HTTP, or not a Bernard."""


class InvalidAuth(BernardError):
    """Bernard refused the key (401)."""


# -- a turn's events ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolProgress:
    tool_call_id: str
    message: str


@dataclass(frozen=True, slots=True)
class ToolResult:
    tool_call_id: str
    name: str
    output: str
    is_error: bool


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A tool call that waits for the user's decision (`awaiting_confirmation`)."""

    confirmation_id: str
    summary: str


@dataclass(frozen=True, slots=True)
class TurnError:
    """A problem Bernard reported; `done` says whether the turn survived it."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class TurnDone:
    """The turn's last event: `completed`, `awaiting_confirmation`, `failed`, ..."""

    status: str
    error_code: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.status in ("completed", "awaiting_confirmation")

    @property
    def interrupted(self) -> bool:
        """A newer utterance in the conversation took its place (Bernard's default for a
        message while a turn runs): no failure, the household spoke over it."""
        return self.error_code == "turn_interrupted"


@dataclass(frozen=True, slots=True)
class TimerFired:
    timer_id: str
    label: str
    conversation_id: str | None


BernardEvent = (
    TextDelta
    | ToolCall
    | ToolProgress
    | ToolResult
    | Confirmation
    | TurnError
    | TurnDone
    | TimerFired
)


def parse_event(frame: ServerEvent) -> BernardEvent | None:
    """The typed event a frame carries; None for those this integration does not use
    (`message`, `trace`) and for a frame it cannot read."""
    try:
        data = json.loads(frame.data)
        return _typed(frame.event, data) if isinstance(data, dict) else None
    except (ValueError, KeyError, TypeError):
        return None


def _typed(name: str, data: Mapping[str, Any]) -> BernardEvent | None:
    match name:
        case "text_delta":
            return TextDelta(str(data["text"]))
        case "tool_call":
            return ToolCall(str(data["id"]), str(data["name"]), _arguments(data.get("arguments")))
        case "tool_progress":
            return ToolProgress(str(data["tool_call_id"]), str(data.get("message") or ""))
        case "tool_result":
            return ToolResult(
                str(data["tool_call_id"]),
                str(data.get("name") or ""),
                str(data.get("output") or ""),
                bool(data.get("is_error")),
            )
        case "awaiting_confirmation":
            return Confirmation(str(data["confirmation_id"]), str(data.get("summary") or ""))
        case "error":
            return TurnError(str(data.get("code") or ""), str(data.get("message") or ""))
        case "done":
            error = data.get("error") or {}
            return TurnDone(str(data["status"]), error.get("code"))
        case "timer_fired":
            conversation = data.get("conversation_id")
            return TimerFired(
                str(data["timer_id"]),
                str(data.get("label") or ""),
                str(conversation) if conversation else None,
            )
    return None


def _arguments(text: Any) -> dict[str, Any]:
    """A tool call's arguments (JSON text) as an object; anything else under `arguments`."""
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        value = text
    return value if isinstance(value, dict) else {"arguments": value}


# -- the client ------------------------------------------------------------------------------


class BernardClient:
    """One Bernard URL and key, on a session the caller owns (Home Assistant's)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, api_key: str | None) -> None:
        self.session = session
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def check(self) -> None:
        """Raise `InvalidAuth` for a refused key and `CannotConnect` when no Bernard answers."""
        async with self._request("GET", CHECK_PATH, timeout=_timeout(CHECK_S)) as response:
            await _raise_for(response)
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = None
            if not isinstance(body, dict) or body.get("object") != "list":
                raise CannotConnect(f"{self.url}{CHECK_PATH} answered, but not as Bernard does")

    async def send(
        self, conversation_id: str, text: str, language: str | None = None
    ) -> AsyncIterator[BernardEvent]:
        """The events of the turn this message starts (a new conversation if it has none),
        Bernard speaking `language` where it knows it."""
        path = f"/v1/conversations/{conversation_id}/messages"
        spoken = {"Accept-Language": language} if language else {}
        try:
            async for event in self._turn(path, {"content": text}, spoken):
                yield event
            return
        except BernardError as err:
            if err.status != 404:
                raise
        await self._create(conversation_id)
        async for event in self._turn(path, {"content": text}, spoken):
            yield event

    async def user_events(
        self, last_event_id: str | None, on_open: Callable[[], None] | None = None
    ) -> AsyncIterator[tuple[str, BernardEvent]]:
        """`(id, event)` for each event of the user's stream after `last_event_id` (from the
        next one without it), until the connection ends, `EVENTS_S` at most (then
        `CannotConnect`, as for a drop); `on_open()` once it is open."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        async with self._request(
            "GET", "/v1/events", headers=headers, timeout=_timeout(EVENTS_S)
        ) as response:
            await _raise_for(response)
            if on_open is not None:
                on_open()
            async for frame in _frames(response):
                event = parse_event(frame)
                if frame.id is not None and event is not None:
                    yield frame.id, event

    # -- plumbing ----------------------------------------------------------------------------

    async def _create(self, conversation_id: str) -> None:
        body = {"id": conversation_id}
        async with self._request(
            "POST", "/v1/conversations", json=body, timeout=_timeout(CHECK_S)
        ) as response:
            if response.status == 409:
                return  # made meanwhile by another utterance: as good
            await _raise_for(response)

    async def _turn(
        self, path: str, body: dict[str, Any], headers: Mapping[str, str]
    ) -> AsyncIterator[BernardEvent]:
        """A turn's events to its `done`, resumed on its own stream after a drop."""
        turn_id: str | None = None
        last_id: str | None = None
        attempt = 0
        while True:
            if turn_id is None:
                request = self._request(
                    "POST", path, json=body, headers={**_SSE, **headers}, timeout=_timeout(None)
                )
            else:
                resume = {**_SSE, **({"Last-Event-ID": last_id} if last_id else {})}
                request = self._request(
                    "GET", f"/v1/turns/{turn_id}/events", headers=resume, timeout=_timeout(None)
                )
            try:
                async with request as response:
                    await _raise_for(response)
                    turn_id = turn_id or response.headers.get("X-Bernard-Turn-Id")
                    async for frame in _frames(response):
                        last_id = frame.id or last_id
                        event = parse_event(frame)
                        if event is None:
                            continue
                        yield event
                        if isinstance(event, TurnDone):
                            return
                reason = "the stream ended before the turn did"
            except CannotConnect as err:
                reason = err.reason
            if turn_id is None:
                raise CannotConnect(reason)  # the turn never started
            if attempt >= len(RESUME_PAUSES_S):
                raise CannotConnect(f"lost Bernard's answer: {reason}")
            await asyncio.sleep(RESUME_PAUSES_S[attempt])
            attempt += 1

    def _request(
        self,
        method: str,
        path: str,
        *,
        timeout: aiohttp.ClientTimeout,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
    ) -> _Request:
        LOGGER.debug("%s %s%s", method, self.url, path)
        return _Request(
            self.session.request(
                method,
                self.url + path,
                json=json,
                headers={**self._headers, **(headers or {})},
                timeout=timeout,
                allow_redirects=False,
            ),
            f"{method} {self.url}{path}",
        )


_SSE: Final = {"Accept": "text/event-stream"}


def _timeout(total_s: float | None) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=total_s, connect=CONNECT_S, sock_read=READ_S)


class _Request:
    """A request whose connection failures and timeouts, at the start or mid-stream, become
    `CannotConnect` naming what was asked (never its headers)."""

    def __init__(self, context: Any, what: str) -> None:
        self._context = context
        self._what = what

    async def __aenter__(self) -> aiohttp.ClientResponse:
        try:
            response: aiohttp.ClientResponse = await self._context.__aenter__()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise CannotConnect(f"{self._what}: {_describe(err)}") from None
        return response

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        await self._context.__aexit__(exc_type, exc, tb)
        if isinstance(exc, aiohttp.ClientError | TimeoutError):
            raise CannotConnect(f"{self._what}: {_describe(exc)}") from None


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "no answer in time"
    return str(err) or type(err).__name__


async def _frames(response: aiohttp.ClientResponse) -> AsyncIterator[ServerEvent]:
    """The stream's events; a line past the decoder's bound ends it with a `BernardError`
    (not `CannotConnect`: reading it again would meet the same line)."""
    decoder = SseDecoder()
    async for chunk in response.content.iter_any():
        try:
            frames = decoder.feed(chunk)
        except LineTooLong as err:
            raise BernardError(f"{response.method} {response.url.path}: {err}") from None
        for frame in frames:
            yield frame


async def _raise_for(response: aiohttp.ClientResponse) -> None:
    """Bernard's error envelope (`{"error": {"message", "code"}}`) as a `BernardError`."""
    if response.status < 400:
        return
    try:
        error = (await response.json(content_type=None)).get("error") or {}
    except (ValueError, AttributeError, aiohttp.ClientError):
        error = {}
    message = str(error.get("message") or response.reason or "error")[:300]
    code = error.get("code")
    reason = f"{response.method} {response.url.path}: {response.status} {message}"
    kind = InvalidAuth if response.status == 401 else BernardError
    raise kind(reason, status=response.status, code=code)
