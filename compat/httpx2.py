"""httpx2 (bounded in pyproject.toml), past its interface: the connection pools under an
`AsyncClient`.

httpx has no argument for the network backend its pools connect through (httpcore's
documented extension point, `AsyncNetworkBackend`), so reaching a client's pools takes its
private attributes: `AsyncClient._transport` (the default transport) and `_mounts` (the
proxies' transports, None for a pattern mounted to nothing), and each
`AsyncHTTPTransport._pool` (an httpcore2 pool). worker/upstream_sockets.py puts the pools on
its own backend (compat/httpcore2.py). tests/compat/test_httpx2.py holds it.
"""

from __future__ import annotations

from typing import Any

import httpcore2
import httpx2

__all__ = ["connection_pools"]


def connection_pools(client: httpx2.AsyncClient) -> list[httpcore2.AsyncConnectionPool]:
    """The httpcore2 connection pools `client` sends through (its own, each proxy's); a
    transport of another kind (a mock, another HTTP library's) has none."""
    transports: list[Any] = [client._transport, *client._mounts.values()]
    pools = [getattr(transport, "_pool", None) for transport in transports]
    return [pool for pool in pools if isinstance(pool, httpcore2.AsyncConnectionPool)]
