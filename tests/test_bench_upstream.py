"""The bench upstream's model clock (bench/upstream.py `clock_reply`): what a request gets,
and when, from the directive its last user message carries."""

from __future__ import annotations

from typing import Any

import pytest

from bench.upstream import Directive, clock_reply, clock_tokens, directive, route
from tests.support.upstream import ROUTER_TOOL

CLOCK = Directive(tag="x1", mode="clock", tokens=3, delay_ms=25, first_ms=200, tool="calculator")
CHAT = Directive(tag="x2", mode="clock", tokens=3, delay_ms=25, first_ms=200)


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {}}}


def body(
    wanted: Directive, tools: list[str], *, answered: bool = False, stream: bool = True
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": wanted.message()}]
    if answered:
        call = {"id": "c1", "type": "function", "function": {"name": "calculator"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ]
    request: dict[str, Any] = {"messages": messages, "stream": stream}
    if tools:
        request["tools"] = [tool(name) for name in tools]
    return request


@pytest.mark.parametrize(
    ("request_body", "wanted", "calls", "tokens", "first_delay"),
    [
        # One model, a chat turn: the answer, streamed after the time to the first token.
        (body(CHAT, ["calculator"]), CHAT, [], ["Sure", " t01", " t02"], 0.2),
        # One model, a one-tool turn: the call first, then the answer.
        (body(CLOCK, ["calculator"]), CLOCK, ["calculator"], [], 0.2),
        (body(CLOCK, ["calculator"], answered=True), CLOCK, [], ["Sure", " t01", " t02"], 0.2),
        # Two models: the router calls `respond` beside its call, or alone, whole answers
        # coming once written (a head and 6 fragments for the call, a head and 2 for `{}`).
        (
            body(CLOCK, ["calculator", "respond"], stream=False),
            CLOCK,
            ["calculator", "respond"],
            [],
            0.2 + 0.025 * 10,
        ),
        (body(CHAT, ["calculator", "respond"], stream=False), CHAT, ["respond"], [], 0.275),
        (
            body(CLOCK, ["calculator", "respond"], answered=True, stream=False),
            CLOCK,
            ["respond"],
            [],
            0.275,
        ),
        # ... and the response model writes the answer.
        (body(CLOCK, [], answered=True), CLOCK, [], ["Sure", " t01", " t02"], 0.2),
    ],
    ids=[
        "chat",
        "tool: the call",
        "tool: the answer",
        "router: call and respond",
        "router: respond",
        "router after the tool: respond",
        "response model",
    ],
)
def test_a_clock_reply_keeps_a_models_time(
    request_body: dict[str, Any],
    wanted: Directive,
    calls: list[str],
    tokens: list[str],
    first_delay: float,
) -> None:
    reply = clock_reply(request_body, wanted)
    assert [name for name, _ in reply.calls] == calls
    assert reply.tokens == tokens
    assert reply.first_delay == pytest.approx(first_delay)
    assert reply.chunk_delay == pytest.approx(0.025)
    if calls[:1] == ["calculator"]:
        assert reply.calls[0][1] == {"expression": "6 * 7"}
        assert reply.arg_chunks == 6  # 23 characters, about 4 a token


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        (Directive(tag="a", tokens=5), "bench t=a mode=echo n=5 d=0"),
        (CLOCK, "bench t=x1 mode=clock n=3 d=25 f=200 tool=calculator"),
        (CHAT, "bench t=x2 mode=clock n=3 d=25 f=200"),
    ],
    ids=["echo", "clock, a tool", "clock"],
)
def test_a_directive_reads_back_from_its_message(wanted: Directive, message: str) -> None:
    assert wanted.message() == message
    assert directive(message) == wanted


def test_clock_tokens_are_four_characters() -> None:
    assert clock_tokens(4) == ["Sure", " t01", " t02", " t03"]
    assert {len(token) for token in clock_tokens(100)} == {4}


def test_a_router_on_the_clock_is_answered_on_it_and_any_other_with_respond() -> None:
    clocked = route(body(CLOCK, ["calculator", "respond"], stream=False))
    assert [name for name, _ in clocked.calls] == ["calculator", "respond"]
    assert clocked.first_delay == pytest.approx(0.45)
    plain = route(body(Directive(tag="e"), ["calculator", "respond"], stream=False))
    assert [name for name, _ in plain.calls] == [ROUTER_TOOL]
    assert plain.first_delay == 0
