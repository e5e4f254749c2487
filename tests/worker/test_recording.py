"""Record writes run in the background, in order, and a failed one is never lost."""

from __future__ import annotations

import asyncio

import pytest

from worker.recording import OrderedWrites


async def test_writes_run_in_order_without_holding_up_the_caller() -> None:
    done: list[int] = []
    gate = asyncio.Event()

    async def write(n: int) -> None:
        if n == 0:
            await gate.wait()
        done.append(n)

    writes = OrderedWrites()
    for n in range(3):
        writes.add(write(n))  # returns at once although the first write is still blocked
    await asyncio.sleep(0.01)
    assert done == []
    gate.set()
    await writes.drain()
    assert done == [0, 1, 2]


async def test_a_failed_write_surfaces_at_drain_and_stops_the_writes_behind_it() -> None:
    ran: list[str] = []

    async def fail() -> None:
        raise ConnectionError("redis went away")

    async def write(name: str) -> None:
        ran.append(name)

    writes = OrderedWrites()
    writes.add(fail())
    writes.add(write("behind"))
    with pytest.raises(ConnectionError):
        await writes.drain()
    assert ran == []


async def test_a_failed_write_surfaces_at_the_next_add() -> None:
    async def fail() -> None:
        raise ConnectionError("redis went away")

    async def write() -> None:
        raise AssertionError("must not run after a failed write")

    writes = OrderedWrites()
    writes.add(fail())
    await asyncio.sleep(0.01)
    with pytest.raises(ConnectionError):
        writes.add(write())
