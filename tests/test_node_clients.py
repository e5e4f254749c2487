"""Node clients pointed at Bernard over real HTTP, unmodified: the `openai` SDK for Node and
the AI SDK's OpenAI provider (`ai` + `@ai-sdk/openai`), pinned by tests/js/package-lock.json.

Each test runs one of tests/js/*.mjs with `node` against the running stack and the scripted
upstream, and asserts on what the script reports, a JSON object a line (tests/js/args.mjs).
The clients are installed by `bash tests/js/setup` (.ci/run does it); where they are not,
these tests skip naming it, and fail under CI.
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

from tests.conftest import Stack, make_settings, run_stack
from tests.upstream import Reply, ScriptedUpstream, last_user_text

JS = Path(__file__).resolve().parent / "js"
SETUP = "tests/js/setup"
KEY = "key-alice"


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


@pytest.fixture(autouse=True)
def node_clients() -> None:
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


@pytest.fixture
async def keyed(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    """A stack that wants a key: alice's is KEY."""
    async with run_stack(make_settings(upstream, api_keys=f"{KEY}:alice")) as running:
        yield running


async def test_openai_node_streams_the_scripted_answer(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    # The upstream holds after its first token: the script must have printed it by then, so
    # the answer reached the client as a stream, not in one piece at the end.
    reply = upstream.script(Reply.text(["Bonjour", " à", " tous"], usage=(4, 3), block_after=1))
    async with started("openai_chat.mjs", stack, "--stream", "--prompt", "Greet all") as script:
        assert await script.line() == {"event": "delta", "text": "Bonjour"}
        reply.release()
        run = await script.finish()
    assert run.code == 0, run
    assert run.text == "Bonjour à tous"
    assert run.final == {
        "event": "final",
        "text": "Bonjour à tous",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
    }
    assert last_user_text(upstream.requests[-1]) == "Greet all"


async def test_openai_node_non_stream_answer(stack: Stack, upstream: ScriptedUpstream) -> None:
    upstream.script(Reply.text("Plain answer.", usage=(3, 2)))
    run = await node("openai_chat.mjs", stack, "--prompt", "Answer plainly")
    assert run.code == 0, run
    final = run.final
    assert final.pop("id").startswith("chatcmpl-")
    assert final == {
        "event": "final",
        "text": "Plain answer.",
        "role": "assistant",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    assert run.of("delta") == []
    assert last_user_text(upstream.requests[-1]) == "Answer plainly"


async def test_openai_node_raises_typed_errors_from_the_envelope(
    keyed: Stack, upstream: ScriptedUpstream
) -> None:
    wrong_key = await node("openai_chat.mjs", keyed, "--stream", key="key-mallory")
    assert wrong_key.code == 1
    assert wrong_key.lines == [
        {
            "event": "error",
            "class": "AuthenticationError",
            "message": "401 invalid API key",
            "status": 401,
            "code": "invalid_api_key",
            "type": "authentication_error",
        }
    ]
    unknown_model = await node("openai_chat.mjs", keyed, "--model", "gpt-unknown", key=KEY)
    assert unknown_model.code == 1
    assert unknown_model.lines == [
        {
            "event": "error",
            "class": "NotFoundError",
            "message": "404 The model 'gpt-unknown' does not exist; use 'bernard-v1'",
            "status": 404,
            "code": "model_not_found",
            "type": "not_found_error",
            "param": "model",
        }
    ]
    assert upstream.requests == []


async def test_openai_node_raises_on_a_mid_stream_error_frame(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.error(500, "boom"))
    run = await node("openai_chat.mjs", stack, "--stream")
    # The stream had started (200) when the upstream failed: the SDK raises the error frame's
    # envelope as an APIError, with no status.
    assert run.code == 1
    assert run.lines == [
        {
            "event": "error",
            "class": "APIError",
            "message": "the upstream model failed (HTTP 500)",
            "code": "upstream_error",
            "type": "server_error",
        }
    ]


async def test_ai_sdk_chat_provider_streams_text(stack: Stack, upstream: ScriptedUpstream) -> None:
    reply = upstream.script(
        Reply.text(["Stream", "ed by", " the AI SDK"], usage=(6, 4), block_after=1)
    )
    args = ("--api", "chat", "--prompt", "Stream it")
    async with started("ai_sdk_stream.mjs", stack, *args) as script:
        assert await script.line() == {"event": "delta", "text": "Stream"}
        reply.release()
        run = await script.finish()
    assert run.code == 0, run
    assert run.text == "Streamed by the AI SDK"
    assert run.final == {
        "event": "final",
        "text": "Streamed by the AI SDK",
        "finish_reason": "stop",
        "raw_finish_reason": "stop",
        "usage": {"input_tokens": 6, "output_tokens": 4, "total_tokens": 10},
    }
    # createOpenAI(...).chat(model) speaks Chat Completions: the prompt reached the model.
    assert last_user_text(upstream.requests[-1]) == "Stream it"


async def test_ai_sdk_chat_provider_reports_a_failed_stream(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.error(500, "boom"))
    run = await node("ai_sdk_stream.mjs", stack, "--api", "chat")
    # The provider turns an error frame before any text into an APICallError (500 when the
    # envelope names no status) and streamText yields it as an error part.
    assert run.code == 1
    assert run.lines == [
        {
            "event": "error",
            "class": "APICallError",
            "message": "the upstream model failed (HTTP 500)",
            "statusCode": 500,
        }
    ]
