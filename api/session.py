"""A client's session on one Redis stream (a turn's, or a user's own): the one loop that
reads a stream for a client, whatever the route.

The SSE relay (api/relay.py: a turn's stream, the user's event stream), a client waiting
without a stream for a turn's answer (`read_to_done`) and a cancel waiting for the turn to
end (`wait_for_done`) all read through `StreamSession.watch`, which owns what they share:
entries come in batches (every entry the hub holds for the reader by the time it asks, up
to the first `done`, after which nothing is read); a quiet `wait_s` is `QUIET`, unless the
stream's turn is gone (`alive`), which no `done` can ever follow; Redis refusing the read
is the end too, and so is a hole: entries trimmed from the stream (MAXLEN) before this
reader read them (api/hub.py `StreamTrimmedError`). Those endings are `Broken`, which the
caller turns into the turn's terminal frames (shared/endings.py) or answer. `renew` keeps
the client's stream slot (api/attachments.py) while the session lasts.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from enum import Enum

from api.attachments import RENEW_S
from api.hub import Hub, StreamReadError, StreamTrimmedError
from shared.events import Done, Event
from shared.lifecycle import Cause, done_for
from shared.streams import Entry

# Whether the stream's turn record still exists (see `StreamSession`).
Alive = Callable[[], Awaitable[bool]]
# Called every `RENEW_S` while the session lasts (api/attachments.py).
Renew = Callable[[], Awaitable[None]]


class Quiet(Enum):
    """Nothing arrived for a `wait_s` (and the turn, if asked, is still there)."""

    QUIET = "quiet"


QUIET = Quiet.QUIET


@dataclass(frozen=True, slots=True)
class Broken:
    """The stream cannot go on: its turn's record is gone (`RECORD_GONE`: `turn_lost`),
    Redis refuses to read it (`UNREADABLE`: `stream_unreadable`), or entries this reader
    had not read yet were trimmed from it (`TRIMMED`: `stream_trimmed`)."""

    cause: Cause


# What a session sees next: entries, a quiet while, or its end without a `done`.
Seen = list[Entry] | Quiet | Broken


@dataclass(slots=True)
class StreamSession:
    """One client's reading of the stream `stream_id` through the process's hub."""

    hub: Hub
    stream_id: str
    wait_s: float
    # Asked after every quiet `wait_s`; False ends the session `turn_lost`.
    alive: Alive | None = None
    renew: Renew | None = None

    async def watch(self, after: str = "0-0", *, whole: bool = True) -> AsyncGenerator[Seen, None]:
        """What the stream holds strictly after `after`, as it lands; ends after the batch
        holding the first `done`, or after a `Broken`. `whole=False`: only what is left is
        wanted (a wait for the `done`), so a hole is no end (api/hub.py `Reader`)."""
        renewed = time.monotonic()
        async with self.hub.read(self.stream_id, after, whole=whole) as reader:
            while True:
                if self.renew is not None and time.monotonic() - renewed > RENEW_S:
                    renewed = time.monotonic()
                    await self.renew()
                try:
                    first = await reader.next(wait_s=self.wait_s)
                except TimeoutError:
                    if self.alive is not None and not await self.alive():
                        yield Broken(Cause.RECORD_GONE)
                        return
                    yield QUIET
                    continue
                except StreamTrimmedError:
                    yield Broken(Cause.TRIMMED)
                    return
                except StreamReadError:
                    yield Broken(Cause.UNREADABLE)
                    return
                batch = [first]
                if not isinstance(first[1].event, Done):
                    for entry in reader.ready():
                        batch.append(entry)
                        if isinstance(entry[1].event, Done):
                            break
                yield batch
                if isinstance(batch[-1][1].event, Done):
                    return

    async def read_to_done(self, keep: tuple[type[Event], ...] = ()) -> tuple[list[Event], Done]:
        """The events of the stream of the types in `keep`, and its `done` (`turn_lost`,
        `stream_unreadable` or `stream_trimmed` if it ends without one, as a relay does).
        Only those are kept, not every token of a long turn: without any to keep, a hole
        loses nothing of the answer (built from its `done` and the turn's record)."""
        kept: list[Event] = []
        async with aclosing(self.watch(whole=bool(keep))) as seen:
            async for batch in seen:
                if isinstance(batch, Broken):
                    return kept, done_for(batch.cause)
                if batch is QUIET:
                    continue
                for _, stamped in batch:
                    if isinstance(stamped.event, Done):
                        return kept, stamped.event
                    if isinstance(stamped.event, keep):
                        kept.append(stamped.event)
        raise AssertionError("a watch ends with a done or a Broken")  # pragma: no cover

    async def wait_for_done(self) -> bool:
        """Whether the stream reaches its `done` before a quiet `wait_s` (or its end). What
        came before the `done` is not wanted: a hole does not end the wait."""
        async with aclosing(self.watch(whole=False)) as seen:
            async for batch in seen:
                if not isinstance(batch, list):
                    return False
                if isinstance(batch[-1][1].event, Done):
                    return True
        return False
