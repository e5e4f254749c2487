"""Following a turn across dropped connections (cli/client.py `TurnStream`), against a
scripted transport: the request that starts the turn breaks off, and the stream goes on
from `GET /v1/turns/{id}/events` after the last frame read, each event once."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from cli import client as client_module
from cli.client import Api, ApiCallError, TurnStream

SSE = {"content-type": "text/event-stream", "x-bernard-turn-id": "t1"}


def frame(event: str, data: str, frame_id: str) -> bytes:
    return f"event: {event}\ndata: {data}\nid: {frame_id}\n\n".encode()


FRAMES = [
    frame("message", '{"id": "msg_1", "role": "user"}', "1-0"),
    frame("text_delta", '{"text": "one"}', "2-0"),
    frame("text_delta", '{"text": " two"}', "3-0"),
    frame("text_delta", '{"text": " three"}', "4-0"),
    frame("done", '{"turn_id": "t1", "status": "completed"}', "5-0"),
]


class Dropped(httpx.SyncByteStream):
    """Sends `chunks`, then breaks off as a killed server does."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        raise httpx.RemoteProtocolError("peer closed connection without sending complete body")


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "RETRY_PAUSES_S", (0.0,))


def api_with(handler: httpx.MockTransport) -> Api:
    api = Api("http://bernard.test", "key")
    api.http = httpx.Client(base_url=api.base_url, transport=handler)
    return api


def test_a_dropped_stream_resumes_after_the_last_frame_read_and_repeats_nothing() -> None:
    asked: list[tuple[str, str, str | None]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append((request.method, request.url.path, request.headers.get("last-event-id")))
        if request.method == "POST":
            return httpx.Response(200, headers=SSE, stream=Dropped(FRAMES[:2]))
        if len(asked) == 2:  # the first resume: no API process answers yet
            return httpx.Response(503, json={"error": {"message": "restarting"}})
        after = request.headers["last-event-id"]
        rest = [
            f for f in FRAMES if int(f.split(b"id: ")[1].split(b"-")[0]) > int(after.split("-")[0])
        ]
        return httpx.Response(200, headers=SSE, content=b"".join(rest))

    stream = TurnStream(api_with(httpx.MockTransport(handle)))
    events = list(stream.start("POST", "/v1/conversations/c/messages", {"content": "count"}))

    assert [e.data.get("text") for e in events if e.kind == "text_delta"] == [
        "one",
        " two",
        " three",
    ]
    assert events[-1].kind == "done" and stream.finished
    assert asked == [
        ("POST", "/v1/conversations/c/messages", None),
        ("GET", "/v1/turns/t1/events", "2-0"),
        ("GET", "/v1/turns/t1/events", "2-0"),
    ]


def test_a_stream_that_ends_without_its_turns_end_is_resumed_too() -> None:
    calls = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers.get("last-event-id"))
        if len(calls) == 1:
            return httpx.Response(200, headers=SSE, content=b"".join(FRAMES[:3]))
        return httpx.Response(200, headers=SSE, content=b"".join(FRAMES[3:]))

    events = list(TurnStream(api_with(httpx.MockTransport(handle)), turn_id="t1").follow())
    assert calls == [None, "3-0"]
    assert [e.kind for e in events] == ["message", "text_delta", "text_delta", "text_delta", "done"]


def test_a_drop_before_the_turn_is_known_is_an_error_not_a_guess() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    stream = TurnStream(api_with(httpx.MockTransport(handle)))
    with pytest.raises(ApiCallError, match=r"connection .* failed"):
        list(stream.start("POST", "/v1/conversations/c/messages", {"content": "x"}))


def test_an_error_answer_is_the_apis_error() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        error = {"message": "the conversation is running", "code": "conversation_busy"}
        return httpx.Response(409, json={"error": error})

    stream = TurnStream(api_with(httpx.MockTransport(handle)))
    with pytest.raises(ApiCallError) as raised:
        list(stream.start("POST", "/v1/conversations/c/messages", {"content": "x"}))
    assert (raised.value.status, raised.value.code) == (409, "conversation_busy")


def test_reconnecting_gives_up_after_its_time_saying_how_to_follow_the_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(200, headers=SSE, stream=Dropped(FRAMES[:1]))
        raise httpx.ConnectError("connection refused")

    retries: list[int] = []
    stream = TurnStream(
        api_with(httpx.MockTransport(handle)),
        reconnect_for_s=0.0,
        on_retry=lambda attempt, reason: retries.append(attempt),
    )
    with pytest.raises(ApiCallError, match="bernard turns tail t1"):
        list(stream.start("POST", "/v1/conversations/c/messages", {"content": "x"}))
    assert retries == [1]


def test_abort_ends_a_read_that_waits_for_the_next_frame_at_once_and_resumes_nothing() -> None:
    """Over a real socket: the server sends one frame and holds the connection open."""
    held = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-bernard-turn-id: t1\r\n"
        body = FRAMES[1]
        conn.sendall(f"{head}content-length: 100000\r\n\r\n".encode() + body)
        held.wait(10)
        conn.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    retries: list[int] = []
    api = Api(f"http://127.0.0.1:{listener.getsockname()[1]}")
    stream = TurnStream(api, on_retry=lambda attempt, reason: retries.append(attempt))
    read: list[str] = []
    reader = threading.Thread(
        target=lambda: read.extend(e.kind for e in stream.start("POST", "/v1/x", {})), daemon=True
    )
    try:
        reader.start()
        deadline = time.monotonic() + 5
        while not read and time.monotonic() < deadline:
            time.sleep(0.01)
        stream.abort()
        reader.join(timeout=2)
        assert not reader.is_alive(), "the read still waits"
    finally:
        held.set()
        listener.close()
        api.close()
    assert read == ["text_delta"]
    assert retries == []
