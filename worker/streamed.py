"""A stream with its result beside it: iterate it for the items, then read `result`.

A model call streams text and ends with the whole message and its usage; a tool call streams
progress and ends with its outcome. Yielding that ending as the stream's last item would make
every consumer test each item's type, on every token. Here the producer hands its ending to
`ended` instead, and the consumer reads it from `result` once the items are all out.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Generic, TypeVar

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

__all__ = ["Streamed"]


class Streamed(Generic[ItemT, ResultT]):
    """The items of one producer, and what it ended with.

    `produce(ended)` is an async generator that yields the items and calls `ended(result)`
    before it returns. Iterating this object iterates that generator itself (no hop per
    item); `aclose()` closes it early (what `contextlib.aclosing` calls), and `result` raises
    `RuntimeError` until the producer has ended.
    """

    def __init__(
        self, produce: Callable[[Callable[[ResultT], None]], AsyncGenerator[ItemT, None]]
    ) -> None:
        self._ended = False
        self._result: ResultT | None = None
        self._items = produce(self._end)

    def _end(self, result: ResultT) -> None:
        self._result = result
        self._ended = True

    def __aiter__(self) -> AsyncGenerator[ItemT, None]:
        return self._items

    async def aclose(self) -> None:
        await self._items.aclose()

    @property
    def result(self) -> ResultT:
        """What the producer ended with."""
        if not self._ended:
            raise RuntimeError("the stream has not ended: iterate it to its end first")
        return self._result  # type: ignore[return-value]  # set by `_end`, maybe to None
