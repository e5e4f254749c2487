"""Client tools Bernard cannot honour (issue 22): each a 400 in the API's error envelope,
naming the parameter and why, before any turn is made. Through the official `openai` SDK,
which raises them as `BadRequestError`."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.stack import Stack
from tests.support.upstream import ScriptedUpstream

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
QUESTION = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "calculator"}}]},
            "tools[0].function.name",
            "tool name 'calculator' is taken by one of Bernard's own tools",
        ),
        (
            {"tools": [WEATHER, {"type": "function", "function": {"name": "respond"}}]},
            "tools[1].function.name",
            "tool name 'respond' is the name of Bernard's router's own tool",
        ),
        (
            {"tools": [{"type": "web_search_preview"}]},
            "tools[0].type",
            "tool type 'web_search_preview' is not supported; only function tools are",
        ),
        (
            {"tools": [WEATHER, WEATHER]},
            "tools[1].function.name",
            "tool name 'get_weather' is given twice",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
            "tool_choice names function 'x', which is not in tools",
        ),
        ({"tool_choice": "required"}, "tool_choice", "tool_choice 'required' needs tools"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "'sometimes'"),
        (
            {"tools": [WEATHER], "stream_options": {"tool_events": "delta"}},
            "stream_options.tool_events",
            "cannot be used with tools",
        ),
    ],
    ids=[
        "bernards tool",
        "respond",
        "built-in type",
        "twice",
        "named absent",
        "required",
        "bad",
        "delta",
    ],
)
async def test_client_tools_bernard_cannot_honour_are_a_400_naming_why(
    stack: Stack, upstream: ScriptedUpstream, body: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await stack.openai().chat.completions.create(
            model="bernard-v1",
            messages=QUESTION,  # type: ignore[arg-type]
            extra_body=body,
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert words in error["message"]
    assert upstream.router_requests == [] and upstream.requests == []
