"""A turn's events drawn as they arrive: settled pieces printed once into the scrollback,
the rest redrawn at the bottom of the terminal (cli/view.py says which is which)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.live import Live
from rich.text import Text

from cli.client import TurnStream
from cli.frames import TurnEvent
from cli.view import TurnView, ending_line, render, render_live

REFRESH_PER_SECOND = 10


@contextlib.contextmanager
def no_echo() -> Iterator[None]:
    """The terminal does not echo keys while the turn is drawn: a key (or the `^C` of a
    Ctrl-C) echoed at the end of a full-width line would move the cursor below the region
    being redrawn, and the redraw would land one line off. Ctrl-C still interrupts."""
    try:
        import termios
    except ImportError:  # not a Unix terminal
        yield
        return
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0 or not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    quiet = termios.tcgetattr(fd)
    quiet[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def watch(
    console: Console, stream: TurnStream, events: Iterator[TurnEvent], view: TurnView
) -> bool:
    """Draw `events` into `view` until the turn's `done`; False if the user pressed Ctrl-C
    first. Errors of the stream (cli/client.py `ApiError`) propagate."""

    def retrying(attempt: int, reason: str) -> None:
        view.notice = f"connection lost ({reason}); reconnecting (try {attempt})…"
        live.update(render_live(view), refresh=True)

    def resumed() -> None:
        view.notice = None
        live.update(render_live(view), refresh=True)

    stream.on_retry, stream.on_resumed = retrying, resumed
    # Transient: the redrawn region is erased at the end; everything that stays on screen
    # was printed by `settle`, once.
    live = Live(
        console=console,
        refresh_per_second=REFRESH_PER_SECOND,
        transient=True,
        vertical_overflow="ellipsis",
    )
    finished = False
    try:
        with no_echo(), live:
            try:
                for event in events:
                    view.apply(event)
                    view.turn_id = view.turn_id or stream.turn_id
                    for piece in view.settle():
                        live.console.print(render(piece))
                    live.update(render_live(view))
                finished = True
            except KeyboardInterrupt:
                pass
            finally:
                view.notice = None
                live.update(Text(""), refresh=True)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()  # the connection, when the turn's end was not read
        # What was still being drawn stays on screen too when the turn did not get to
        # its end here (Ctrl-C, an error): printed as it stood.
        view.turn_id = view.turn_id or stream.turn_id
        for piece in view.settle() if finished else view.live():
            console.print(render(piece))
    return finished


def print_ending(console: Console, view: TurnView) -> None:
    line = ending_line(view)
    if line is not None:
        console.print(line)
