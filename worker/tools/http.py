"""Calling another service's JSON API from a tool, with every failure a message the model
can read (a `ToolException`), never an exception that ends the turn.

The client is the worker's (worker/tools/runtime.py): pooled, each step time-limited. On
top of that, here:

- One deadline, `BERNARD_TOOL_HTTP_TIMEOUT_S`, for the whole request: connecting, the
  headers, every redirect and the whole body. The client's own timeouts bound each read,
  so a service that sent a byte at a time held a call for as long as the tool may run.
- Redirects are followed only within the service's origin (scheme, host and port), at most
  `MAX_REDIRECTS` times: the operator configured the service, not whatever it points at
  (an address inside the network, say).
- A reply is read up to `MAX_BODY_BYTES`, counted as it is decompressed (gzip or deflate,
  inflated here in bounded steps rather than by httpx, which inflates each network read
  whole: a 64 KiB read of a gzip bomb is 64 MiB). A tool's input to the model is small,
  and a service that sends more is refused rather than buffered.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException

from shared.redaction import redact_urls
from worker.tools.runtime import get_runtime

MAX_BODY_BYTES = 2 * 1024 * 1024
MAX_REDIRECTS = 3
# The encodings a tool reads (what the client's Accept-Encoding offers); wbits for zlib.
_ENCODINGS = {
    "": None,
    "identity": None,
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,  # zlib's wrapper; a raw deflate stream is tried too
}
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ServiceError(ToolException):
    """A service's error reply (HTTP 4xx or 5xx) as the model reads it, with its `status` and
    `reason` (the service's own explanation, "" when it gave none) for a tool to act on."""

    def __init__(self, message: str, *, status: int, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


async def request_json(
    config: RunnableConfig,
    method: str,
    url: str,
    *,
    service: str,
    params: Mapping[str, str] | None = None,
    json: Any = None,
    headers: Mapping[str, str] | None = None,
    refused: str = "",
    missing_ok: bool = False,
    reason_of: Callable[[Any], str | None] | None = None,
) -> Any:
    """The JSON body of the reply; None for a 404 when `missing_ok`. An error reply raises
    `ServiceError`, any other failure a `ToolException`.

    `refused` is added to the message of a 401/403 (what the operator should check);
    `reason_of` picks the service's own explanation out of an error reply's body.
    """
    runtime = get_runtime(config)
    client = runtime.client()
    limit = runtime.settings.tool_http_timeout_s
    try:
        async with asyncio.timeout(limit):
            request = client.build_request(method, url, params=params, json=json, headers=headers)
            status, body = await _fetch(client, request, service)
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise ToolException(f"Error: {service} did not answer within {limit:g}s") from exc
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        reason = redact_urls(str(exc)) or type(exc).__name__
        raise ToolException(f"Error: could not reach {service}: {reason}") from exc
    if status == 404 and missing_ok:
        return None
    if status in (401, 403):
        raise ServiceError(
            f"Error: {service} refused the request (HTTP {status}){refused}", status=status
        )
    if status >= 400:
        reason = ""
        if reason_of is not None:
            try:
                reason = reason_of(orjson.loads(body)) or ""
            except (ValueError, TypeError, KeyError):
                reason = ""
        raise ServiceError(
            f"Error: {service} failed (HTTP {status}){f': {reason}' if reason else ''}",
            status=status,
            reason=reason,
        )
    try:
        return orjson.loads(body)
    except ValueError as exc:
        raise ToolException(f"Error: {service} sent a response that is not valid JSON") from exc


async def _fetch(
    client: httpx.AsyncClient, request: httpx.Request, service: str
) -> tuple[int, bytes]:
    """The final reply's status and body, after the redirects within `request`'s origin."""
    origin = origin_of(str(request.url))
    for _ in range(MAX_REDIRECTS + 1):
        response = await client.send(request, stream=True, follow_redirects=False)
        try:
            redirect = response.next_request
            if redirect is None:
                return response.status_code, await _read(response, service)
        finally:
            await response.aclose()
        elsewhere = origin_of(str(redirect.url))
        if elsewhere != origin:
            raise ToolException(
                f"Error: {service} redirected to another site ({elsewhere or redirect.url}), "
                "which tools do not follow"
            )
        request = redirect
    raise ToolException(f"Error: {service} redirected more than {MAX_REDIRECTS} times")


def origin_of(url: str) -> str:
    """`scheme://host:port` of `url`, the port explicit; "" for what is not an http(s) URL.
    The origin a tool's requests keep to, on either client (worker/tools/blocking.py)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return ""
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    return f"{parts.scheme}://{parts.hostname.lower()}:{port}"


async def _read(response: httpx.Response, service: str) -> bytes:
    """The body, decompressed, refused once it is over `MAX_BODY_BYTES`."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in _ENCODINGS:
        raise ToolException(
            f"Error: {service} sent a body encoded as {encoding!r}, which tools cannot read"
        )
    wbits = _ENCODINGS[encoding]
    inflater = None if wbits is None else _Inflater(wbits)
    body = bytearray()
    try:
        async for raw in response.aiter_raw():
            room = MAX_BODY_BYTES + 1 - len(body)
            body += raw[:room] if inflater is None else inflater.inflate(raw, room)
            if len(body) > MAX_BODY_BYTES:
                raise ToolException(f"Error: {service} sent more than {MAX_BODY_BYTES} bytes")
        if inflater is not None:
            body += inflater.flush(MAX_BODY_BYTES + 1 - len(body))
            if len(body) > MAX_BODY_BYTES:
                raise ToolException(f"Error: {service} sent more than {MAX_BODY_BYTES} bytes")
    except zlib.error as exc:
        raise ToolException(f"Error: {service} sent a body that cannot be decompressed") from exc
    return bytes(body)


class _Inflater:
    """zlib, giving at most `room` bytes a call: what it inflates beyond that is never
    made, and the caller refuses the body once it holds more than it may."""

    def __init__(self, wbits: int) -> None:
        self.wbits = wbits
        self.zlib = zlib.decompressobj(wbits)
        self.started = False

    def inflate(self, data: bytes, room: int) -> bytes:
        try:
            out = self.zlib.decompress(data, room)
        except zlib.error:
            if self.started or self.wbits != zlib.MAX_WBITS:
                raise
            # `deflate` as some servers send it: a raw stream, without zlib's wrapper.
            self.zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self.zlib.decompress(data, room)
        self.started = True
        return out

    def flush(self, room: int) -> bytes:
        return self.zlib.flush(max(room, 1))


def trim(text: str, limit: int) -> str:
    """`text` with its whitespace folded, cut at a word boundary to `limit` characters."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:") + "…"


def quoted(text: str, limit: int = 80) -> str:
    """`text` trimmed (`trim`) inside curly quotes, as a progress step or result names it."""
    return f"“{trim(text, limit)}”"
