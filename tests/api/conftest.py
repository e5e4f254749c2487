"""Fixtures of the API's stream tests (tests/api/test_relay.py, tests/api/test_session.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis_asyncio

from api.hub import StreamHub


@pytest.fixture
async def hub(redis: redis_asyncio.Redis) -> AsyncIterator[StreamHub]:
    """A running hub on the test's Redis, reading with a short block."""
    running = StreamHub(redis, block_ms=200)
    await running.start()
    yield running
    await running.stop()
