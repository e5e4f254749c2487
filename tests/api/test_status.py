"""`GET /v1/status` (api/status.py) over real HTTP: what the workers run, whether the
upstream and the tools' services answer, Redis and the workers, at a bounded cost."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest

from api.status import STATUS_CACHE_S, StatusCache, reaches
from launcher.redis_server import free_port
from shared.status import StatusReport, WorkersStatus
from tests.fakes.searxng import FakeSearxng
from tests.support.processes import wait_for
from tests.support.session_redis import session_redis_url
from tests.support.stack import make_config, make_settings, run_api, run_stack, run_worker
from tests.support.upstream import ScriptedUpstream
from tests.support.users import ALICE

KEYS = "key-alice:alice"


async def status_of(client: httpx.AsyncClient, base_url: str) -> dict[str, Any]:
    response = await client.get(f"{base_url}/v1/status", headers=ALICE)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_status_says_what_the_workers_run_and_that_it_all_answers(
    upstream: ScriptedUpstream,
) -> None:
    async with FakeSearxng() as searxng:
        config = make_config(upstream, api_keys=KEYS, searxng_url=searxng.base_url)
        async with config.stack() as stack:

            async def reported_in() -> bool:
                body = await status_of(stack.client, stack.base_url)
                return body["workers"]["alive"] == 1

            # polled as a client would, twice a second: a tighter loop would spend the user's
            # request rate (shared/rate_limit.py) on a slow box before the worker reports in
            await wait_for(reported_in, 20 + STATUS_CACHE_S, interval_s=0.5)
            body = await status_of(stack.client, stack.base_url)

    assert body["object"] == "bernard.status"
    assert body["version"] == "0.1.0" and body["workers_version"] == "0.1.0"
    answered = {"reachable": True, "status": 200, "detail": "HTTP 200"}
    assert body["models"] == [
        {
            "role": "router",
            "provider": "openai",
            "model": "router-model",
            "base_url": upstream.base_url,
            "demo": False,
            "probe": answered,
        },
        {
            "role": "response",
            "provider": "openai",
            "model": "response-model",
            "base_url": upstream.base_url,
            "demo": False,
            "probe": answered,
        },
    ]
    tools = {tool["name"]: tool for tool in body["tools"]}
    assert tools["calculator"] == {
        "name": "calculator",
        "requires_confirmation": False,
        "services": [],
    }
    assert tools["save_note"]["requires_confirmation"] is True
    (search,) = tools["web_search"]["services"]
    assert (search["variable"], search["url"]) == ("BERNARD_SEARXNG_URL", searxng.base_url)
    assert search["probe"]["reachable"] is True
    assert body["mcp_servers"] == []
    (redis,) = body["redis"]
    assert (redis["roles"], redis["kind"], redis["error"]) == (["data", "queue"], "single", None)
    assert redis["url"] == session_redis_url()
    (server,) = redis["servers"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", server["version"])
    assert (server["role"], server["maxmemory_policy"]) == ("master", "noeviction")
    assert body["workers"] == {"alive": 1, "fresh_within_s": 15}


async def test_status_reports_the_workers_models_not_the_apis_own_settings(
    upstream: ScriptedUpstream,
) -> None:
    """An API started without the upstream's settings (a second terminal, say) still says
    what the workers use."""
    workers = make_settings(upstream, api_keys=KEYS)
    api = make_settings(None, api_keys=KEYS, queue_name=workers.queue_name)
    assert api.demo_mode
    async with (
        run_worker(workers),
        run_api(api) as base_url,
        httpx.AsyncClient(timeout=30) as client,
    ):
        body = await status_of(client, base_url)

    assert [(m["model"], m["demo"], m["base_url"]) for m in body["models"]] == [
        ("router-model", False, upstream.base_url),
        ("response-model", False, upstream.base_url),
    ]
    assert body["models"][0]["probe"]["reachable"] is True


async def test_on_the_demo_model_status_says_so_and_probes_nothing() -> None:
    settings = make_settings(None, api_keys=KEYS)
    async with run_stack(settings) as stack:
        body = await status_of(stack.client, stack.base_url)

    assert [
        (m["role"], m["provider"], m["model"], m["demo"], m["probe"]) for m in body["models"]
    ] == [
        ("router", "demo", "bernard-demo", True, None),
        ("response", "demo", "bernard-demo", True, None),
    ]


async def test_an_upstream_and_a_service_that_do_not_answer_are_named() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    config = make_config(
        None, api_keys=KEYS, searxng_url=dead, openai_base_url=f"{dead}/v1", openai_api_key="k"
    )
    async with config.stack() as stack:
        body = await status_of(stack.client, stack.base_url)

    model = body["models"][0]
    assert (model["base_url"], model["probe"]["reachable"]) == (f"{dead}/v1", False)
    assert model["probe"]["detail"].startswith("no answer: ")
    search = next(tool for tool in body["tools"] if tool["name"] == "web_search")
    assert search["services"][0]["probe"]["reachable"] is False


async def test_status_needs_a_key(upstream: ScriptedUpstream) -> None:
    async with run_stack(make_settings(upstream, api_keys=KEYS)) as stack:
        response = await stack.client.get("/v1/status")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


async def test_status_is_built_once_for_every_request_within_its_few_seconds(
    upstream: ScriptedUpstream,
) -> None:
    async with run_stack(make_settings(upstream, api_keys=KEYS)) as stack:
        bodies = await asyncio.gather(*(status_of(stack.client, stack.base_url) for _ in range(20)))
        again = await status_of(stack.client, stack.base_url)

    assert len({body["checked_at"] for body in [*bodies, again]}) == 1


def a_status(n: int) -> StatusReport:
    return StatusReport(
        version="x",
        checked_at=float(n),
        published_at=None,
        workers_version=None,
        models=[],
        tools=[],
        mcp_servers=[],
        redis=[],
        workers=WorkersStatus(alive=n, fresh_within_s=15),
    )


async def test_the_cache_shares_one_build_and_builds_again_once_stale() -> None:
    cache = StatusCache(ttl_s=0.2)
    gate = asyncio.Event()

    async def build() -> StatusReport:
        await gate.wait()
        return a_status(cache.builds)

    waiting = [asyncio.create_task(cache.get(build)) for _ in range(5)]
    await asyncio.sleep(0.05)
    waiting[0].cancel()  # a client that leaves does not cancel the others' build
    gate.set()
    got = await asyncio.gather(*waiting[1:])
    assert {status.checked_at for status in got} == {1.0}
    assert (await cache.get(build)).checked_at == 1.0
    await asyncio.sleep(0.25)
    assert (await cache.get(build)).checked_at == 2.0
    assert cache.builds == 2


@pytest.mark.parametrize(
    ("tool", "published_for", "uses"),
    [
        ("web_search", "web_search", True),
        ("wikipedia", "web_search", False),
        ("ha_call_service", "ha_*", True),
        ("weather", "ha_*", False),
        ("plex_play", "plex_*", True),
    ],
)
def test_which_published_service_a_tool_uses(tool: str, published_for: str, uses: bool) -> None:
    assert reaches(tool, published_for) is uses
