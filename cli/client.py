"""Bernard's HTTP API as the command line uses it: JSON calls, and a turn's events followed
to its end across dropped connections.

A turn's events come from the request that starts it (`Accept: text/event-stream`) and,
once that connection drops, from `GET /v1/turns/{id}/events` with `Last-Event-ID` set to
the id of the last frame received (the turn id is in the `X-Bernard-Turn-Id` header), on
whichever API process answers: the API resumes strictly after that frame, so nothing is
shown twice and nothing is missed (docs/api.md, "Turns").
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from cli.frames import TurnEvent, events_of
from cli.sse import SseParser
from shared.redaction import redact_urls

DEFAULT_URL = "http://127.0.0.1:8000"
# How long a dropped stream is retried before giving up, and the pauses between tries.
RECONNECT_FOR_S = 60.0
RETRY_PAUSES_S = (0.1, 0.25, 0.5, 1.0, 2.0)
# Quiet streams get a keepalive every BERNARD_KEEPALIVE_S (15 s by default): a read that
# waits much longer than that is a dead connection.
READ_TIMEOUT_S = 60.0


class ApiCallError(Exception):
    """The API answered with an error (its OpenAI error envelope), or not at all."""

    def __init__(self, status: int | None, message: str, code: str | None = None) -> None:
        message = redact_urls(message)  # the API's URL, or an error's, without credentials
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code

    def __str__(self) -> str:
        where = f"{self.status}" if self.status else "no answer"
        return f"{self.message} ({where}{', ' + self.code if self.code else ''})"


class StreamDropped(Exception):
    """The connection ended before the turn's last frame."""


def call_error_of(response: httpx.Response) -> ApiCallError:
    """The API's error envelope as an `ApiCallError` (any body at all, for a proxy's page)."""
    try:
        error = response.json().get("error") or {}
    except ValueError:
        error = {}
    message = error.get("message") or response.text[:200] or response.reason_phrase
    return ApiCallError(response.status_code, message, error.get("code"))


class Api:
    """One API base URL and key; every call raises `ApiCallError` on an error answer or a
    connection that fails."""

    def __init__(self, base_url: str, key: str | None = None, *, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.has_key = bool(key)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, read=READ_TIMEOUT_S),
            trust_env=False,
        )

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON body of a successful answer."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiCallError(None, f"cannot reach {self.base_url}: {exc}") from exc
        if response.status_code >= 400:
            raise call_error_of(response)
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self.call("GET", path, params=clean)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.call("POST", path, json=body)

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.call("PATCH", path, json=body)

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)


class TurnStream:
    """One turn's events, read to its end, resumed after a dropped connection.

    `turn_id` is known once the first answer's headers arrive; `last_id` is the id of the
    last frame read. `on_retry(attempt, reason)` is called before each reconnection, and
    `on_resumed()` once a reconnection answers.
    """

    def __init__(
        self,
        api: Api,
        *,
        turn_id: str | None = None,
        reconnect_for_s: float = RECONNECT_FOR_S,
        on_retry: Callable[[int, str], None] | None = None,
        on_resumed: Callable[[], None] | None = None,
    ) -> None:
        self.api = api
        self.turn_id = turn_id
        self.last_id: str | None = None
        self.finished = False
        self.reconnect_for_s = reconnect_for_s
        self.on_retry = on_retry
        self.on_resumed = on_resumed
        self.aborted = False
        self._response: httpx.Response | None = None

    def abort(self) -> None:
        """Stop reading, from another thread: the read waiting for the next frame ends at
        once (its socket is shut down: closing it would not wake the read), and the events
        end there, nothing resumed. The turn itself goes on."""
        self.aborted = True
        response = self._response
        stream = response.extensions.get("network_stream") if response is not None else None
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def start(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> Iterator[TurnEvent]:
        """The events of the turn this request starts (or of the turn `turn_id` from its
        start, with `method` None), followed to the end."""
        try:
            yield from self._read(method, path, body)
        except StreamDropped as exc:
            if self.turn_id is None:
                raise ApiCallError(
                    None, f"the connection to {self.api.base_url} failed: {exc}"
                ) from None
            yield from self._resume(str(exc))

    def follow(self) -> Iterator[TurnEvent]:
        """The events of the turn `turn_id`, from after `last_id` (or its start)."""
        assert self.turn_id is not None
        yield from self.start("GET", self._events_path())

    def _events_path(self) -> str:
        return f"/v1/turns/{self.turn_id}/events"

    def _resume(self, reason: str) -> Iterator[TurnEvent]:
        deadline = time.monotonic() + self.reconnect_for_s
        attempt = 0
        while not self.aborted:
            attempt += 1
            if self.on_retry is not None:
                self.on_retry(attempt, reason)
            time.sleep(RETRY_PAUSES_S[min(attempt - 1, len(RETRY_PAUSES_S) - 1)])
            try:
                yield from self._read("GET", self._events_path(), None, resumed=True)
                return
            except StreamDropped as exc:
                reason = str(exc)
            if time.monotonic() > deadline:
                raise ApiCallError(
                    None,
                    f"lost the connection to {self.api.base_url} for {self.reconnect_for_s:.0f} s "
                    f"({reason}); the turn goes on: bernard turns tail {self.turn_id}",
                )

    def _read(
        self, method: str, path: str, body: dict[str, Any] | None, *, resumed: bool = False
    ) -> Iterator[TurnEvent]:
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = self.last_id
        try:
            with self.api.http.stream(method, path, json=body, headers=headers) as response:
                self._response = response
                retry = response.status_code >= 500 or response.status_code == 429
                if retry and method == "GET":  # an API process or its Redis coming back
                    raise StreamDropped(f"{response.status_code} {response.reason_phrase}")
                if response.status_code >= 400:
                    response.read()
                    raise call_error_of(response)
                self.turn_id = response.headers.get("x-bernard-turn-id") or self.turn_id
                if resumed and self.on_resumed is not None:
                    self.on_resumed()
                parser = SseParser()
                for line in response.iter_lines():
                    if self.aborted:
                        return
                    frame = parser.feed(line)
                    if frame is None:
                        continue
                    if frame.id is not None:
                        self.last_id = frame.id
                    for event in events_of(frame):
                        yield event
                        if event.kind == "done":
                            self.finished = True
                            return
        except httpx.HTTPError as exc:
            if self.aborted:
                return
            raise StreamDropped(str(exc) or type(exc).__name__) from exc
        finally:
            self._response = None
        if not self.aborted:
            raise StreamDropped("the stream ended before the turn did")
