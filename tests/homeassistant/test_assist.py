"""Bernard as the conversation agent of a real Home Assistant 2025.4's Assist, end to end:
Home Assistant's own APIs in front (`POST /api/conversation/process`, the websocket's
`assist_pipeline/run` as a satellite starts it, the config-flow API), a real Bernard behind
(keys on, its Home Assistant tools pointed at that same Home Assistant), the scripted
upstream as the model."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from tests.homeassistant.assist import KEY, Assist, Satellite, bernard_settings
from tests.homeassistant.hass import HomeAssistant, HomeAssistantApi
from tests.support.processes import wait_for
from tests.support.upstream import Reply, ScriptedUpstream, last_user_text

# One Home Assistant per module (conftest.py): its tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_assist")

KITCHEN_AT = {"domain": "light", "service": "turn_on", "entity_id": "light.kitchen"}


def speech(result: dict[str, Any]) -> str:
    return str(result["response"]["speech"]["plain"]["speech"])


def deltas(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat log deltas a pipeline run sent, in order (its `intent-progress` events)."""
    return [e["data"]["chat_log_delta"] for e in events if e["type"] == "intent-progress"]


def intent_output(events: list[dict[str, Any]]) -> dict[str, Any]:
    (end,) = [e for e in events if e["type"] == "intent-end"]
    return dict(end["data"]["intent_output"])


async def owner_id(ha: HomeAssistantApi) -> str:
    return str((await ha.command("auth/current_user"))["id"])


def assert_no_secret_logged(home: HomeAssistant) -> None:
    log = home.log()
    assert KEY not in log, "Bernard's key reached Home Assistant's log"
    assert home.token not in log


async def test_conversation_process_answers_with_bernards_answer(
    assist: Assist, home_assistant: HomeAssistant
) -> None:
    assist.upstream.script(Reply.text("Hello from Bernard."))

    result = await assist.ha.process("Hello there", assist.agent_id)

    assert result["response"]["response_type"] == "action_done"
    assert speech(result) == "Hello from Bernard."
    assert result["continue_conversation"] is False
    (request,) = assist.upstream.requests
    assert last_user_text(request) == "Hello there"
    # No satellite: the message went to its Home Assistant user's conversation.
    rows = await assist.messages(f"ha-user-{await owner_id(assist.ha)}")
    assert [(r["role"], r["content"]) for r in rows] == [
        ("user", "Hello there"),
        ("assistant", "Hello from Bernard."),
    ]
    assert_no_secret_logged(home_assistant)


async def test_the_answer_streams_into_the_pipeline_with_the_tool_calls_and_results(
    assist: Assist,
) -> None:
    assist.upstream.script_router(
        Reply.tool_calls([("calculator", {"expression": "6*7"})], ids=["call_calc"])
    )
    assist.upstream.script(Reply.text("Six times seven is 42.", chunk_delay=0.1))

    events = await assist.ha.run_pipeline("What is 6 times 7?", pipeline=assist.pipeline_id)

    assert [e["type"] for e in events if e["type"] != "intent-progress"] == [
        "run-start",
        "intent-start",
        "intent-end",
        "run-end",
    ]
    tool_result = {"output": "42", "is_error": False}
    assert deltas(events) == [
        {"role": "assistant"},
        {
            "tool_calls": [
                {"tool_name": "calculator", "tool_args": {"expression": "6*7"}, "id": "call_calc"}
            ]
        },
        {"tool_progress": {"tool_call_id": "call_calc", "message": "Evaluating 6*7"}},
        {"tool_progress": {"tool_call_id": "call_calc", "message": "6*7 = 42"}},
        {
            "role": "tool_result",
            "agent_id": assist.agent_id,
            "tool_call_id": "call_calc",
            "tool_name": "calculator",
            "tool_result": tool_result,
        },
        {"role": "assistant"},  # the answer, a message of its own
        {"content": "Six"},
        {"content": " times"},
        {"content": " seven"},
        {"content": " is"},
        {"content": " 42."},
    ]
    # The words reached the pipeline as the model wrote them, not all at the end.
    words = [
        e["received"]
        for e in events
        if e["type"] == "intent-progress" and "content" in e["data"]["chat_log_delta"]
    ]
    assert words[-1] - words[0] > 0.3
    assert speech(intent_output(events)) == "Six times seven is 42."


async def test_with_one_model_the_words_before_a_tool_call_reach_the_pipeline_at_once(
    one_model_assist: Assist,
) -> None:
    """Bernard's roles on one model: the router's own text is the answer, streamed into the
    pipeline as it comes, the words before its tool call first (a satellite speaks them while
    the tool runs), in two model calls."""
    assist = one_model_assist
    assist.upstream.script(
        Reply.tool_calls(
            [("calculator", {"expression": "6*7"})], content="Let me see.", ids=["call_calc"]
        )
    )
    assist.upstream.script(Reply.text("It is 42.", chunk_delay=0.1))

    events = await assist.ha.run_pipeline("What is 6 times 7?", pipeline=assist.pipeline_id)

    said = [d for d in deltas(events) if "content" in d or "tool_calls" in d]
    (call,) = [i for i, d in enumerate(said) if "tool_calls" in d]
    assert "".join(d["content"] for d in said[:call]) == "Let me see."
    assert said[call]["tool_calls"] == [
        {"tool_name": "calculator", "tool_args": {"expression": "6*7"}, "id": "call_calc"}
    ]
    assert "".join(d["content"] for d in said[call + 1 :]) == "It is 42."
    assert len(assist.upstream.requests) == 2 and assist.upstream.router_requests == []
    assert speech(intent_output(events)).endswith("It is 42.")


async def test_a_confirmation_is_asked_aloud_and_yes_turns_the_real_light_on(
    assist: Assist, home_assistant: HomeAssistant
) -> None:
    assist.upstream.script_router(
        Reply.tool_calls([("ha_call_service", {**KITCHEN_AT, "data": {"brightness_pct": 40}})])
    )
    asked = await assist.ha.process("Kitchen light at 40 percent", assist.agent_id)

    assert speech(asked) == "Shall I turn on light.kitchen at 40 % brightness?"
    assert asked["continue_conversation"] is True
    assert (await assist.ha.state("light.kitchen"))["state"] == "off"

    assist.upstream.script(Reply.text("The kitchen light is on."))
    events = await assist.ha.run_pipeline(
        "Yes.", pipeline=assist.pipeline_id, conversation_id=asked["conversation_id"]
    )

    assert speech(intent_output(events)) == "The kitchen light is on."
    assert intent_output(events)["continue_conversation"] is False
    light = await assist.ha.state("light.kitchen")
    assert (light["state"], light["attributes"]["brightness"]) == ("on", 102)
    # The tool's step and result reached the pipeline's debug view.
    steps = [d["tool_progress"]["message"] for d in deltas(events) if "tool_progress" in d]
    assert steps == ["Calling light.turn_on for light.kitchen", "Home Assistant ran light.turn_on"]
    (result,) = [d for d in deltas(events) if d.get("role") == "tool_result"]
    assert result["tool_name"] == "ha_call_service"
    assert result["tool_result"]["is_error"] is False
    assert_no_secret_logged(home_assistant)


async def test_no_leaves_the_light_as_it_was(assist: Assist) -> None:
    assist.upstream.script_router(Reply.tool_calls([("ha_call_service", KITCHEN_AT)]))
    asked = await assist.ha.process("Turn on the kitchen light", assist.agent_id)
    assert speech(asked) == "Shall I turn on light.kitchen?"
    routed = len(assist.upstream.router_requests)

    assist.upstream.script(Reply.text("All right, I left it off."))
    answered = await assist.ha.process(
        "No thanks", assist.agent_id, conversation_id=asked["conversation_id"]
    )

    assert speech(answered) == "All right, I left it off."
    assert answered["continue_conversation"] is False
    assert (await assist.ha.state("light.kitchen"))["state"] == "off"
    rows = await assist.messages(f"ha-user-{await owner_id(assist.ha)}")
    assert [(r["role"], r["content"]) for r in rows][-4:] == [
        ("assistant", "Shall I turn on light.kitchen?"),
        ("tool", "The user declined: ha_call_service was not run."),
        ("user", "No thanks"),
        ("assistant", "All right, I left it off."),
    ]
    # Bernard read the "no" itself: the one router call after it already had the answer.
    (router,) = assist.upstream.router_requests[routed:]
    assert router["messages"][-2]["content"] == "The user declined: ha_call_service was not run."


async def test_other_words_are_read_by_the_model_which_may_propose_something_else(
    assist: Assist,
) -> None:
    assist.upstream.script_router(Reply.tool_calls([("ha_call_service", KITCHEN_AT)]))
    asked = await assist.ha.process("Turn on the kitchen light", assist.agent_id)
    assert speech(asked) == "Shall I turn on light.kitchen?"
    conversation = f"ha-user-{await owner_id(assist.ha)}"
    shown = await assist.stack.client.get(
        f"/v1/conversations/{conversation}", headers=assist.headers
    )
    waiting = shown.json()["pending_confirmation"]["confirmation_id"]

    # One turn: the router reads the words, rejects the proposal and proposes another.
    assist.upstream.script_router(
        Reply.tool_calls(
            [
                ("reject_pending", {"confirmation_ids": [waiting]}),
                ("ha_call_service", {**KITCHEN_AT, "data": {"brightness_pct": 30}}),
            ]
        )
    )
    other = await assist.ha.process(
        "No, dim it to 30 percent", assist.agent_id, conversation_id=asked["conversation_id"]
    )

    assert speech(other) == "Shall I turn on light.kitchen at 30 % brightness?"
    assert other["continue_conversation"] is True
    assert (await assist.ha.state("light.kitchen"))["state"] == "off"
    rows = await assist.messages(conversation)
    assert [(r["role"], r["content"]) for r in rows if r["content"]][-4:] == [
        ("assistant", "Shall I turn on light.kitchen?"),
        ("tool", "The user declined: ha_call_service was not run."),
        ("user", "No, dim it to 30 percent"),
        ("assistant", "Shall I turn on light.kitchen at 30 % brightness?"),
    ]

    assist.upstream.script(Reply.text("Dimmed to 30 percent."))
    done = await assist.ha.process("yes", assist.agent_id, conversation_id=asked["conversation_id"])

    assert speech(done) == "Dimmed to 30 percent."
    light = await assist.ha.state("light.kitchen")
    assert (light["state"], light["attributes"]["brightness"]) == ("on", 76)


async def test_a_yes_after_the_proposal_was_decided_elsewhere_runs_nothing(
    assist: Assist,
) -> None:
    assist.upstream.script_router(Reply.tool_calls([("ha_call_service", KITCHEN_AT)]))
    asked = await assist.ha.process("Turn on the kitchen light", assist.agent_id)
    conversation = f"ha-user-{await owner_id(assist.ha)}"
    state = await assist.stack.client.get(
        f"/v1/conversations/{conversation}", headers=assist.headers
    )
    assist.upstream.script(Reply.text("Left off."))
    rejected = await assist.stack.client.post(  # from the playground, say
        f"/v1/conversations/{conversation}/resume",
        json={
            "confirmation_id": state.json()["pending_confirmation"]["confirmation_id"],
            "decision": "reject",
        },
        headers=assist.headers,
    )
    assert rejected.status_code == 200, rejected.text

    # Nothing waits: the "yes" is a message like any, and the model answers it.
    assist.upstream.script(Reply.text("It was already declined; ask again if you like."))
    answered = await assist.ha.process(
        "yes", assist.agent_id, conversation_id=asked["conversation_id"]
    )

    assert speech(answered) == "It was already declined; ask again if you like."
    assert (await assist.ha.state("light.kitchen"))["state"] == "off"


async def test_a_proposal_made_elsewhere_is_answered_by_voice(assist: Assist) -> None:
    """Home Assistant did not ask it (another client did, or it restarted since): the
    conversation is busy waiting, so the answer decides it."""
    conversation = f"ha-user-{await owner_id(assist.ha)}"
    assist.upstream.script_router(Reply.tool_calls([("ha_call_service", KITCHEN_AT)]))
    made = await assist.stack.client.post(
        "/v1/conversations", json={"id": conversation}, headers=assist.headers
    )
    assert made.status_code == 201, made.text
    asked = await assist.stack.client.post(
        f"/v1/conversations/{conversation}/messages",
        json={"content": "Turn on the kitchen light"},
        headers=assist.headers,
    )
    assert asked.json()["status"] == "awaiting_confirmation"

    assist.upstream.script(Reply.text("It is on."))
    answered = await assist.ha.process("Go ahead", assist.agent_id)

    assert speech(answered) == "It is on."
    assert (await assist.ha.state("light.kitchen"))["state"] == "on"


async def test_a_failed_turn_is_a_spoken_apology(
    assist: Assist, home_assistant: HomeAssistant
) -> None:
    assist.upstream.script(Reply.error(500, "the model is down"))
    mark = home_assistant.log_mark()

    result = await assist.ha.process("Hello", assist.agent_id)

    assert result["response"]["response_type"] == "error"
    assert speech(result) == "Sorry, I couldn't finish that."
    said = "Bernard's turn ended failed (upstream_error) in conversation ha-user-"
    logged = await home_assistant.logged_since(mark, said)
    assert said in logged
    assert "Traceback" not in logged


async def test_an_utterance_while_a_turn_runs_interrupts_it_and_is_answered(
    assist: Assist,
) -> None:
    """A household talks over its assistant: the new words win. The running answer stops
    where it was (kept in the conversation, marked so) and the utterance is answered."""
    conversation = f"ha-user-{await owner_id(assist.ha)}"
    made = await assist.stack.client.post(
        "/v1/conversations", json={"id": conversation}, headers=assist.headers
    )
    assert made.status_code == 201, made.text
    gate = assist.upstream.script(Reply.text(["Once", " upon", " a", " time"], block_after=2))
    assist.upstream.script(Reply.text("The hall light is on."))
    running = asyncio.create_task(
        assist.stack.client.post(
            f"/v1/conversations/{conversation}/messages",
            json={"content": "Tell me a story"},
            headers=assist.headers,
        )
    )
    await gate.wait_blocked()

    result = await assist.ha.process("Turn on the hall light", assist.agent_id)
    stopped = await running
    gate.release()

    assert speech(result) == "The hall light is on."
    assert (stopped.status_code, stopped.json()["error"]["code"]) == (409, "turn_interrupted")
    rows = await assist.messages(conversation)
    assert [(r["role"], r["content"], r.get("stopped")) for r in rows] == [
        ("user", "Tell me a story", None),
        ("assistant", "Once upon", "turn_interrupted"),
        ("user", "Turn on the hall light", None),
        ("assistant", "The hall light is on.", None),
    ]


async def test_two_satellites_keep_two_histories(
    assist: Assist, satellites: dict[str, Satellite]
) -> None:
    kitchen, bedroom = satellites["Kitchen"], satellites["Bedroom"]
    assist.upstream.script(Reply.text("Hello Ann."))
    assist.upstream.script(Reply.text("Hello Bob."))
    await assist.ha.run_pipeline(
        "My name is Ann.", pipeline=assist.pipeline_id, device_id=kitchen.device_id
    )
    await assist.ha.run_pipeline(
        "My name is Bob.", pipeline=assist.pipeline_id, device_id=bedroom.device_id
    )
    assist.upstream.script(Reply.text("You are Ann."))

    asked = await assist.ha.run_pipeline(
        "What is my name?", pipeline=assist.pipeline_id, device_id=kitchen.device_id
    )

    assert speech(intent_output(asked)) == "You are Ann."
    said = [m.get("content") for m in assist.upstream.requests[-1]["messages"]]
    assert "My name is Ann." in said and "My name is Bob." not in said
    kitchen_rows = await assist.messages(f"ha-device-{kitchen.device_id}")
    bedroom_rows = await assist.messages(f"ha-device-{bedroom.device_id}")
    assert [r["content"] for r in kitchen_rows] == [
        "My name is Ann.",
        "Hello Ann.",
        "What is my name?",
        "You are Ann.",
    ]
    assert [r["content"] for r in bedroom_rows] == ["My name is Bob.", "Hello Bob."]


async def test_a_timer_rings_on_the_satellite_that_set_it(
    assist: Assist, satellites: dict[str, Satellite]
) -> None:
    kitchen, bedroom = satellites["Kitchen"], satellites["Bedroom"]
    await use_voice(assist, kitchen.voice)
    assist.upstream.script_router(
        Reply.tool_calls([("set_timer", {"duration": "1s", "label": "pasta"})])
    )
    assist.upstream.script(Reply.text("Pasta timer set."))

    async with assist.ha.websocket() as ws:
        await ws.send(
            json.dumps({"id": 1, "type": "subscribe_events", "event_type": "bernard_timer_fired"})
        )
        assert json.loads(await ws.recv())["success"] is True
        set_it = await assist.ha.run_pipeline(
            "Pasta timer, one second", pipeline=assist.pipeline_id, device_id=kitchen.device_id
        )
        assert speech(intent_output(set_it)) == "Pasta timer set."
        async with asyncio.timeout(20):
            fired = json.loads(await ws.recv())["event"]["data"]

    assert fired == {
        "timer_id": fired["timer_id"],
        "label": "pasta",
        "conversation_id": f"ha-device-{kitchen.device_id}",
        "device_id": kitchen.device_id,
        "message": "Your pasta timer is done.",
    }

    async def announced() -> bool:
        state = await assist.ha.state(kitchen.entity_id)
        return bool(state["attributes"]["announcements"])

    await wait_for(announced, 10)
    assert (await assist.ha.state(kitchen.entity_id))["attributes"]["announcements"] == [
        "Your pasta timer is done."
    ]
    assert (await assist.ha.state(bedroom.entity_id))["attributes"]["announcements"] == []


async def use_voice(assist: Assist, voice: str) -> None:
    """Give the test's pipeline a text-to-speech engine: announcing needs one."""
    (pipeline,) = [
        p
        for p in (await assist.ha.command("assist_pipeline/pipeline/list"))["pipelines"]
        if p["id"] == assist.pipeline_id
    ]
    fields = {k: v for k, v in pipeline.items() if k != "id"}
    await assist.ha.command(
        "assist_pipeline/pipeline/update",
        pipeline_id=assist.pipeline_id,
        **{**fields, "tts_engine": voice, "tts_language": "en"},
    )


async def test_bernard_unreachable_is_a_spoken_apology(
    ha: HomeAssistantApi, home_assistant: HomeAssistant, upstream: ScriptedUpstream
) -> None:
    async with bernard_settings(upstream, home_assistant, "household-gone").stack() as stack:
        created = await ha.flow("bernard", {"url": stack.base_url, "api_key": KEY})
        entry_id = created["result"]["entry_id"]
    try:
        mark = home_assistant.log_mark()
        started = time.monotonic()
        result = await ha.process("Turn on the kitchen light", entry_id)  # the entry's agent
        took = time.monotonic() - started
    finally:
        await ha.remove_entry(entry_id)

    assert result["response"]["response_type"] == "error"
    assert speech(result) == "Sorry, I can't reach Bernard right now."
    assert took < 10, "a refused connection is an apology at once, far inside the pipeline's 300 s"
    said = "Bernard did not answer (conversation ha-user-"
    logged = await home_assistant.logged_since(mark, said)
    assert said in logged
    assert f"POST {stack.base_url}/v1/conversations/" in logged
    assert "Traceback" not in logged
    assert_no_secret_logged(home_assistant)


async def test_the_config_flow_names_a_bad_key_and_an_unreachable_url(
    ha: HomeAssistantApi, home_assistant: HomeAssistant, upstream: ScriptedUpstream
) -> None:
    async with bernard_settings(upstream, home_assistant, "household-flow").stack() as stack:
        bad_key = await ha.flow("bernard", {"url": stack.base_url, "api_key": "wrong-key"})
        url = stack.base_url
    unreachable = await ha.flow("bernard", {"url": url, "api_key": KEY})

    assert (bad_key["type"], bad_key["errors"]) == ("form", {"base": "invalid_auth"})
    assert (unreachable["type"], unreachable["errors"]) == ("form", {"base": "cannot_connect"})
