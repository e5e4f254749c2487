"""`request_json`: every way a service can answer becomes JSON or a message the model reads;
no redirect leaves the service's origin, a compressed body is capped as it inflates, and one
deadline bounds the whole request."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from langchain_core.tools import ToolException
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.serving import serve
from tests.support.stack import make_settings
from worker.tools.http import MAX_BODY_BYTES, ServiceError, request_json, trim
from worker.tools.runtime import ToolRuntime, http_client, runtime_config


def config_answering(response: httpx.Response | Exception) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(response, Exception):
            raise response
        # As a server's reply comes: its body still to be read.
        body = httpx.ByteStream(response.content)
        return httpx.Response(response.status_code, headers=response.headers, stream=body)

    settings = make_settings()
    client = http_client(settings, httpx.MockTransport(handler))
    runtime = ToolRuntime(owner="t", redis=None, settings=settings, http=client)  # type: ignore[arg-type]
    return runtime_config(runtime, {})


async def call(response: httpx.Response | Exception, **options: Any) -> Any:
    return await request_json(
        config_answering(response), "GET", "http://svc/x", service="The service", **options
    )


@pytest.mark.parametrize(
    ("response", "options", "message"),
    [
        (httpx.Response(500), {}, "The service failed (HTTP 500)"),
        (
            httpx.Response(400, json={"reason": "bad latitude"}),
            {"reason_of": lambda body: body["reason"]},
            "The service failed (HTTP 400): bad latitude",
        ),
        (
            httpx.Response(401),
            {"refused": "; check the token"},
            "refused the request (HTTP 401); check the token",
        ),
        (httpx.Response(404), {}, "failed (HTTP 404)"),
        (httpx.Response(200, content=b"{not json"), {}, "not valid JSON"),
        (httpx.Response(200, content=b"x" * (MAX_BODY_BYTES + 1)), {}, "more than"),
        (httpx.ReadTimeout("slow"), {}, "did not answer within 10s"),
        (httpx.ConnectError("refused"), {}, "could not reach The service: refused"),
        (
            httpx.ConnectError("refused by http://u:pa55@svc/x?token=t"),
            {},
            "could not reach The service: refused by http://u:***@svc/x?token=***",
        ),
    ],
)
async def test_failures_are_messages_for_the_model(
    response: httpx.Response | Exception, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolException, match=re.escape(message)):
        await call(response, **options)


@pytest.mark.parametrize(
    ("response", "options", "status", "reason"),
    [
        (httpx.Response(500, text="oops"), {}, 500, ""),
        (
            httpx.Response(400, json={"reason": "bad latitude"}),
            {"reason_of": lambda body: body["reason"]},
            400,
            "bad latitude",
        ),
        (httpx.Response(400, json={}), {"reason_of": lambda body: body.get("reason")}, 400, ""),
        (httpx.Response(403), {"refused": "; check the token"}, 403, ""),
    ],
)
async def test_an_error_reply_carries_its_status_and_the_services_reason(
    response: httpx.Response, options: dict[str, Any], status: int, reason: str
) -> None:
    """For a tool to tell one failure from another without reading the model's message."""
    with pytest.raises(ServiceError) as raised:
        await call(response, **options)
    assert (raised.value.status, raised.value.reason) == (status, reason)


async def test_json_comes_back_and_a_404_can_mean_nothing() -> None:
    assert await call(httpx.Response(200, json={"a": [1]})) == {"a": [1]}
    assert await call(httpx.Response(404), missing_ok=True) is None


@pytest.mark.parametrize(
    ("text", "limit", "trimmed"),
    [
        ("short", 10, "short"),
        ("a  b\n c", 10, "a b c"),
        ("one two three four", 10, "one two…"),
        ("one, two three", 6, "one…"),
    ],
)
def test_trim_cuts_at_a_word(text: str, limit: int, trimmed: str) -> None:
    assert trim(text, limit) == trimmed


# -- a service of the test's own, over real HTTP ----------------------------------------------

# 256 MiB of JSON whitespace, gzipped to about 250 KiB: inflated whole, a network read of
# 64 KiB became 64 MiB before the cap was looked at.
BOMB_BYTES = 256 * 1024 * 1024


@functools.cache
def gzip_bomb() -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * (1024 * 1024)
    return b"".join(packer.compress(block) for _ in range(BOMB_BYTES // len(block))) + (
        packer.flush()
    )


@dataclass
class Service:
    """A loopback service: `url` reaches it, `hits` counts the requests it answered."""

    url: str
    hits: list[str]


@contextlib.asynccontextmanager
async def service(elsewhere: str = "") -> AsyncIterator[Service]:
    """Redirects (to `elsewhere`, or along a chain of its own), compressed bodies and a body
    that comes a byte at a time."""
    hits: list[str] = []

    async def answer(request: Request) -> Response:
        path = request.url.path
        hits.append(path)
        if path.startswith("/hop/"):
            left = int(path.removeprefix("/hop/"))
            if left == 0:
                return JSONResponse({"arrived": True})
            return Response(status_code=302, headers={"location": f"/hop/{left - 1}"})
        if path == "/away":
            return Response(status_code=307, headers={"location": f"{elsewhere}/inside"})
        if path == "/gzip":
            content = zlib.compress(b'{"small": true}', wbits=16 + zlib.MAX_WBITS)
            return Response(content, headers={"content-encoding": "gzip"})
        if path == "/deflate":
            content = zlib.compress(b'{"small": "deflated"}')
            return Response(content, headers={"content-encoding": "deflate"})
        if path == "/raw-deflate":  # as some servers send `deflate`: no zlib wrapper
            packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
            content = packer.compress(b'{"small": "raw"}') + packer.flush()
            return Response(content, headers={"content-encoding": "deflate"})
        if path == "/brotli":
            return Response(b"\x0b\x02\x80{}\x03", headers={"content-encoding": "br"})
        if path == "/bomb":
            return Response(gzip_bomb(), headers={"content-encoding": "gzip"})
        if path == "/drip":

            async def drip() -> AsyncIterator[bytes]:
                for _ in range(100):
                    yield b" "
                    await asyncio.sleep(0.2)
                yield b"{}"

            return StreamingResponse(drip(), media_type="application/json")
        return JSONResponse({"path": path})

    app = Starlette(routes=[Route("/{path:path}", answer, methods=["GET", "POST"])])
    async with serve(app, lifespan="off") as port:
        yield Service(f"http://127.0.0.1:{port}", hits)


@contextlib.asynccontextmanager
async def tool_config(**overrides: Any) -> AsyncIterator[Any]:
    """A tool's config with the worker's real HTTP client."""
    settings = make_settings(**overrides)
    async with http_client(settings) as client:
        runtime = ToolRuntime(owner="t", redis=None, settings=settings, http=client)  # type: ignore[arg-type]
        yield runtime_config(runtime, {})


async def test_a_redirect_to_another_origin_is_refused_and_never_followed() -> None:
    """A configured service must not send the worker to an address of its choosing (an
    internal one, say): another port of the same host is another origin too."""
    async with (
        service() as inside,
        service(elsewhere=inside.url) as outside,
        tool_config() as config,
    ):
        with pytest.raises(ToolException) as refused:
            await request_json(config, "GET", f"{outside.url}/away", service="The service")
    assert str(refused.value) == (
        f"Error: The service redirected to another site ({inside.url}), which tools do not follow"
    )
    assert inside.hits == []


async def test_same_origin_redirects_are_followed_three_times_at_most() -> None:
    async with service() as svc, tool_config() as config:
        arrived = await request_json(config, "GET", f"{svc.url}/hop/3", service="The service")
        assert arrived == {"arrived": True}
        with pytest.raises(ToolException, match="The service redirected more than 3 times"):
            await request_json(config, "GET", f"{svc.url}/hop/4", service="The service")
    followed, refused = svc.hits[:4], svc.hits[4:]
    assert followed == ["/hop/3", "/hop/2", "/hop/1", "/hop/0"]
    assert refused == ["/hop/4", "/hop/3", "/hop/2", "/hop/1"], "the fourth never asked"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/gzip", {"small": True}),
        ("/deflate", {"small": "deflated"}),
        ("/raw-deflate", {"small": "raw"}),
    ],
)
async def test_a_compressed_body_is_read(path: str, body: Any) -> None:
    async with service() as svc, tool_config() as config:
        assert await request_json(config, "GET", svc.url + path, service="The service") == body


async def test_a_body_in_an_encoding_tools_do_not_read_is_an_error() -> None:
    async with service() as svc, tool_config() as config:
        with pytest.raises(ToolException, match="sent a body encoded as 'br'"):
            await request_json(config, "GET", f"{svc.url}/brotli", service="The service")


async def test_a_gzip_bomb_is_cut_at_the_cap_as_it_inflates() -> None:
    """The cap on what a reply may hold counts the inflated bytes as they come: what a call
    holds at once stays near the cap, never a whole network read inflated."""
    bomb = gzip_bomb()
    async with service() as svc, tool_config() as config:
        tracemalloc.start()
        try:
            with pytest.raises(ToolException, match=f"sent more than {MAX_BODY_BYTES} bytes"):
                await request_json(config, "GET", f"{svc.url}/bomb", service="The service")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert len(bomb) < 1024 * 1024
    assert peak < 4 * MAX_BODY_BYTES, f"{peak / 2**20:.0f} MiB at once"
    print(f"\na {BOMB_BYTES >> 20} MiB gzip bomb held {peak / 2**20:.1f} MiB at most")


async def test_a_service_that_drip_feeds_its_body_is_cut_at_one_deadline() -> None:
    """`BERNARD_TOOL_HTTP_TIMEOUT_S` bounds the whole request, not each read: a byte every
    0.2 s held a call for the tool's whole time."""
    async with service() as svc, tool_config(tool_http_timeout_s=1.0) as config:
        started = time.monotonic()
        with pytest.raises(ToolException, match="The service did not answer within 1s"):
            async with asyncio.timeout(10):
                await request_json(config, "GET", f"{svc.url}/drip", service="The service")
        elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 2.0, elapsed
