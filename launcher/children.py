"""Child processes that live and die together.

The launcher's children (Redis, the worker, the API) each get their own session, so a
terminal's Ctrl-C reaches only the launcher. It forwards the signal to the children,
newest first, so the API and the worker stop while their Redis is still there. A second
Ctrl-C stops waiting and kills them all.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from rich.console import Console


def stop_process(
    proc: subprocess.Popen[bytes], signum: int = signal.SIGTERM, timeout_s: float = 10.0
) -> None:
    """Send `signum`, wait up to `timeout_s`, then kill. A no-op once `proc` has exited."""
    if proc.poll() is not None:
        return
    proc.send_signal(signum)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Supervisor:
    """Named child processes, stopped together, newest first."""

    def __init__(self) -> None:
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stop_requested: int | None = None

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.children[name] = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True
        )

    def adopt(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        self.children[name] = proc

    def exited(self) -> tuple[str, int] | None:
        """The first child that has exited, with its exit code, if any."""
        for name, proc in self.children.items():
            code = proc.poll()
            if code is not None:
                return name, code
        return None

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
        for proc in reversed(self.children.values()):
            stop_process(proc, signum, timeout_s)

    def kill(self) -> None:
        for proc in self.children.values():
            if proc.poll() is None:
                proc.kill()

    def handle_signals(self) -> None:
        """Turn SIGINT and SIGTERM into a stop request; a second one kills at once."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if self.stop_requested is not None:
                self.kill()
            self.stop_requested = signum

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    def watch(
        self,
        console: Console,
        ready: Callable[[], bool],
        on_ready: Callable[[], None],
        ready_timeout_s: float = 90.0,
        poll_s: float = 0.2,
    ) -> int:
        """Run until a stop request or a child's exit; stops everything, returns the exit code.

        `ready` is polled until it returns True (then `on_ready` runs once); if it has not
        within `ready_timeout_s`, everything stops with exit code 1.
        """
        code = self._watch(console, ready, on_ready, ready_timeout_s, poll_s)
        console.print("Stopping…")
        self.stop(self.stop_requested or signal.SIGTERM)
        return code

    def _watch(
        self,
        console: Console,
        ready: Callable[[], bool],
        on_ready: Callable[[], None],
        ready_timeout_s: float,
        poll_s: float,
    ) -> int:
        deadline = time.monotonic() + ready_timeout_s
        is_ready = False
        while self.stop_requested is None:
            exited = self.exited()
            if exited:
                name, code = exited
                console.print(f"[red]{name} exited with code {code}[/]; stopping everything.")
                return code if code > 0 else 1
            if not is_ready:
                if ready():
                    is_ready = True
                    on_ready()
                elif time.monotonic() > deadline:
                    console.print(f"[red]not ready after {ready_timeout_s:.0f} s[/]; stopping.")
                    return 1
            time.sleep(poll_s)
        return 0
