"""Tools built on a blocking HTTP client (plexapi, which speaks through `requests`): their
calls run off the event loop, with the protections the worker's own HTTP client gives.

`requests` follows redirects to any host (and keeps custom headers such as `X-Plex-Token`
on the way), reads a body whole whatever its size, and bounds each socket operation, never
a call. So a blocking tool gets a `GuardedSession`, made for one tool call, that

- sends requests only to the origin it was made for, and follows a redirect only within it
  (a redirect elsewhere is refused, the token never leaves). The origin is read as
  `requests` reads it to connect (urllib3's `parse_url`), and a URL that `urlsplit` reads
  otherwise, or that holds a backslash, a user name, a fragment or a control character, is
  refused: `http://evil:1\\@plex:32400/` is plex to `urlsplit` and evil to `requests`;
- reads a body up to `max_bytes` once decompressed, and refuses it beyond;
- has one deadline for the whole call: each request is limited to what is left of it (and
  to `request_timeout_s`), and the body is read no longer than that;
- once `cancel()`ed, sends no further request.

`run_blocking(work, session)` runs `work(session)` in a small thread pool of its own (the
event loop's default executor also resolves host names for every connection the worker
opens: a slow service must never hold those up). Cancelling the awaiting task (the tool's
time is up, or the turn stopped) cancels the session: the request in flight ends by its own
timeout, within the deadline, and nothing after it is sent (a play command never follows a
lookup that was given up on). `requests` has no public way to bound a body it reads for
its caller: the session reads it and hands it over (compat/requests.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import requests
from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from compat.requests import keep_body

# One origin rule and one redirect limit for the tools on either HTTP client.
from worker.tools.http import MAX_REDIRECTS, origin_of

__all__ = [
    "Cancelled",
    "DeadlineExceeded",
    "GuardedSession",
    "OffOrigin",
    "TooLarge",
    "origin_of",
    "plain_origin",
    "run_blocking",
]

T = TypeVar("T")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_CHUNK = 64 * 1024
# Threads for blocking tools, per worker process: a household has few such calls at once,
# and a call past its deadline frees its thread within one request timeout.
_POOL_SIZE = 4
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


class GuardError(Exception):
    """A request the session refused or gave up on."""


class OffOrigin(GuardError):
    """A request (or a redirect) to another origin than the session's, or to a URL that is
    not plain (`plain_origin`: then `origin` is "")."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.origin = plain_origin(url)
        super().__init__(
            f"refused to follow {self.origin}: another server"
            if self.origin
            else "refused to follow a URL that is not a plain one"
        )


def plain_origin(url: str) -> str:
    """`scheme://host:port` of the server `requests` connects to for `url` (the host as
    urllib3's `parse_url` reads it, which `requests` parses with), when `url` is plain:
    http(s), a host, no user name, no backslash, fragment, space or control character, and
    the same origin to `urlsplit` (`origin_of`). Else ""."""
    if any(c in "\\#" or c <= " " or c == "\x7f" for c in url):
        return ""
    try:
        parts = parse_url(url)
        split = origin_of(url)
        named = "@" in urlsplit(url).netloc
    except (LocationParseError, ValueError):  # ValueError: `urlsplit`'s bad port
        return ""
    if named or parts.auth is not None or parts.scheme not in _DEFAULT_PORTS or not parts.host:
        return ""
    host = parts.host.removeprefix("[").removesuffix("]")  # urlsplit's IPv6, unbracketed
    origin = f"{parts.scheme}://{host}:{parts.port or _DEFAULT_PORTS[parts.scheme]}"
    return origin if origin == split else ""


class TooLarge(GuardError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"sent more than {limit} bytes")
        self.limit = limit


class DeadlineExceeded(GuardError):
    def __init__(self, limit_s: float) -> None:
        super().__init__(f"did not answer within {limit_s:g}s")
        self.limit_s = limit_s


class Cancelled(GuardError):
    def __init__(self) -> None:
        super().__init__("the call was given up on")


class GuardedSession(requests.Session):
    """A `requests` session for one tool call to one service (see the module docstring)."""

    def __init__(
        self, base_url: str, *, deadline_s: float, request_timeout_s: float, max_bytes: int
    ) -> None:
        super().__init__()
        self.origin = plain_origin(base_url)
        self.deadline_s = deadline_s
        self.request_timeout_s = request_timeout_s
        self.max_bytes = max_bytes
        self.last_status: int | None = None
        self._deadline = time.monotonic() + deadline_s
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """No request is sent from now on (thread-safe)."""
        self._cancelled.set()

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:
        target = url.decode() if isinstance(url, bytes) else url
        verb = method.decode() if isinstance(method, bytes) else method
        for _ in range(MAX_REDIRECTS + 1):
            response = self._one(verb, target, *args, **kwargs)
            if not response.is_redirect:
                return response
            response.close()
            target = urljoin(target, response.headers["location"])
            if response.status_code == 303 or (
                response.status_code in (301, 302) and verb.upper() == "POST"
            ):
                verb, kwargs = "GET", {k: v for k, v in kwargs.items() if k not in ("data", "json")}
        raise requests.TooManyRedirects(f"more than {MAX_REDIRECTS} redirects")

    def _one(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:
        if self._cancelled.is_set():
            raise Cancelled()
        if not self.origin or plain_origin(url) != self.origin:
            raise OffOrigin(url)
        kwargs.update(
            timeout=min(self.request_timeout_s, self._remaining()),
            allow_redirects=False,
            stream=True,
        )
        response: requests.Response = super().request(method, url, *args, **kwargs)
        self.last_status = response.status_code
        if response.is_redirect:
            return response
        body = bytearray()
        try:
            for chunk in response.iter_content(_CHUNK):
                body += chunk
                if len(body) > self.max_bytes:
                    raise TooLarge(self.max_bytes)
                self._remaining()
        finally:
            response.close()
        keep_body(response, bytes(body))
        return response

    def _remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(self.deadline_s)
        return left


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_POOL_SIZE, thread_name_prefix="bernard-blocking-tool")
        return _pool


async def run_blocking(work: Callable[[GuardedSession], T], session: GuardedSession) -> T:
    """`work(session)` in the blocking tools' threads; cancelling the caller cancels the
    session (module docstring). The session is closed once `work` is done."""

    def run() -> T:
        try:
            return work(session)
        finally:
            session.close()

    try:
        return await asyncio.get_running_loop().run_in_executor(_executor(), run)
    finally:
        session.cancel()
