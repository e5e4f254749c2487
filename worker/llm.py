"""The LLM layer: one small interface over a LangChain chat model.

`complete` returns one message with its tool calls; `stream` yields text as it arrives and
then one `LlmResult`. Aborting is cancelling: cancelling the task that iterates `stream`
closes the upstream HTTP connection. Upstream failures become `LlmError`, here and only
here, so the rest of the worker sees one exception type.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, cast

import openai
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.tools import BaseTool

from shared.settings import Settings

logger = logging.getLogger("bernard.worker")

# Upstream connections the openai client under `ChatOpenAI` pools, for both models
# together; a streaming turn holds one, and a turn past the limit waits for one.
LLM_CONNECTIONS = openai.DEFAULT_CONNECTION_LIMITS.max_connections or 1000


class LlmError(Exception):
    """An upstream model call failed; `code` is what the client sees in the error frame."""

    def __init__(self, message: str, code: str = "upstream_error") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(slots=True)
class LlmResult:
    """The end of one model call."""

    message: AIMessage
    usage: dict[str, int] | None
    latency_ms: float


def _usage(message: AIMessage | AIMessageChunk) -> dict[str, int] | None:
    meta = message.usage_metadata
    if not meta:
        return None
    return {
        "prompt_tokens": meta["input_tokens"],
        "completion_tokens": meta["output_tokens"],
        "total_tokens": meta["total_tokens"],
    }


def _translate(exc: openai.APIError) -> LlmError:
    if isinstance(exc, openai.APIStatusError):
        return LlmError(f"upstream model returned HTTP {exc.status_code}: {exc.message}")
    if isinstance(exc, openai.APITimeoutError):
        return LlmError("upstream model timed out", code="upstream_timeout")
    return LlmError(f"upstream model call failed: {exc}")


class Llm:
    """A chat model under one name, called for whole messages or for streamed text."""

    def __init__(self, model: BaseChatModel, name: str) -> None:
        self.model = model
        self.name = name

    async def complete(
        self, messages: Sequence[BaseMessage], tools: Sequence[BaseTool | dict[str, Any]] = ()
    ) -> LlmResult:
        """One call with `tools` bound; the answer's `tool_calls` are already parsed."""
        runnable: Any = self.model.bind_tools(list(tools)) if tools else self.model
        started = time.perf_counter()
        try:
            message = await runnable.ainvoke(list(messages))
        except openai.APIError as exc:
            raise _translate(exc) from exc
        latency_ms = (time.perf_counter() - started) * 1000
        return LlmResult(message=message, usage=_usage(message), latency_ms=latency_ms)

    async def stream(self, messages: Sequence[BaseMessage]) -> AsyncIterator[str | LlmResult]:
        """Yield each text delta as it arrives, then one `LlmResult` with the usage."""
        started = time.perf_counter()
        total: AIMessageChunk | None = None
        try:
            # aclosing: leaving early must close the upstream response, not leave it open.
            chunks_gen = cast(AsyncGenerator[Any, None], self.model.astream(list(messages)))
            async with aclosing(chunks_gen) as chunks:
                async for chunk in chunks:
                    assert isinstance(chunk, AIMessageChunk)
                    total = chunk if total is None else total + chunk
                    if isinstance(chunk.content, str) and chunk.content:
                        yield chunk.content
        except openai.APIError as exc:
            raise _translate(exc) from exc
        message = AIMessage(content=total.content if total else "")
        if total is not None:
            message.usage_metadata = total.usage_metadata
        latency_ms = (time.perf_counter() - started) * 1000
        yield LlmResult(message=message, usage=_usage(message), latency_ms=latency_ms)


def build_llms(settings: Settings) -> tuple[Llm, Llm]:
    """The router and response models: `ChatOpenAI`, or the offline demo model."""
    if settings.demo_mode:
        from worker.demo_model import DemoChatModel

        demo = DemoChatModel()
        return Llm(demo, "bernard-demo"), Llm(demo, "bernard-demo")
    from langchain_openai import ChatOpenAI

    if settings.worker_concurrency > LLM_CONNECTIONS:
        logger.warning(
            "BERNARD_WORKER_CONCURRENCY=%d is above the %d upstream connections the LLM "
            "client pools: turns beyond that many wait, silently, for a connection",
            settings.worker_concurrency,
            LLM_CONNECTIONS,
        )

    def chat(model: str) -> ChatOpenAI:
        return ChatOpenAI(
            model=model,
            base_url=settings.openai_base_url,
            api_key=settings.openai_api_key or "not-needed",
            stream_usage=True,
            timeout=settings.llm_timeout_s,
            max_retries=settings.llm_max_retries,
            # Its per-chunk `asyncio.wait_for` swallows a cancel on Python 3.11 when the next
            # chunk is already buffered, so aborts were lost; `timeout` bounds reads instead.
            stream_chunk_timeout=None,
        )

    return (
        Llm(chat(settings.router_model), settings.router_model),
        Llm(chat(settings.response_model), settings.response_model),
    )
