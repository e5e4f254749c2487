"""The worker's models: one upstream HTTP client, sized to the worker and owned by it."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from contextlib import aclosing
from typing import Any, cast

import pytest
from langchain_core.messages import HumanMessage

from launcher.redis_server import free_port
from tests.support.stack import make_settings
from tests.support.upstream import Reply, ScriptedUpstream
from worker import llm as llm_module
from worker.llm import Llm, LlmError, build_models, pool_shards


async def test_the_upstream_pool_holds_as_many_streams_as_the_worker_runs_turns(
    upstream: ScriptedUpstream,
) -> None:
    gates = [upstream.script(Reply.text(["a", "b"], block_after_first=True)) for _ in range(3)]
    models = build_models(make_settings(upstream, worker_concurrency=2))

    async def answer() -> None:
        async with aclosing(models.responder.stream([HumanMessage("hi")])) as stream:
            async for _ in stream:
                pass

    try:
        tasks = [asyncio.create_task(answer()) for _ in range(3)]
        await upstream.wait_requests(2)
        await asyncio.sleep(0.3)
        assert len(upstream.requests) == 2, "a third stream needs a connection the pool has not"
        for gate in gates:
            gate.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert len(upstream.requests) == 3
    finally:
        await models.aclose()


async def test_closing_the_models_closes_their_clients(upstream: ScriptedUpstream) -> None:
    models = build_models(make_settings(upstream, worker_concurrency=200))
    clients = models.http_clients  # both roles on one provider share its pools
    assert len(clients) == pool_shards(200) == 4
    assert models.router.model.http_async_client is clients[0]  # type: ignore[attr-defined]
    assert models.responder.model.http_async_client is clients[0]  # type: ignore[attr-defined]
    await models.aclose()
    assert all(client.is_closed for client in clients)


async def test_each_provider_gets_clients_of_its_own(upstream: ScriptedUpstream) -> None:
    settings = make_settings(
        upstream,
        anthropic_base_url=upstream.anthropic_base_url,
        anthropic_api_key="test-key",
        response_provider="anthropic",
        worker_concurrency=200,
    )
    models = build_models(settings)
    # The OpenAI router's pools, and the one Anthropic client (its calls are LangChain's).
    assert len(models.http_clients) == pool_shards(200) + 1
    await models.aclose()
    assert all(client.is_closed for client in models.http_clients)


@pytest.mark.parametrize(
    ("concurrency", "pools"),
    [(1, 1), (64, 1), (65, 2), (500, 8), (1024, 16), (100_000, 16)],
)
def test_a_worker_keeps_a_pool_for_every_64_turns_up_to_16(concurrency: int, pools: int) -> None:
    assert pool_shards(concurrency) == pools


async def test_calls_one_after_another_keep_to_one_pool_and_its_connection(
    upstream: ScriptedUpstream,
) -> None:
    """A worker with three pools and one call at a time: every call goes over the first
    pool's one kept-alive connection (taking the pools in turn, each sat idle past its
    keep-alive between a quiet household's turns, and every call opened a connection)."""
    models = build_models(make_settings(upstream, worker_concurrency=192))
    respond = {"type": "function", "function": {"name": "respond", "parameters": {}}}
    try:
        for _ in range(2 * pool_shards(192)):
            await models.router.complete([HumanMessage("hi")], [respond])
    finally:
        await models.aclose()
    peers = Counter(exchange.peer for exchange in upstream.router_exchanges)
    assert sorted(peers.values()) == [6]


def test_calls_in_flight_fill_a_pool_before_the_next_then_go_to_the_least_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(llm_module, "POOL_SHARE", 2)
    pools = ["pool 0", "pool 1", "pool 2"]
    model = Llm(cast(Any, object()), "m", direct=True, clients=pools)
    with contextlib.ExitStack() as held:
        taken = [held.enter_context(model._lease()) for _ in range(6)]
        assert taken == ["pool 0", "pool 0", "pool 1", "pool 1", "pool 2", "pool 2"]
        assert held.enter_context(model._lease()) == "pool 0"  # all full: the least busy
    # All given back: the first pool again.
    with model._lease() as client:
        assert client == "pool 0"


async def test_a_cut_answer_reports_the_length_finish(upstream: ScriptedUpstream) -> None:
    upstream.script(Reply.text(["one", " two", " three", " four"]))
    models = build_models(make_settings(upstream))
    try:
        stream = models.responder.stream([HumanMessage("count")], {"max_tokens": 2})
        items = [item async for item in stream]
    finally:
        await models.aclose()
    assert items == ["one", " two"]
    assert stream.result.finish_reason == "length"
    assert upstream.requests[0]["max_completion_tokens"] == 2


async def test_a_tool_list_is_bound_once_and_sent_on_every_call(upstream: ScriptedUpstream) -> None:
    tools = [
        {"type": "function", "function": {"name": f"tool_{k}", "parameters": {"type": "object"}}}
        for k in range(10)
    ]
    for text in "abc":
        upstream.script(Reply.text([text]))
    models = build_models(make_settings(upstream))
    router = models.router
    try:
        first = router.bind(tools[:2])
        assert router.bind(tools[:2]) is first  # the same list: the cached binding
        assert router.bind(list(tools[:2])) is first  # the same tools in another list
        assert router.bind(tools[1:3]) is not first
        assert router.bind([]) is router.model
        for k in range(10):  # more lists than the cache holds: the oldest go
            router.bind(tools[k : k + 1])
        assert router.bind(tools[:2]) is not first
        for _ in range(3):
            await router.complete([HumanMessage("hi")], tools[:2])
    finally:
        await models.aclose()
    sent = [[t["function"]["name"] for t in r["tools"]] for r in upstream.requests]
    assert sent == [["tool_0", "tool_1"]] * 3


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_upstream_that_does_not_answer_is_named_without_its_password(
    provider: str,
) -> None:
    base = f"http://user:s3cret@127.0.0.1:{free_port()}"
    settings = make_settings(
        None,
        openai_base_url=f"{base}/v1",
        openai_api_key="k",
        anthropic_base_url=base,
        anthropic_api_key="k",
        response_provider=provider,
    )
    models = build_models(settings)
    try:
        with pytest.raises(LlmError) as raised:
            await models.responder.complete([HumanMessage("hello")])
    finally:
        await models.aclose()
    path = "/v1/chat/completions" if provider == "openai" else "/v1/messages"
    where = f"http://user:***@127.0.0.1:{base.rsplit(':', 1)[1]}{path}"
    assert raised.value.message.startswith(f"cannot reach the upstream model at {where}: ")
    assert "s3cret" not in raised.value.message
