"""The relay pattern: one ordered stream made of async iterables chained while it runs.

A turn's harnesses are async generators. The turn runner hands each one to a `Sequencer`
as soon as it exists, possibly while the consumer is still reading an earlier one, and the
consumer sees every item of the first source, then every item of the second, and so on.
`chain(None)` says no more sources will come; the sequence ends once the chained ones drain.

    sequencer: Sequencer[Event] = Sequencer()
    sequencer.chain(router_harness())
    sequencer.chain(response_harness())
    sequencer.chain(None)
    async with contextlib.aclosing(sequencer):
        async for event in sequencer:
            ...

Cleanup is the point of the design as much as ordering. When the consumer stops early
(`aclose()`, or its task is cancelled), the source it was reading is closed with `aclose()`,
so an upstream HTTP response (an LLM token stream) is released now rather than whenever the
garbage collector finds it; sources chained but not yet started are closed as well.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import Generic, TypeVar

__all__ = ["Sequencer"]

T = TypeVar("T")

logger = logging.getLogger(__name__)


class Sequencer(Generic[T]):
    """An async iterable that yields the items of its chained sources, source after source.

    Single consumer: `__aiter__` always returns the same iterator, the way a generator is its
    own iterator, so `aclose()` on the sequencer and on that iterator are the same thing.
    Producers may call `chain()` at any time from the same event loop, until `chain(None)`
    or until the consumer has gone.
    """

    def __init__(self) -> None:
        self._pending: asyncio.Queue[AsyncIterable[T] | None] = asyncio.Queue()
        self._ended = False
        self._stopped = False
        self._iterator: AsyncGenerator[T, None] | None = None

    def chain(self, source: AsyncIterable[T] | None) -> None:
        """Queue `source` after the sources chained so far; `None` ends the sequence.

        Raises `RuntimeError` when called after `chain(None)` or once the consumer has gone: a
        source chained then would never be read, which is always a bug in the producer.
        """
        if self._ended or self._stopped:
            raise RuntimeError("Sequencer.chain() called after the sequence ended")
        if source is None:
            self._ended = True
        self._pending.put_nowait(source)

    def __aiter__(self) -> AsyncIterator[T]:
        if self._iterator is None:
            self._iterator = self._relay()
        return self._iterator

    async def aclose(self) -> None:
        """Stop the sequence: close the source being read and every source still queued.

        Call it from the consumer's side (or cancel the consumer's task); like any async
        generator, the sequence cannot be closed while another task is inside `__anext__`.
        """
        self._stopped = True
        if self._iterator is not None:
            await self._iterator.aclose()
        # The relay's own cleanup covers this when it ran; when it never started, only this does.
        await self._close_pending()

    async def _relay(self) -> AsyncGenerator[T, None]:
        active: AsyncIterator[T] | None = None
        try:
            while True:
                source = await self._pending.get()
                if source is None:
                    return
                active = aiter(source)
                async for item in active:
                    yield item
                active = None
        finally:
            self._stopped = True
            if active is not None:
                # Reached on aclose(), cancellation or an error from the source; for an
                # exhausted or failed generator aclose() is a no-op, so always calling it is safe.
                await _close_quietly(active)
            await self._close_pending()

    async def _close_pending(self) -> None:
        while not self._pending.empty():
            source = self._pending.get_nowait()
            if source is not None:
                await _close_quietly(source)


async def _close_quietly(source: object) -> None:
    """Best-effort `aclose()`: a failing cleanup must not hide the error that led to it."""
    close = getattr(source, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except Exception:
        logger.warning("closing a chained source failed", exc_info=True)
