"""The OpenAI Agents SDK, unmodified, running an agent with a function tool against Bernard's
Responses API (api/routes/responses.py) over a running API and worker and the scripted
upstream: the router calls the agent's tool, the SDK runs it here and sends its output back
(the whole input again, as the SDK does by default), and the router answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai.types.responses import ResponseTextDeltaEvent

from launcher.redis_server import free_port
from tests.support.stack import Stack, make_config
from tests.support.upstream import Reply, ScriptedUpstream
from worker.demo_model import DEMO_NOTICE


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    """The SDK exports traces to OpenAI by default; a test sends nothing to the internet."""
    set_tracing_disabled(True)
    yield


def weather_agent(stack: Stack, asked: list[str], *, store: bool | None = None) -> Agent:
    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        asked.append(city)
        return "12 °C, sunny"

    client = stack.openai()
    return Agent(
        name="Weather",
        instructions="Answer with the weather.",
        model=OpenAIResponsesModel(model="bernard-v1", openai_client=client),
        tools=[get_weather],
        model_settings=ModelSettings(store=store),
    )


def assert_the_router_heard_the_result(upstream: ScriptedUpstream, call_id: str) -> None:
    heard = upstream.router_requests[-1]["messages"]
    assert [m["role"] for m in heard[-3:]] == ["user", "assistant", "tool"]
    assert heard[-3]["content"] == "What is the weather in Oslo?"
    assert [call["id"] for call in heard[-2]["tool_calls"]] == [call_id]
    assert heard[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert heard[-1] == {"role": "tool", "tool_call_id": call_id, "content": "12 °C, sunny"}


async def test_an_agent_runs_its_function_tool(stack: Stack, upstream: ScriptedUpstream) -> None:
    asked: list[str] = []
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_a1"]))
    upstream.script(Reply.text("It is 12 °C and sunny in Oslo."))

    result = await Runner.run(
        weather_agent(stack, asked),
        "What is the weather in Oslo?",
        run_config=RunConfig(tracing_disabled=True),
    )

    assert asked == ["Oslo"]
    assert result.final_output == "It is 12 °C and sunny in Oslo."
    offered = upstream.router_requests[0]["tools"]
    assert "get_weather" in [tool["function"]["name"] for tool in offered]
    assert_the_router_heard_the_result(upstream, "call_a1")


async def test_an_agent_streams_its_run(stack: Stack, upstream: ScriptedUpstream) -> None:
    asked: list[str] = []
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_a2"]))
    upstream.script(Reply.text(["It is ", "12 °C", " and sunny", " in Oslo."]))

    run = Runner.run_streamed(
        weather_agent(stack, asked),
        "What is the weather in Oslo?",
        run_config=RunConfig(tracing_disabled=True),
    )
    deltas = [
        event.data.delta
        async for event in run.stream_events()
        if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent)
    ]

    assert asked == ["Oslo"]
    # Pieces that reach the API together may leave it as one delta (api/relay.py batches).
    assert "".join(deltas) == "It is 12 °C and sunny in Oslo."
    assert run.final_output == "It is 12 °C and sunny in Oslo."
    assert_the_router_heard_the_result(upstream, "call_a2")


async def test_an_agent_that_stores_nothing_runs_its_function_tool(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    """`store=False` (zero data retention): the SDK sends the whole input again, function
    call and output included, and Bernard keeps none of it (tests/test_responses_unstored.py)."""
    asked: list[str] = []
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_a3"]))
    upstream.script(Reply.text("It is 12 °C and sunny in Oslo."))

    result = await Runner.run(
        weather_agent(stack, asked, store=False),
        "What is the weather in Oslo?",
        run_config=RunConfig(tracing_disabled=True),
    )

    assert asked == ["Oslo"]
    assert result.final_output == "It is 12 °C and sunny in Oslo."
    assert_the_router_heard_the_result(upstream, "call_a3")
    for response in result.raw_responses:
        assert response.response_id is not None
        polled = await stack.client.get(f"/v1/responses/{response.response_id}")
        assert polled.status_code == 404, polled.text


# -- on the offline demo model: no upstream at all ----------------------------------------------


@pytest.mark.parametrize(
    ("question", "choice"),
    [("What is the weather in Oslo?", None), ("How is it in Oslo today?", "get_weather")],
    ids=["named", "forced"],
)
async def test_the_demo_model_calls_the_agents_function_tool(
    question: str, choice: str | None
) -> None:
    """The words name the agent's `get_weather` (Bernard's own `weather` is offered too),
    or `tool_choice` forces it: either way it gets a city from the question, not `{}`."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    config = make_config(
        None,
        openai_base_url=None,
        openai_api_key=None,
        open_meteo_url=nowhere,
        open_meteo_geocoding_url=nowhere,
    )
    asked: list[str] = []
    async with config.stack() as stack:
        agent = weather_agent(stack, asked)
        agent.model_settings = ModelSettings(tool_choice=choice)
        result = await Runner.run(agent, question, run_config=RunConfig(tracing_disabled=True))
    assert asked == ["Oslo"]
    assert result.final_output == (
        f'You said: "{question}" The get_weather tool returned: 12 °C, sunny. {DEMO_NOTICE}'
    )
