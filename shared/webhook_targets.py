"""Where a webhook may be POSTed: the origins a request's own `webhook_url` may name, and
the addresses a delivery may reach (shared/webhooks.py says what is sent and when).

**Origins, not hosts.** `BERNARD_WEBHOOK_ORIGINS` lists `scheme://host[:port]`; a request's
`webhook_url` must be on one of them, its port included (the default one when it names
none), any path. A URL is read as httpx, the client that POSTs it (worker/webhooks.py),
reads it, and one that `urlsplit` reads otherwise, or that holds a backslash, a user name
or a space or control character, is refused (`read_url`).

**Private targets.** Unless `BERNARD_WEBHOOK_ALLOW_PRIVATE` is set, a receiver must be
public: the settings are refused at start when `BERNARD_WEBHOOK_URL` or an origin names a
private, loopback, link-local, reserved or multicast address, or a local name (one label,
or under a private-use suffix such as `.local`, `.internal`, `.lan`, `.home.arpa`:
`metadata.google.internal` among them) (`check_targets`); and each delivery resolves its
host and refuses it when any address it resolves to is not public, then connects to the
address it checked (`public_address`), so a name cannot resolve elsewhere in between.

Tests: tests/shared/test_webhook_signing.py (the rules, table-driven), tests/test_webhooks.py
(through the API and a worker).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

if TYPE_CHECKING:
    from shared.settings import Settings

__all__ = [
    "URL_MAX_CHARS",
    "Origin",
    "PrivateTarget",
    "WebhookTargetError",
    "allowed_origins",
    "check_targets",
    "private_reason",
    "public_address",
    "read_url",
    "requested_target",
]

# The longest `webhook_url` a request may name.
URL_MAX_CHARS = 2048
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Suffixes of names that resolve on a local network only (RFC 6761, 6762 appendix G, 8375,
# and ICANN's `.internal`).
_LOCAL_SUFFIXES = (
    "localhost",
    "localdomain",
    "local",
    "internal",
    "home.arpa",
    "lan",
    "home",
    "corp",
    "intranet",
    "private",
)
_AddressType = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookTargetError(ValueError):
    """A webhook target may not be used; the message says why."""


class PrivateTarget(Exception):
    """A delivery's host resolves to an address that is not public."""


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


def _embedded(address: _AddressType) -> _AddressType:
    """The IPv4 address an IPv6 one carries (`::ffff:10.0.0.1`, 6to4), else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        return address.ipv4_mapped or address.sixtofour or address
    return address


def _address_reason(address: _AddressType) -> str | None:
    address = _embedded(address)
    for reason, refused in (
        ("a loopback address", address.is_loopback),
        ("a link-local address", address.is_link_local),
        ("an unspecified address", address.is_unspecified),
        ("a multicast address", address.is_multicast),
        ("a private address", address.is_private),
        ("a reserved address", address.is_reserved),
        ("not a public address", not address.is_global),
    ):
        if refused:
            return reason
    return None


def private_reason(host: str) -> str | None:
    """Why a webhook may not go to `host` (an address or a name) without
    `BERNARD_WEBHOOK_ALLOW_PRIVATE`: "a private address", "a local name"...; None when it
    may. A public name is checked again at delivery, by what it resolves to."""
    try:
        return _address_reason(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        pass
    name = host.rstrip(".").lower()
    if "." not in name or any(name == s or name.endswith(f".{s}") for s in _LOCAL_SUFFIXES):
        return "a local name"
    return None


def check_targets(settings: Settings) -> None:
    """Refuse (`WebhookTargetError`) a `BERNARD_WEBHOOK_URL` or an origin that is not a
    plain URL, or that is private while private targets are not allowed."""
    targets = [(f"BERNARD_WEBHOOK_ORIGINS' {str(o)!r}", o) for o in allowed_origins(settings)]
    if settings.webhook_url:
        origin = read_url(settings.webhook_url, "BERNARD_WEBHOOK_URL", user_ok=True)
        targets.insert(0, ("BERNARD_WEBHOOK_URL", origin))
    if settings.webhook_allow_private:
        return
    for name, origin in targets:
        reason = private_reason(origin.host)
        if reason is not None:
            raise WebhookTargetError(
                f"{name} names {origin.host}, {reason}: webhooks go to public receivers "
                "unless BERNARD_WEBHOOK_ALLOW_PRIVATE=true"
            )


async def public_address(url: str) -> str:
    """The address the delivery to `url` connects to: the first its host resolves to, once
    every one is public; `PrivateTarget` otherwise (OSError when it does not resolve)."""
    parsed = httpx.URL(url)
    port = parsed.port or _DEFAULT_PORTS.get(parsed.scheme, 0)
    found = await asyncio.get_running_loop().getaddrinfo(parsed.host, port, type=socket.SOCK_STREAM)
    addresses = [str(info[4][0]) for info in found]
    for address in addresses:
        reason = _address_reason(ipaddress.ip_address(address.partition("%")[0]))
        if reason is not None:
            raise PrivateTarget(f"{parsed.host} resolves to {address}, {reason}")
    if not addresses:
        raise OSError(f"{parsed.host} resolves to no address")
    return addresses[0]
