"""requests (bounded in pyproject.toml), past its interface: a response's body, read by
someone else.

requests reads a body whole, whatever its size, when asked for `.content`; there is no
public way to hand a `Response` a body read another way. worker/tools/blocking.py reads it
itself (bounded in size and time) and stores it where requests keeps a body it has read,
`Response._content`, so `.content`, `.text` and `.json()` answer from it.
tests/compat/test_requests.py holds it.
"""

from __future__ import annotations

import requests

__all__ = ["keep_body"]


def keep_body(response: requests.Response, body: bytes) -> None:
    """Make `body` the body `response` answers with (read already: the connection is not
    read again)."""
    response._content = body
