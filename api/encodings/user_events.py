"""The user's own event stream (`GET /v1/events`, api/routes/events.py): each event as a
named SSE event of its type (`timer_fired`, ...) with its fields as the data. Not a turn's
encoding (no turn, no answer), so not in the registry: only what the relay needs."""

from __future__ import annotations

from dataclasses import asdict

from api.encoding import Frame, named
from shared.events import Done, Event


class UserEventsEncoder:
    """Frames of the user's event stream (api/encoding.py `Framing`)."""

    def frames(self, event: Event) -> list[Frame]:
        if isinstance(event, Done):
            # The stream has no end of its own: the `done` of a stream that cannot go on
            # (api/relay.py `ending_frames`) follows its `error`, which says it all.
            return []
        return [named(event.type, asdict(event))]

    def keepalive(self) -> None:
        """No keepalive event: the relay sends a `: ping` comment."""
        return None
