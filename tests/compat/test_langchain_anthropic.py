"""compat/langchain_anthropic.py: a `ChatAnthropic` whose calls go through the HTTP client
given, with the model's own key, base URL and headers (its own client would be one cached
for the process)."""

from __future__ import annotations

import anthropic
import httpx2
from langchain_core.messages import HumanMessage

from compat.langchain_anthropic import chat_anthropic

ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "content": [{"type": "text", "text": "hello"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 4, "output_tokens": 1},
}


async def test_a_call_goes_through_the_client_given_with_the_models_settings() -> None:
    seen: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json=ANSWER)

    http = anthropic.DefaultAsyncHttpxClient(transport=httpx2.MockTransport(answer))
    model = chat_anthropic(
        http,
        model="claude-test",
        base_url="http://anthropic.test",
        api_key="the-key",
        max_retries=0,
    )
    message = await model.ainvoke([HumanMessage("hi")])
    assert message.content == "hello"
    (request,) = seen
    assert str(request.url) == "http://anthropic.test/v1/messages"
    assert request.headers["authorization"] == "Bearer the-key"
    assert request.headers["user-agent"].startswith("langchain-anthropic/"), "the model's headers"
    await http.aclose()
