"""Credentials inside URLs, hidden wherever a URL is shown: a log line (shared/logs.py runs
every line through `redact_urls`), an error message, `bernard doctor`'s and `./run`'s
output.

A URL can carry a credential in two places: its userinfo (`https://user:password@host`;
a user alone, `https://token@host`, is taken as a token) and its query (`?api_key=`,
`?token=`, `?sentinel_password=`: any parameter whose name says key, token, secret,
password, auth, signature or credential). `redact_url` replaces each with `***` and keeps
the rest, which says where the URL points. `url_secrets` gives the values themselves, so
that the log formatter also hides one that appears without its URL.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit, urlunsplit

__all__ = ["HIDDEN", "redact_url", "redact_urls", "url_secrets"]

HIDDEN = "***"

# A query parameter whose value is a credential, by its name.
_CREDENTIAL = re.compile(r"key|token|secret|pass|pwd|auth|sig|credential", re.IGNORECASE)
# A URL inside free text: a scheme, `://`, then up to a space, a quote or an angle bracket.
_URL = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>]+""")
# `name=value` pairs of a query, each value to the next `&`, `;` or `#`.
_PAIR = re.compile(r"(^|[&;])([^=&;#]*)=([^&;#]*)")


def _hide_query(query: str) -> str:
    def hide(pair: re.Match[str]) -> str:
        lead, name, value = pair.groups()
        if value and _CREDENTIAL.search(name):
            return f"{lead}{name}={HIDDEN}"
        return pair[0]

    return _PAIR.sub(hide, query)


def redact_url(url: str) -> str:
    """`url` with the credentials in its userinfo and query replaced by `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        # Not a URL urlsplit reads (a bracket out of place): hide all of the userinfo.
        scheme, sep, rest = url.partition("://")
        userinfo, at, tail = rest.partition("@")
        if not sep or not at or "/" in userinfo:
            return url
        return f"{scheme}{sep}{HIDDEN}@{tail}"
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at and userinfo:
        user, colon, password = userinfo.partition(":")
        shown = f"{user}:{HIDDEN}" if colon and password else HIDDEN if not colon else userinfo
        netloc = f"{shown}@{host}"
    return urlunsplit(parts._replace(netloc=netloc, query=_hide_query(parts.query)))


def redact_urls(text: str) -> str:
    """`text` with every URL in it redacted (`redact_url`)."""
    if "://" not in text:
        return text
    return _URL.sub(lambda found: redact_url(found[0]), text)


def url_secrets(url: str | None) -> list[str]:
    """The passwords and credential parameters `url` holds, empty for None. Not a user
    alone: `redact_url` hides one where its URL is shown, but it may be a plain name
    (`redis://default@host`) that the log must not hide wherever else it appears."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    userinfo, at, _ = parts.netloc.rpartition("@")
    found: list[str] = []
    if at and userinfo:
        found.append(userinfo.partition(":")[2])
    found += [
        value
        for name, value in parse_qsl(parts.query, keep_blank_values=False)
        if _CREDENTIAL.search(name)
    ]
    return [value for value in found if value]
