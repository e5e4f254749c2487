"""Where a webhook may be POSTed: the origins a request's own `webhook_url` may name, and
the addresses a delivery may reach (shared/webhooks.py says what is sent and when).

**Origins, not hosts.** `BERNARD_WEBHOOK_ORIGINS` lists `scheme://host[:port]`; a request's
`webhook_url` must be on one of them, its port included (the default one when it names
none), any path. A URL is read as httpx, the client that POSTs it (worker/webhooks.py),
reads it, and one that `urlsplit` reads otherwise, or that holds a backslash, a user name
or a space or control character, is refused (`read_url`).

Tests: tests/shared/test_webhook_signing.py (the rules, table-driven), tests/test_webhooks.py
(through the API and a worker).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

if TYPE_CHECKING:
    from shared.settings import Settings

__all__ = [
    "URL_MAX_CHARS",
    "Origin",
    "WebhookTargetError",
    "allowed_origins",
    "check_targets",
    "read_url",
    "requested_target",
]

# The longest `webhook_url` a request may name.
URL_MAX_CHARS = 2048
_DEFAULT_PORTS = {"http": 80, "https": 443}


class WebhookTargetError(ValueError):
    """A webhook target may not be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Scheme, host (lower-case, IPv6 without brackets) and port, the default one filled in."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def read_url(url: str, name: str, *, user_ok: bool = False) -> Origin:
    """The origin httpx connects to for `url`; `WebhookTargetError` naming `name` when it is
    not an http(s) URL with a host, holds a backslash, a space or control character, a user
    name (unless `user_ok`), or reads as another origin to `urlsplit`."""
    if any(c == "\\" or c <= " " or c == "\x7f" for c in url):
        raise WebhookTargetError(f"{name} holds a backslash, a space or a control character")
    try:
        parsed = httpx.URL(url)
        split = urlsplit(url)
        split_port = split.port
    except (httpx.InvalidURL, ValueError):
        raise WebhookTargetError(f"{name} is not a URL") from None
    if parsed.scheme not in _DEFAULT_PORTS or not parsed.host:
        raise WebhookTargetError(f"{name} must be an http:// or https:// URL")
    if (parsed.userinfo or "@" in split.netloc) and not user_ok:
        raise WebhookTargetError(f"{name} must not hold a user name")
    port = parsed.port or _DEFAULT_PORTS[parsed.scheme]
    origin = Origin(parsed.scheme, parsed.host.lower(), port)
    split_origin = Origin(
        split.scheme.lower(),
        (split.hostname or "").lower(),
        split_port or _DEFAULT_PORTS.get(split.scheme.lower(), 0),
    )
    if origin != split_origin:
        raise WebhookTargetError(f"{name} reads as two different servers")
    return origin


def allowed_origins(settings: Settings) -> frozenset[Origin]:
    """`BERNARD_WEBHOOK_ORIGINS`, read; `WebhookTargetError` for an entry that is not
    `scheme://host[:port]`."""
    origins = set()
    for entry in (part.strip() for part in settings.webhook_origins.split(",")):
        if not entry:
            continue
        name = f"BERNARD_WEBHOOK_ORIGINS' {entry!r}"
        origin = read_url(entry, name)
        parts = urlsplit(entry)
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise WebhookTargetError(f"{name} must be scheme://host[:port], without a path")
        origins.add(origin)
    return frozenset(origins)


def requested_target(url: str, settings: Settings) -> str:
    """`url`, a request's own `webhook_url`, if it may be used: on an origin of
    `BERNARD_WEBHOOK_ORIGINS`; else `WebhookTargetError` naming its origin."""
    if len(url) > URL_MAX_CHARS:
        raise WebhookTargetError(f"webhook_url may hold at most {URL_MAX_CHARS} characters")
    origin = read_url(url, "webhook_url")
    if origin not in allowed_origins(settings):
        raise WebhookTargetError(
            f"webhook_url's origin {str(origin)!r} is not one this server may call "
            "(BERNARD_WEBHOOK_ORIGINS)"
        )
    return url


def check_targets(settings: Settings) -> None:
    """Refuse (`WebhookTargetError`) a `BERNARD_WEBHOOK_URL` or an origin that is not a
    plain URL."""
    allowed_origins(settings)
    if settings.webhook_url:
        read_url(settings.webhook_url, "BERNARD_WEBHOOK_URL", user_ok=True)
