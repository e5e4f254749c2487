"""The session a blocking tool's client gets (worker/tools/blocking.py), against real servers
on loopback: it keeps to its origin, bounds a body once decompressed, has one deadline for
the whole call, and sends nothing once cancelled; `run_blocking` cancels it with its caller.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections.abc import AsyncIterator

import pytest
import requests
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.serving import serve
from worker.tools.blocking import (
    Cancelled,
    DeadlineExceeded,
    GuardedSession,
    OffOrigin,
    TooLarge,
    origin_of,
    plain_origin,
    run_blocking,
)


class Server:
    """A loopback server that records the paths and tokens it was sent."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        self.url = ""
        self.elsewhere = ""

    def app(self) -> Starlette:
        async def record(request: Request) -> Response:
            self.seen.append((request.url.path, request.headers.get("x-plex-token")))
            name = request.path_params.get("name", "")
            if name == "away":
                # As written: RedirectResponse would quote a backslash.
                return Response(status_code=302, headers={"location": f"{self.elsewhere}/stolen"})
            if name == "here":
                return RedirectResponse("/plain/ok", status_code=303)
            if name == "loop":
                return RedirectResponse("/plain/loop", status_code=302)
            if name == "bomb":  # 3 MiB of zeros, sent as a few KiB of gzip
                packed = gzip.compress(b"0" * (3 * 1024 * 1024))
                return Response(packed, headers={"Content-Encoding": "gzip"})
            if name == "drip":
                return StreamingResponse(_drip(), media_type="text/plain")
            return PlainTextResponse(f"hello from {request.url.path}")

        return Starlette(routes=[Route("/plain/{name}", record, methods=["GET", "POST"])])


async def _drip() -> AsyncIterator[bytes]:
    for _ in range(100):
        yield b"."
        await asyncio.sleep(0.05)


@pytest.fixture
async def servers() -> AsyncIterator[tuple[Server, Server]]:
    home, other = Server(), Server()
    async with serve(home.app()) as home_port, serve(other.app()) as other_port:
        home.url, other.url = f"http://127.0.0.1:{home_port}", f"http://127.0.0.1:{other_port}"
        home.elsewhere = other.url
        yield home, other


def session_for(url: str, **limits: float) -> GuardedSession:
    values = {"deadline_s": 5.0, "request_timeout_s": 5.0, "max_bytes": 1024 * 1024, **limits}
    return GuardedSession(
        url,
        deadline_s=values["deadline_s"],
        request_timeout_s=values["request_timeout_s"],
        max_bytes=int(values["max_bytes"]),
    )


def get(session: GuardedSession, url: str) -> requests.Response:
    return session.get(url, headers={"X-Plex-Token": "secret-token"})


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://Plex.local:32400/x", "http://plex.local:32400"),
        ("http://plex.local/x", "http://plex.local:80"),
        ("https://plex.local", "https://plex.local:443"),
        ("ftp://plex.local", ""),
        ("plex.local:32400", ""),
    ],
)
def test_origin_of(url: str, origin: str) -> None:
    assert origin_of(url) == origin


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://Plex.local:32400/library/metadata/101?a=1", "http://plex.local:32400"),
        ("http://plex.local/x", "http://plex.local:80"),
        ("https://plex.local", "https://plex.local:443"),
        ("http://[::1]:32400/x", "http://::1:32400"),
        # urlsplit reads plex.local:32400, requests connects to evil:1
        ("http://evil:1\\@plex.local:32400/x", ""),
        ("http://plex.local:32400/x\\y", ""),
        ("http://plex.local:32400@evil:1/x", ""),
        ("http://user:pass@plex.local:32400/x", ""),
        ("http://plex.local:32400#@evil:1/x", ""),
        ("http://plex.local:32400/x#frag", ""),
        ("http://plex.local:32400/a b", ""),
        ("http://plex.local:32400/\tx", ""),
        ("http://plex.local:32400/\x7f", ""),
        ("http://plex%2elocal:32400/", ""),  # urllib3 decodes the host, urlsplit does not
        ("http://plex.local:99999/", ""),
        ("ftp://plex.local/", ""),
        ("plex.local:32400", ""),
        ("/library/metadata/101", ""),
    ],
)
def test_plain_origin(url: str, origin: str) -> None:
    assert plain_origin(url) == origin


async def test_a_redirect_that_parses_two_ways_is_refused_and_the_token_stays_home(
    servers: tuple[Server, Server],
) -> None:
    home, other = servers
    home.elsewhere = f"{other.url}\\@{home.url.removeprefix('http://')}"
    session = session_for(home.url)
    with pytest.raises(OffOrigin) as refused:
        await asyncio.to_thread(get, session, f"{home.url}/plain/away")
    assert refused.value.origin == ""
    assert other.seen == []
    assert home.seen == [("/plain/away", "secret-token")]


async def test_a_redirect_to_another_server_is_refused_and_the_token_stays_home(
    servers: tuple[Server, Server],
) -> None:
    home, other = servers
    session = session_for(home.url)
    with pytest.raises(OffOrigin) as refused:
        await asyncio.to_thread(get, session, f"{home.url}/plain/away")
    assert refused.value.url == f"{other.url}/stolen"
    assert other.seen == []
    with pytest.raises(OffOrigin):
        await asyncio.to_thread(get, session, f"{other.url}/plain/direct")
    assert other.seen == []


async def test_a_redirect_within_the_server_is_followed(servers: tuple[Server, Server]) -> None:
    home, _ = servers
    session = session_for(home.url)
    reply = await asyncio.to_thread(session.post, f"{home.url}/plain/here", data=b"x")
    assert (reply.status_code, reply.text) == (200, "hello from /plain/ok")
    assert home.seen == [("/plain/here", None), ("/plain/ok", None)]
    with pytest.raises(requests.TooManyRedirects):
        await asyncio.to_thread(get, session, f"{home.url}/plain/loop")


async def test_a_body_over_the_limit_once_decompressed_is_refused(
    servers: tuple[Server, Server],
) -> None:
    home, _ = servers
    with pytest.raises(TooLarge):
        await asyncio.to_thread(get, session_for(home.url), f"{home.url}/plain/bomb")
    small = await asyncio.to_thread(get, session_for(home.url), f"{home.url}/plain/fine")
    assert small.text == "hello from /plain/fine"


async def test_one_deadline_bounds_a_body_that_keeps_trickling(
    servers: tuple[Server, Server],
) -> None:
    home, _ = servers
    session = session_for(home.url, deadline_s=0.5, request_timeout_s=2)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await asyncio.to_thread(get, session, f"{home.url}/plain/drip")
    assert time.monotonic() - started < 1.5  # each chunk came in time; the call did not


async def test_cancelling_the_caller_stops_the_requests_that_would_follow(
    servers: tuple[Server, Server],
) -> None:
    home, _ = servers
    first_sent, go_on = threading.Event(), threading.Event()

    def work(session: GuardedSession) -> str:
        get(session, f"{home.url}/plain/one")
        first_sent.set()
        go_on.wait(5)
        return get(session, f"{home.url}/plain/two").text

    session = session_for(home.url)
    task = asyncio.create_task(run_blocking(work, session))
    await asyncio.to_thread(first_sent.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    go_on.set()
    with pytest.raises(Cancelled):
        await asyncio.to_thread(get, session, f"{home.url}/plain/three")
    await asyncio.sleep(0.1)
    assert home.seen == [("/plain/one", "secret-token")]
