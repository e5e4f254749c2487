"""How full a Redis server is, from its `INFO memory` (api/store_guard.py)."""

from __future__ import annotations

from typing import Any

import pytest

from api.store_guard import Fill, fill_of


@pytest.mark.parametrize(
    ("info", "fill", "fraction"),
    [
        (
            {"used_memory": 900, "maxmemory": 1000, "total_system_memory": 8000},
            Fill("r", 900, 1000),
            0.9,
        ),
        # No maxmemory: Redis grows until its machine runs out.
        (
            {"used_memory": 900, "maxmemory": 0, "total_system_memory": 8000},
            Fill("r", 900, 8000, of_machine=True),
            0.1125,
        ),
        # A server that says nothing of its limits (a managed Redis may not) is never full.
        ({"used_memory": 900}, Fill("r", 900, 0, of_machine=True), 0.0),
    ],
    ids=["maxmemory", "machine", "no-limit-known"],
)
def test_a_servers_limit_is_its_maxmemory_else_its_machines_memory(
    info: dict[str, Any], fill: Fill, fraction: float
) -> None:
    assert fill_of("r", info) == fill
    assert fill_of("r", info).fraction == fraction
