"""Behaviour of `worker.sequencer.Sequencer`: order, late chaining, ending, errors, cleanup."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from worker.sequencer import Sequencer


async def items(*values: int) -> AsyncGenerator[int, None]:
    for value in values:
        await asyncio.sleep(0)
        yield value


class Tracked:
    """An async iterator that remembers whether it was closed, like an HTTP token stream."""

    def __init__(self, *values: int, block_after: bool = False) -> None:
        self.values = list(values)
        self.block_after = block_after
        self.closed = False
        self.started = False
        self._gate = asyncio.Event()

    def __aiter__(self) -> AsyncIterator[int]:
        return self

    async def __anext__(self) -> int:
        self.started = True
        if self.values:
            return self.values.pop(0)
        if self.block_after:
            await self._gate.wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


async def collect(sequencer: Sequencer[int]) -> list[int]:
    return [item async for item in sequencer]


async def test_items_of_each_source_are_yielded_in_order_source_after_source() -> None:
    sequencer: Sequencer[int] = Sequencer()
    sequencer.chain(items(1, 2, 3))
    sequencer.chain(items(4))
    sequencer.chain(items())
    sequencer.chain(items(5, 6))
    sequencer.chain(None)

    assert await collect(sequencer) == [1, 2, 3, 4, 5, 6]


async def test_sources_chained_after_consumption_began_are_yielded_in_order() -> None:
    sequencer: Sequencer[int] = Sequencer()
    seen: list[int] = []
    first_seen = asyncio.Event()

    async def consume() -> None:
        async for item in sequencer:
            seen.append(item)
            first_seen.set()

    consumer = asyncio.create_task(consume())
    sequencer.chain(items(1, 2))
    await first_seen.wait()
    sequencer.chain(items(3))
    await asyncio.sleep(0.01)
    sequencer.chain(items(4, 5))
    sequencer.chain(None)
    await asyncio.wait_for(consumer, 1)

    assert seen == [1, 2, 3, 4, 5]


async def test_a_later_source_is_not_read_before_the_earlier_one_is_drained() -> None:
    sequencer: Sequencer[int] = Sequencer()
    slow = Tracked(1, block_after=True)
    fast = Tracked(2)
    sequencer.chain(slow)
    sequencer.chain(fast)
    sequencer.chain(None)
    iterator = aiter(sequencer)

    assert await anext(iterator) == 1
    pending = asyncio.ensure_future(anext(iterator))
    await asyncio.sleep(0.01)
    assert not pending.done()
    assert not fast.started

    slow._gate.set()
    assert await asyncio.wait_for(pending, 1) == 2


async def test_consumption_waits_for_sources_until_chain_none_ends_the_sequence() -> None:
    sequencer: Sequencer[int] = Sequencer()
    sequencer.chain(items(1))
    consumer = asyncio.create_task(collect(sequencer))
    await asyncio.sleep(0.01)
    assert not consumer.done()

    sequencer.chain(None)
    assert await asyncio.wait_for(consumer, 1) == [1]


async def test_chain_none_alone_yields_an_empty_sequence() -> None:
    sequencer: Sequencer[int] = Sequencer()
    sequencer.chain(None)

    assert await collect(sequencer) == []


async def test_chaining_after_chain_none_is_an_error() -> None:
    sequencer: Sequencer[int] = Sequencer()
    sequencer.chain(None)

    with pytest.raises(RuntimeError):
        sequencer.chain(items(1))


async def test_an_exception_raised_in_a_source_surfaces_to_the_consumer() -> None:
    async def failing() -> AsyncGenerator[int, None]:
        yield 1
        raise ValueError("upstream broke")

    later = Tracked(9)
    sequencer: Sequencer[int] = Sequencer()
    sequencer.chain(failing())
    sequencer.chain(later)
    sequencer.chain(None)
    seen: list[int] = []

    with pytest.raises(ValueError, match="upstream broke"):
        async for item in sequencer:
            seen.append(item)

    assert seen == [1]
    assert later.closed and not later.started


async def test_closing_early_closes_the_active_source_and_the_queued_ones() -> None:
    active = Tracked(1, 2, 3)
    queued = Tracked(4)
    sequencer: Sequencer[int] = Sequencer()
    sequencer.chain(active)
    sequencer.chain(queued)

    async with contextlib.aclosing(sequencer):
        async for item in sequencer:
            assert item == 1
            break

    assert active.closed
    assert queued.closed and not queued.started


async def test_closing_early_runs_the_cleanup_of_an_async_generator_source() -> None:
    released = asyncio.Event()

    async def stream() -> AsyncGenerator[int, None]:
        try:
            yield 1
            yield 2
        finally:
            released.set()

    sequencer: Sequencer[int] = Sequencer()
    sequencer.chain(stream())
    iterator = aiter(sequencer)
    assert await anext(iterator) == 1

    await sequencer.aclose()

    assert released.is_set()


async def test_cancelling_the_consumer_closes_the_active_source() -> None:
    blocking = Tracked(1, block_after=True)
    queued = Tracked(2)
    sequencer: Sequencer[int] = Sequencer()
    sequencer.chain(blocking)
    sequencer.chain(queued)
    got_first = asyncio.Event()

    async def consume() -> None:
        async for _ in sequencer:
            got_first.set()

    consumer = asyncio.create_task(consume())
    await got_first.wait()
    await asyncio.sleep(0.01)
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer

    assert blocking.closed
    assert queued.closed


async def test_chaining_after_the_consumer_left_is_an_error() -> None:
    sequencer: Sequencer[int] = Sequencer()
    sequencer.chain(items(1))
    await sequencer.aclose()

    with pytest.raises(RuntimeError):
        sequencer.chain(Tracked(2))


async def test_closing_a_sequence_never_iterated_closes_its_sources() -> None:
    source = Tracked(1)
    sequencer: Sequencer[int] = Sequencer()
    sequencer.chain(source)

    await sequencer.aclose()

    assert source.closed and not source.started
