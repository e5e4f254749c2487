"""A turn's events drawn as they arrive: settled pieces printed once into the scrollback,
the rest redrawn at the bottom of the terminal (cli/view.py says which is which).

The stream is read on a thread of its own; this thread alone draws. Ctrl-C during a turn
does not raise through the drawing: it sets a flag (`ctrl_c_sets`). With a `stop` (the
chat's: cli/chat.py), the first Ctrl-C asks for the turn to stop, on a thread of its own,
and the drawing goes on to the turn's end, which follows at once: everything the turn said
before it stopped is drawn, and if it had already ended, all of it. A second Ctrl-C, or
the first without a `stop`, stops the drawing at the next event or poll: the redrawn
region is erased, what it showed is printed once, as it stood, and the stream is aborted
(`TurnStream.abort`).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.segment import Segment
from rich.text import Text

from cli.client import TurnStream
from cli.frames import TurnEvent
from cli.view import TurnView, ending_line, render, render_live

REFRESH_PER_SECOND = 10
# How often the drawing looks for a Ctrl-C while no event arrives.
POLL_S = 0.05
# How long the end of a turn waits for the request that stopped it to be answered.
STOP_WAIT_S = 10.0
# Rows the redrawn region leaves free: it never fills the screen, so it never scrolls (a
# row scrolled away can no longer be erased) and the line above it stays in view.
FREE_ROWS = 2


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


@contextlib.contextmanager
def ctrl_c_sets(flag: threading.Event) -> Iterator[None]:
    """Within: Ctrl-C (SIGINT) sets `flag` instead of raising KeyboardInterrupt wherever
    the main thread happens to be (half-way through writing a redraw, say). Off the main
    thread, where no handler can be set, Ctrl-C raises as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        flag.set()

    saved = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)


class Tail:
    """The last rows of a renderable, at most the screen's height less `FREE_ROWS`: the
    paragraph being written shows its newest lines, and the region never scrolls."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        rows = max(1, options.size.height - FREE_ROWS)
        lines = console.render_lines(self.renderable, options.update(height=None), pad=False)
        if len(lines) > rows:
            lines = [[Segment("…", console.get_style("dim"))], *lines[len(lines) - rows + 1 :]]
        for line in lines:
            yield from line
            yield Segment.line()


@dataclass(frozen=True, slots=True)
class _Notice:
    """A line about the connection, or None once it is back."""

    text: str | None


@dataclass(frozen=True, slots=True)
class _End:
    """The reader is done: the events ran out, or `error` ended them."""

    error: BaseException | None = None


_Item = TurnEvent | _Notice | _End


def _read(events: Iterator[TurnEvent], inbox: queue.Queue[_Item]) -> None:
    try:
        for event in events:
            inbox.put(event)
    except BaseException as exc:  # handed to the drawing thread, which raises it
        inbox.put(_End(exc))
    else:
        inbox.put(_End())


def watch(
    console: Console,
    stream: TurnStream,
    events: Iterator[TurnEvent],
    view: TurnView,
    stop: Callable[[str], None] | None = None,
) -> bool:
    """Draw `events` (of `stream`) into `view` until the turn's `done`; False if the user
    pressed Ctrl-C first (twice, with `stop`, which the first calls with the turn's id),
    the stream then aborted. Errors of the stream (cli/client.py `ApiCallError`) propagate
    once what was drawn is printed."""
    inbox: queue.Queue[_Item] = queue.Queue()
    stream.on_retry = lambda attempt, reason: inbox.put(
        _Notice(f"connection lost ({reason}); reconnecting (try {attempt})…")
    )
    stream.on_resumed = lambda: inbox.put(_Notice(None))
    reader = threading.Thread(target=_read, args=(events, inbox), name="turn-reader", daemon=True)
    interrupted = threading.Event()
    # Transient: the redrawn region is erased at the end; everything that stays on screen
    # was printed by `settle` (or below, as it stood), once.
    live = Live(
        console=console,
        refresh_per_second=REFRESH_PER_SECOND,
        transient=True,
        vertical_overflow="visible",  # `Tail` keeps it within the screen
    )
    ended: _End | None = None
    stopping: threading.Thread | None = None
    with ctrl_c_sets(interrupted), no_echo(), live:
        reader.start()
        while ended is None:
            if interrupted.is_set():
                turn_id = view.turn_id or stream.turn_id
                if stop is None or stopping is not None or turn_id is None:
                    break
                # Asked at once, off this thread: the drawing goes on to the turn's end.
                interrupted.clear()
                stopping = threading.Thread(
                    target=stop, args=(turn_id,), name="turn-stop", daemon=True
                )
                stopping.start()
            try:
                item = inbox.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if isinstance(item, _End):
                ended = item
            elif isinstance(item, _Notice):
                view.notice = item.text
                live.update(Tail(render_live(view)), refresh=True)
            else:
                view.apply(item)
                view.turn_id = view.turn_id or stream.turn_id
                for piece in view.settle():
                    live.console.print(render(piece))
                live.update(Tail(render_live(view)))
        view.notice = None
        live.update(Text(""), refresh=True)
    finished = ended is not None and ended.error is None
    if not finished:
        stream.abort()
    reader.join(timeout=1.0)
    if stopping is not None:
        stopping.join(timeout=STOP_WAIT_S)
    if not reader.is_alive():
        close = getattr(events, "close", None)
        if close is not None:
            close()  # the connection, when the turn's end was not read
    # What was still being drawn stays on screen too when the turn did not get to its
    # end here (Ctrl-C, an error): printed as it stood.
    view.turn_id = view.turn_id or stream.turn_id
    for piece in view.settle() if finished else view.live():
        console.print(render(piece))
    if ended is not None and ended.error is not None:
        raise ended.error
    return finished


def print_ending(console: Console, view: TurnView) -> None:
    line = ending_line(view)
    if line is not None:
        console.print(line)
