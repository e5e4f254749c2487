"""Bad requests get a 4xx in the OpenAI error envelope, naming the parameter; nothing runs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.stack import Stack, make_settings, run_stack

CHAT = "/v1/chat/completions"
OK_MESSAGES = [{"role": "user", "content": "hi"}]


def assert_envelope(response: Any, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    return dict(error)


async def _queue_is_empty(stack: Stack) -> bool:
    return await stack.redis.zcard(stack.settings.queue_name) == 0


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"model": "bernard-v1"}, "messages"),
        ({"model": "bernard-v1", "messages": []}, "messages"),
        (
            {"model": "bernard-v1", "messages": [{"role": "wizard", "content": "x"}]},
            "messages[0].role",
        ),
        ({"model": "bernard-v1", "messages": "hello"}, "messages"),
        (
            {"model": "bernard-v1", "messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
        ),
        ({"model": "bernard-v1", "messages": OK_MESSAGES, "stream": "yes"}, "stream"),
        ({"model": "bernard-v1", "messages": OK_MESSAGES, "temperature": "hot"}, "temperature"),
        ({"model": "bernard-v1", "messages": OK_MESSAGES, "temperature": 9}, "temperature"),
        ({"model": "bernard-v1", "messages": OK_MESSAGES, "n": 2}, "n"),
        ({"model": "bernard-v1", "messages": OK_MESSAGES, "logprobs": True}, "logprobs"),
        (
            {
                "model": "bernard-v1",
                "messages": OK_MESSAGES,
                "response_format": {"type": "json_schema"},
            },
            "response_format.type",
        ),
        (
            {"model": "bernard-v1", "messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
        ),
        ({"model": "bernard-v1", "messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {
                "model": "bernard-v1",
                "messages": OK_MESSAGES,
                "stream_options": {"tool_events": "all"},
            },
            "stream_options.tool_events",
        ),
        ({"messages": OK_MESSAGES}, "model"),
    ],
)
async def test_invalid_bodies_are_400_naming_the_param(
    stack: Stack, payload: dict[str, Any], param: str
) -> None:
    response = await stack.client.post(CHAT, json=payload)
    error = assert_envelope(response, 400, param)
    assert error["type"] == "invalid_request_error"
    assert await _queue_is_empty(stack)


async def test_invalid_json_is_400(stack: Stack) -> None:
    response = await stack.client.post(
        CHAT, content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_envelope(response, 400)
    assert await _queue_is_empty(stack)


async def test_a_json_array_body_is_400(stack: Stack) -> None:
    assert_envelope(await stack.client.post(CHAT, json=[1, 2]), 400)


def nested(levels: int) -> Any:
    """A JSON value `levels` arrays deep."""
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


def deep_tool(levels: int) -> dict[str, Any]:
    """A tool whose parameters' schema nests `levels` deep (the body adds four more)."""
    schema: Any = {"type": "string"}
    for _ in range(levels // 2):
        schema = {"items": schema}
    return {"type": "function", "function": {"name": "f", "parameters": schema}}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [deep_tool(300)]),
        ("response_format", {"type": "text", "schema": deep_tool(300)}),
        ("some_future_field", nested(300)),
        ("messages", [{"role": "user", "content": "hi", "extra": nested(300)}]),
        ("some_future_field", nested(64)),  # one past the bound: the body is a level too
    ],
)
async def test_a_body_nested_deeper_than_the_bound_is_400_naming_the_field(
    stack: Stack, field: str, value: Any
) -> None:
    payload = {"model": "bernard-v1", "messages": OK_MESSAGES, field: value}
    error = assert_envelope(await stack.client.post(CHAT, json=payload), 400, field)
    assert error["message"] == f"{field}: nested deeper than 64 levels, the most a body may nest"
    assert await _queue_is_empty(stack)


async def test_a_body_nested_to_the_bound_is_taken(stack: Stack) -> None:
    payload = {"model": "bernard-v1", "messages": OK_MESSAGES, "some_future_field": nested(63)}
    assert (await stack.client.post(CHAT, json=payload)).status_code == 200


async def test_unknown_model_is_404(stack: Stack) -> None:
    response = await stack.client.post(CHAT, json={"model": "gpt-9", "messages": OK_MESSAGES})
    error = assert_envelope(response, 404, "model")
    assert error["code"] == "model_not_found"
    assert await _queue_is_empty(stack)


async def test_unknown_fields_real_clients_send_are_ignored(stack: Stack) -> None:
    payload = {
        "model": "bernard-v1",
        "messages": [{"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}}],
        "user": "alice",
        "metadata": {"chat": "1"},
        "reasoning": {"effort": "low"},
        "parallel_tool_calls": True,
        "some_future_field": [1, 2, 3],
    }
    response = await stack.client.post(CHAT, json=payload)
    assert response.status_code == 200, response.text


async def test_text_content_parts_are_accepted_and_images_refused(stack: Stack) -> None:
    parts = [{"type": "text", "text": "hi"}]
    ok = await stack.client.post(
        CHAT, json={"model": "bernard-v1", "messages": [{"role": "user", "content": parts}]}
    )
    assert ok.status_code == 200, ok.text
    image = [{"type": "image_url", "image_url": {"url": "data:,"}}]
    refused = await stack.client.post(
        CHAT, json={"model": "bernard-v1", "messages": [{"role": "user", "content": image}]}
    )
    assert_envelope(refused, 400, "messages[0].content[0].type")


async def test_a_body_over_the_limit_is_413() -> None:
    async with run_stack(make_settings(max_body_bytes=2048), worker=False) as stack:
        big = {"model": "bernard-v1", "messages": [{"role": "user", "content": "x" * 5000}]}
        assert_envelope(await stack.client.post(CHAT, json=big), 413)
        assert await _queue_is_empty(stack)


async def test_unknown_routes_and_methods_use_the_envelope(stack: Stack) -> None:
    assert_envelope(await stack.client.get("/v1/nothing-here"), 404)
    assert_envelope(await stack.client.get(CHAT), 405)


async def test_legacy_completion_validates_its_prompt(stack: Stack) -> None:
    response = await stack.client.post("/v1/completions", json={"model": "bernard-v1"})
    assert_envelope(response, 400, "prompt")
