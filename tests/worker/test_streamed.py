"""A stream with its result beside it (worker/streamed.py)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

import pytest

from worker.streamed import Streamed


def counting(closed: list[bool]) -> Streamed[int, str]:
    async def produce(ended: Callable[[str], None]) -> AsyncGenerator[int, None]:
        try:
            for n in (1, 2, 3):
                yield n
            ended("three numbers")
        finally:
            closed.append(True)

    return Streamed(produce)


async def test_the_items_stream_and_the_result_is_beside_them() -> None:
    stream = counting([])
    assert [n async for n in stream] == [1, 2, 3]
    assert stream.result == "three numbers"


async def test_the_result_is_not_there_before_the_stream_ends() -> None:
    stream = counting([])
    async for _ in stream:
        with pytest.raises(RuntimeError, match="not ended"):
            _ = stream.result
        break


async def test_closing_early_closes_the_producer_and_leaves_no_result() -> None:
    closed: list[bool] = []
    stream = counting(closed)
    async with aclosing(stream):
        async for _ in stream:
            break
    assert closed == [True]
    with pytest.raises(RuntimeError):
        _ = stream.result


async def test_a_result_of_none_counts_as_ended() -> None:
    async def produce(ended: Callable[[None], None]) -> AsyncGenerator[int, None]:
        yield 1
        ended(None)

    stream: Streamed[int, None] = Streamed(produce)
    assert [n async for n in stream] == [1]
    assert stream.result is None
