"""Running the Node clients' scripts (tests/js/*.mjs) against a stack, for
tests/test_node_clients.py and tests/test_node_responses.py.

A script takes Bernard's /v1 URL and a key, runs one unmodified client (the `openai` SDK for
Node, the AI SDK) and reports what the client gave it as JSON lines (tests/js/args.mjs); it
runs in a child process, so the loop the API, the worker and the scripted upstream share
stays free, and a test can read its lines as they come. The clients are installed by
`bash tests/js/setup` (.ci/run does it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack import Stack

JS = Path(__file__).resolve().parents[1] / "js"
SETUP = "tests/js/setup"


def clients_problem() -> str | None:
    """Why the Node clients cannot run here (a skip reason), or None."""
    if shutil.which("node") is None:
        return f"node is not on PATH: apt-get install nodejs npm, then bash {SETUP}"
    stamp = JS / "node_modules" / ".bernard-lock.sha256"
    if not stamp.exists():
        return f"the Node clients are not installed in {JS / 'node_modules'}: run bash {SETUP}"
    pins = (JS / "package.json").read_bytes() + (JS / "package-lock.json").read_bytes()
    if stamp.read_text().strip() != hashlib.sha256(pins).hexdigest():
        return f"the Node clients in {JS / 'node_modules'} are out of date: run bash {SETUP}"
    return None


def require_node_clients() -> None:
    """Skips the test where the clients are not installed, naming the setup; fails it under
    CI, whose .ci/run installs them first."""
    problem = clients_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{problem} (.ci/run runs it before the tests)")
        pytest.skip(problem)


@dataclass
class NodeRun:
    """What one script reported: its exit code, its JSON lines, its stderr."""

    code: int
    lines: list[dict[str, Any]]
    stderr: str

    def of(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["event"] == event]

    @property
    def final(self) -> dict[str, Any]:
        (final,) = self.of("final")
        return final

    @property
    def text(self) -> str:
        """The text deltas, concatenated in the order they came."""
        return "".join(line["text"] for line in self.of("delta"))


class NodeScript:
    """One script running against a stack: read its lines as they come (`line`), or wait
    for all of them (`finish`)."""

    def __init__(self, script: str, proc: asyncio.subprocess.Process) -> None:
        self.script = script
        self.proc = proc
        self.lines: list[dict[str, Any]] = []

    async def line(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """The next line it reports (waits for it)."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout_s):
            raw = await self.proc.stdout.readline()
        assert raw, f"{self.script} ended without another line; it reported {self.lines}"
        return self._parse(raw)

    async def finish(self, timeout_s: float = 60.0) -> NodeRun:
        """Everything else it reports, once it has exited."""
        try:
            async with asyncio.timeout(timeout_s):
                out, err = await self.proc.communicate()
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
        for raw in out.splitlines():
            if raw.strip():
                self._parse(raw)
        assert self.proc.returncode is not None
        return NodeRun(self.proc.returncode, self.lines, err.decode(errors="replace"))

    def _parse(self, raw: bytes) -> dict[str, Any]:
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"{self.script} printed a line that is not JSON: {raw!r}") from exc
        self.lines.append(line)
        return dict(line)


@contextlib.asynccontextmanager
async def started(
    script: str, stack: Stack, *args: str, key: str = "anything"
) -> AsyncIterator[NodeScript]:
    """Starts tests/js/<script> against `stack` (its /v1 URL and `key`) in a child process,
    which leaves the loop the API, the worker and the scripted upstream run in free; killed
    on the way out if still running."""
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(JS / script),
        "--base-url",
        f"{stack.base_url}/v1",
        "--key",
        key,
        *args,
        cwd=JS,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield NodeScript(script, proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def node(script: str, stack: Stack, *args: str, key: str = "anything") -> NodeRun:
    """Runs tests/js/<script> against `stack` to its end."""
    async with started(script, stack, *args, key=key) as running:
        return await running.finish()
