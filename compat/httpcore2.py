"""httpcore2 (bounded in pyproject.toml), past its interface: the network backend of a pool
that already exists.

`AsyncConnectionPool(network_backend=...)` is documented; a pool httpx2 built keeps the one
it was built with in `_network_backend`, read each time the pool opens a connection. So
setting it there puts the pool's future connections on another backend
(worker/upstream_sockets.py's `AsyncioBackend`; compat/httpx2.py finds the pools).
tests/compat/test_httpx2.py holds it.
"""

from __future__ import annotations

import httpcore2

__all__ = ["set_network_backend"]


def set_network_backend(
    pool: httpcore2.AsyncConnectionPool, backend: httpcore2.AsyncNetworkBackend
) -> None:
    """Open `pool`'s next connections through `backend`."""
    pool._network_backend = backend
