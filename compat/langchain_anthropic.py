"""langchain-anthropic (bounded in pyproject.toml), past its interface: a `ChatAnthropic` on
an HTTP client of the worker's.

`ChatAnthropic` takes no HTTP client: it builds its SDK client (`_async_client`, a cached
property) on an httpx client of its own, cached for the whole process, with the pool
defaults of the SDK (1,000 connections: turns past the worker's concurrency would wait
silently) and outliving the event loop its connections belong to. `chat_anthropic` gives
one whose `_async_client` is built from the model's own client options (`_client_params`:
key, base URL, timeout, retries, headers) on the client given. tests/compat/
test_langchain_anthropic.py holds it.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import anthropic
from langchain_anthropic import ChatAnthropic

__all__ = ["chat_anthropic"]


def chat_anthropic(http_client: Any, **options: Any) -> ChatAnthropic:
    """A `ChatAnthropic(**options)` whose async calls go through `http_client` (the SDK's
    `DefaultAsyncHttpxClient`, or one like it)."""

    class OwnClientChatAnthropic(ChatAnthropic):
        @cached_property
        def _async_client(self) -> anthropic.AsyncClient:
            return anthropic.AsyncClient(**self._client_params, http_client=http_client)

    return OwnClientChatAnthropic(**options)
