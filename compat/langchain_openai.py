"""langchain-openai (bounded in pyproject.toml), past its interface: the request a
`ChatOpenAI` would send, and its reading of an answer, without the call between.

worker/openai_fast.py sends a turn's calls itself (the SDK's request transform and per-chunk
models cost more than the rest of the worker's work per token: its docstring has the
figures), yet must send what `ChatOpenAI` sends and read the answer as it reads it. Those
two halves are `ChatOpenAI._get_request_payload(messages, **kwargs)` and
`_create_chat_result(response)`. tests/compat/test_langchain_openai.py holds both to literal
payloads and answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from langchain_openai import ChatOpenAI

__all__ = ["chat_result", "request_payload"]


def request_payload(
    model: ChatOpenAI, messages: Sequence[BaseMessage], options: Mapping[str, Any]
) -> dict[str, Any]:
    """The body `model` would POST to `/chat/completions` for `messages`, with `options`
    (what `bind_tools` bound, call options such as `max_tokens`); not yet streaming."""
    payload: dict[str, Any] = model._get_request_payload(list(messages), **options)
    return payload


def chat_result(model: ChatOpenAI, body: dict[str, Any]) -> ChatResult:
    """`model`'s reading of a whole `/chat/completions` answer (`body`, parsed JSON): the
    message with its tool calls and usage, the finish reason in the generation's info."""
    return model._create_chat_result(body)
