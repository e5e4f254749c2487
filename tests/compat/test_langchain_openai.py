"""compat/langchain_openai.py: the request `ChatOpenAI` builds and its reading of an answer,
held to literal payloads and answers (worker/openai_fast.py sends and reads them itself)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from compat.langchain_openai import chat_result, request_payload


@tool
def lamp(room: str) -> str:
    """Turn on the lamp in a room."""
    return "on"


LAMP = {
    "type": "function",
    "function": {
        "name": "lamp",
        "description": "Turn on the lamp in a room.",
        "parameters": {
            "properties": {"room": {"type": "string"}},
            "required": ["room"],
            "type": "object",
        },
    },
}


def model() -> ChatOpenAI:
    return ChatOpenAI(model="m", api_key="k", base_url="http://127.0.0.1:9/v1", stream_usage=True)


def test_the_payload_carries_the_messages_and_what_bind_tools_bound() -> None:
    chat = model()
    bound: dict[str, Any] = chat.bind_tools([lamp]).kwargs  # type: ignore[attr-defined]
    payload = request_payload(chat, [SystemMessage("s"), HumanMessage("hi")], bound)
    assert payload == {
        "model": "m",
        "stream": False,
        "tools": [LAMP],
        "messages": [{"content": "s", "role": "system"}, {"content": "hi", "role": "user"}],
    }


def test_the_payload_carries_call_options_as_the_api_names_them() -> None:
    payload = request_payload(model(), [HumanMessage("hi")], {"max_tokens": 5, "stop": ["x"]})
    assert payload == {
        "model": "m",
        "stream": False,
        "stop": ["x"],
        "messages": [{"content": "hi", "role": "user"}],
        "max_completion_tokens": 5,
    }


def test_an_answer_is_read_with_its_tool_calls_usage_and_finish_reason() -> None:
    body = {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "lamp", "arguments": '{"room": "hall"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }
    (generation,) = chat_result(model(), body).generations
    message = generation.message
    assert isinstance(message, AIMessage)
    assert message.content == ""
    assert message.tool_calls == [
        {"name": "lamp", "args": {"room": "hall"}, "id": "call_1", "type": "tool_call"}
    ]
    assert message.usage_metadata is not None
    assert (message.usage_metadata["input_tokens"], message.usage_metadata["output_tokens"]) == (
        10,
        3,
    )
    assert generation.generation_info == {"finish_reason": "tool_calls"}
