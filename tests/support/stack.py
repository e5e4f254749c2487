"""Bernard end to end for one test: its settings, and its API and worker running.

`run_stack` runs the FastAPI app on a loopback port and a `WakeWorker` in the test's event
loop, both against the session's Redis, with the worker's `ChatOpenAI` pointed at a
scripted upstream (tests/support/upstream.py) over real HTTP. Each test gets its own queue
name (`make_settings`), so jobs of one test never reach another's worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import redis.asyncio as redis_asyncio
from langchain_core.tools import BaseTool
from langchain_openai import ChatOpenAI

from api.main import create_app
from shared import keys
from shared.connection import connect_data
from shared.settings import Settings
from tests.support.chat import body as chat_body
from tests.support.serving import serve
from tests.support.session_redis import session_redis_url
from tests.support.sse import Frame, collect
from tests.support.upstream import ScriptedUpstream
from worker.main import worker_options
from worker.queue import WakeWorker
from worker.tools.settings import ToolSettings
from worker.tools.sources import SOURCES, read_tool_settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def make_settings(upstream: ScriptedUpstream | None = None, **overrides: Any) -> Settings:
    """Settings for one test: its own queue, the scripted upstream, no retries upstream."""
    values: dict[str, Any] = {
        "redis_url": session_redis_url(),
        "queue_name": f"bernard:test:{uuid.uuid4().hex[:8]}",
        "llm_max_retries": 0,
        "llm_timeout_s": 10.0,
        "disconnect_grace_s": 0.0,
        "router_model": "router-model",
        "response_model": "response-model",
        # A conversation's title is one more router call, in the background: tests that
        # count or script the upstream's calls would meet it at random. Title tests turn it
        # on (tests/test_titles.py).
        "conversation_titles": False,
        # No policy rules: each tool as it declares itself (a write asks). The tests of the
        # policy set theirs, or None for the household default (tests/test_policy.py).
        "policy_file": str(FIXTURES / "policy" / "declared.toml"),
    }
    if upstream is not None:
        values["openai_base_url"] = upstream.base_url
        values["openai_api_key"] = "test-key"
    # `Settings` ignores a name it does not have (an operator's `.env` holds others): here
    # one is a mistake, a tool source's setting given to the wrong class (make_tool_settings).
    unknown = set(overrides) - set(Settings.model_fields)
    assert not unknown, f"not fields of Settings: {sorted(unknown)}"
    values.update(overrides)
    return Settings(**values)


@dataclass(frozen=True)
class Config:
    """A test's settings and its tool sources' (worker/tools/settings.py), from one set of
    values: a test of a tool sets the service's URL and the timeout alike."""

    settings: Settings
    tools: ToolSettings

    def stack(self, **options: Any) -> contextlib.AbstractAsyncContextManager[Stack]:
        """`run_stack` on these settings and these tool settings."""
        return run_stack(self.settings, tool_settings=self.tools, **options)


def make_config(upstream: ScriptedUpstream | None = None, **overrides: Any) -> Config:
    """`make_settings` and `make_tool_settings`, each given the fields it declares."""
    declared = {name for source in SOURCES for name in source.settings.model_fields}
    tools = {name: value for name, value in overrides.items() if name in declared}
    rest = {name: value for name, value in overrides.items() if name not in declared}
    return Config(make_settings(upstream, **rest), make_tool_settings(**tools))


def make_tool_settings(**overrides: Any) -> ToolSettings:
    """Each tool source's settings for one test (worker/tools/sources.py
    `read_tool_settings`): `overrides` by field name, whichever source declares it."""
    values: dict[str, Any] = {
        # Tools whose service has a public default stay off: tests never reach the internet.
        "wikipedia_url": "",
        "open_meteo_url": "",
        "open_meteo_geocoding_url": "",
    }
    values.update(overrides)
    return read_tool_settings(**values)


@dataclass
class Stack:
    """A running API and worker; `client` talks to the API over real HTTP."""

    settings: Settings
    base_url: str
    client: httpx.AsyncClient
    redis: redis_asyncio.Redis

    async def chat(self, content: str = "hello", **body: Any) -> httpx.Response:
        return await self.client.post("/v1/chat/completions", json=chat_body(content, **body))

    def openai(self, key: str = "anything") -> openai.AsyncOpenAI:
        """The official `openai` SDK pointed at this stack's API, never retrying."""
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=key, max_retries=0)

    def langchain(self, **options: Any) -> ChatOpenAI:
        """LangChain's `ChatOpenAI` pointed at this stack's API, never retrying."""
        return ChatOpenAI(
            model="bernard-v1",
            base_url=f"{self.base_url}/v1",
            api_key="anything",  # type: ignore[arg-type]
            max_retries=0,
            **options,
        )

    async def background_jobs(self, owner: str) -> int:
        """The owner's background jobs queued or running, as their budget counts them."""
        return int(await self.redis.zcard(keys.background_jobs(owner)))

    async def replay(self, turn_id: str, after: str | None = None) -> list[Frame]:
        """The turn's stream read again (GET /v1/turns/{id}/events), from after `after`."""
        headers = {"Last-Event-ID": after} if after else {}
        return await collect(self.client, "GET", f"/v1/turns/{turn_id}/events", headers=headers)


@contextlib.asynccontextmanager
async def run_api(settings: Settings) -> AsyncIterator[str]:
    async with serve(create_app(settings)) as port:
        yield f"http://127.0.0.1:{port}"


def make_worker(
    settings: Settings,
    *,
    tools: Sequence[BaseTool] | None = None,
    tool_settings: ToolSettings | None = None,
    **overrides: Any,
) -> WakeWorker:
    """The `WakeWorker` `python -m worker` runs, for `settings` instead of the environment's
    (worker/main.py `startup` reads them from its `ctx`). `tools` replaces the tools the
    router may call (default: those the tool settings enable); `tool_settings` each tool
    source's settings (default: read from the environment); `overrides`, arq's options."""
    options = worker_options(settings)
    options["ctx"] = {
        "settings": settings,
        "tools": list(tools) if tools is not None else None,
        "tool_settings": tool_settings,
    }
    return WakeWorker(**{**options, **overrides})


@contextlib.asynccontextmanager
async def run_worker(
    settings: Settings,
    tools: Sequence[BaseTool] | None = None,
    tool_settings: ToolSettings | None = None,
) -> AsyncIterator[None]:
    """An in-process `WakeWorker`; `tools` replaces the default tools when given, and its
    tool sources' settings are `tool_settings` (default: `make_tool_settings()`)."""
    worker = make_worker(
        settings,
        tools=tools,
        tool_settings=tool_settings if tool_settings is not None else make_tool_settings(),
        handle_signals=False,
    )
    task = asyncio.create_task(worker.async_run())
    try:
        async with asyncio.timeout(10):
            while "supervisor" not in worker.ctx:  # started: its on_startup ran
                if task.done():
                    task.result()
                await asyncio.sleep(0.005)
    except BaseException:
        # A start that timed out would go on in the background and register a worker the
        # next tests of the session would see.
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        with contextlib.suppress(Exception):
            await worker.close()
        raise
    try:
        yield
    finally:
        if worker.tasks:
            await asyncio.wait(list(worker.tasks.values()), timeout=5)
        with contextlib.suppress(asyncio.CancelledError):
            await worker.close()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def run_stack(
    settings: Settings,
    *,
    worker: bool = True,
    tools: Sequence[BaseTool] | None = None,
    tool_settings: ToolSettings | None = None,
) -> AsyncIterator[Stack]:
    async with contextlib.AsyncExitStack() as stack:
        base_url = await stack.enter_async_context(run_api(settings))
        if worker:
            await stack.enter_async_context(run_worker(settings, tools, tool_settings))
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(30.0))
        )
        redis = connect_data(settings.redis_url)  # a Cluster's too (tests/support/topologies.py)
        stack.push_async_callback(redis.aclose)
        yield Stack(settings=settings, base_url=base_url, client=client, redis=redis)


async def wait_status(
    stack: Stack, turn_id: str, wanted: set[str], timeout_s: float = 10
) -> dict[str, Any]:
    """The turn's resource (GET /v1/turns/{id}) once its status is one of `wanted`."""
    async with asyncio.timeout(timeout_s):
        while True:
            turn = (await stack.client.get(f"/v1/turns/{turn_id}")).json()
            if turn["status"] in wanted:
                return dict(turn)
            await asyncio.sleep(0.02)
