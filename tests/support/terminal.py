"""A real terminal for tests: a command run in a private tmux server, read as a person sees it.

`Terminal` starts its own tmux server (its own socket, no user configuration), runs one
command in a pane of a fixed size, types into it (`send-keys`) and reads the screen with
its scrollback (`capture-pane`), after tmux's own terminal emulator has applied every
cursor move and erase the program made: what a test reads is what a person would see. The
command runs under `sh`, which prints `[exited N]` when it ends and keeps the pane open.

Every wait polls without blocking the event loop: the API and the scripted upstream the
command talks to may run in the test's own loop. `close()` kills this server only.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_CONFIG = "set -g history-limit 50000\nset -g status off\n"
_EXITED = re.compile(r"\[exited (\d+)\]")
# A terminal's size given in the environment, which programs prefer to asking the terminal.
_SIZE = ("COLUMNS", "LINES")


# The tmux servers still running, killed at interpreter exit should a test's cleanup not run.
_LIVE: set[str] = set()


@atexit.register
def _kill_leftovers() -> None:
    for socket in list(_LIVE):
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


def has_tmux() -> bool:
    return shutil.which("tmux") is not None


class Terminal:
    """One command in a `width` x `height` terminal."""

    def __init__(self, workdir: Path, *, width: int = 160, height: int = 48) -> None:
        self.socket = f"bernard-test-{uuid.uuid4().hex[:10]}"
        self.config = workdir / f"{self.socket}.conf"
        self.width, self.height = width, height
        self.started = False

    async def _tmux(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        proc = await asyncio.create_subprocess_exec(
            "tmux",
            "-u",  # UTF-8 whatever the locale says: rich draws boxes and quotes
            "-L",
            self.socket,
            "-f",
            str(self.config),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {err.decode().strip()}")
        return out.decode()

    async def start(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None
    ) -> None:
        """Run `argv` with `env` (the tmux server starts with it), in `cwd`.

        Without `COLUMNS` and `LINES`: the pane's size is the terminal's. A pytest-xdist
        worker inherits them from its controller (80 x 24: GNU readline, imported there,
        exports the size it found), and rich would draw to them instead of the pane.
        """
        env = {name: value for name, value in env.items() if name not in _SIZE}
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(_CONFIG)
        # The shell outlives a Ctrl-C meant for the command (a trap, unlike an ignored
        # signal, is not inherited), so the pane and its exit line stay.
        command = f'trap : INT; {shlex.join(argv)}; echo "[exited $?]"; exec sleep 3600'
        await self._tmux(
            "new-session",
            "-d",
            "-s",
            "main",
            "-c",
            str(cwd or Path.cwd()),
            "-x",
            str(self.width),
            "-y",
            str(self.height),
            "sh",
            "-c",
            command,
            env=env,
        )
        self.started = True
        _LIVE.add(self.socket)

    async def type(self, text: str, *, enter: bool = True) -> None:
        """Type `text` literally, then Enter."""
        await self._tmux("send-keys", "-t", "main", "-l", text)
        if enter:
            await self._tmux("send-keys", "-t", "main", "Enter")

    async def paste(self, text: str) -> None:
        """Paste `text` as a terminal does: wrapped in bracketed-paste markers when the
        program asked for them (prompt_toolkit does), so its newlines are not Enter."""
        await self._tmux("set-buffer", "-b", "paste", text)
        await self._tmux("paste-buffer", "-p", "-d", "-b", "paste", "-t", "main")

    async def press(self, *keys: str) -> None:
        """Press keys by tmux's names: `C-c`, `C-d`, `Enter`."""
        await self._tmux("send-keys", "-t", "main", *keys)

    async def screen(self) -> str:
        """The scrollback and the screen, wrapped lines joined, trailing blanks dropped."""
        text = await self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "main")
        return "\n".join(line.rstrip() for line in text.rstrip().splitlines())

    async def wait_for(
        self, condition: str | Callable[[str], bool], timeout_s: float = 20.0
    ) -> str:
        """The screen once it holds `condition` (a text, or a test on the screen)."""
        test = (lambda screen: condition in screen) if isinstance(condition, str) else condition
        screen = ""
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    screen = await self.screen()
                    if test(screen):
                        return screen
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(
                f"the terminal never showed {condition!r}; it shows:\n{screen}"
            ) from None

    async def exit_code(self, timeout_s: float = 20.0) -> int:
        """The command's exit code, once it has ended."""
        screen = await self.wait_for(lambda s: _EXITED.search(s) is not None, timeout_s)
        match = _EXITED.search(screen)
        assert match is not None
        return int(match[1])

    async def close(self) -> None:
        if self.started:
            self.started = False
            _LIVE.discard(self.socket)
            with contextlib.suppress(RuntimeError):  # already gone
                await self._tmux("kill-server")
