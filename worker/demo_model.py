"""The offline demo chat model, used when no upstream LLM is configured.

`DemoChatModel` is a real LangChain chat model, so the worker drives it exactly as it drives
`ChatOpenAI`: it streams token by token with usage, and with tools bound it acts as a tiny
keyword router (time questions call `get_time`, arithmetic calls `calculator`, anything else or
a turn that already has tool results calls `respond`). Its answers are deterministic and say
that Bernard is running on the demo model.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call, tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

__all__ = ["DEMO_NOTICE", "DemoChatModel"]

DEMO_NOTICE = (
    "(Bernard is running on its offline demo model; "
    "set OPENAI_BASE_URL and OPENAI_API_KEY to use a real LLM.)"
)

_TIME_WORDS = re.compile(r"\b(?:time|date|clock)\b", re.IGNORECASE)
_TIMEZONE = re.compile(
    r"\b(?:(?:Africa|America|Antarctica|Asia|Atlantic|Australia|Europe|Indian|Pacific|Etc)"
    r"/[A-Za-z_\-]+(?:/[A-Za-z_\-]+)?|UTC|GMT)\b",
    re.IGNORECASE,
)
# Digits joined by at least one operator the calculator tool understands, with parentheses.
_NUMBER = r"\(*\s*-?\d+(?:\.\d+)?\s*\)*"
_ARITHMETIC = re.compile(rf"{_NUMBER}(?:\s*(?:\*\*|//|[-+*/%])\s*{_NUMBER})+")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_WORDS = re.compile(r"\s*\S+")
_TOKENS = re.compile(r"\w+|[^\w\s]")
_QUOTE_MAX_CHARS = 120


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts = (p if isinstance(p, str) else p.get("text", "") for p in content)
    return "".join(p for p in parts if isinstance(p, str))


def _count_tokens(text: str) -> int:
    # A rough stand-in for a tokenizer: words and punctuation marks.
    return len(_TOKENS.findall(text))


def _find_timezone(text: str) -> str:
    match = _TIMEZONE.search(text)
    if match is None:
        return "UTC"
    name = match.group(0)
    return name.upper() if name.upper() in {"UTC", "GMT"} else name


def _find_expression(text: str) -> str | None:
    match = _ARITHMETIC.search(text)
    if match is None:
        return None
    expression = match.group(0).strip()
    if _ISO_DATE.fullmatch(expression):
        return None  # "2024-01-05" is a date, not a subtraction
    # The number pattern may swallow parentheses that do not pair up; drop the excess.
    while expression.count("(") > expression.count(")") and expression.startswith("("):
        expression = expression[1:].lstrip()
    while expression.count(")") > expression.count("(") and expression.endswith(")"):
        expression = expression[:-1].rstrip()
    return expression


def _tool_name(tool: dict[str, Any]) -> str:
    return str(tool.get("function", {}).get("name") or tool.get("name") or "")


def _forced_tool(tool_choice: Any) -> str | None:
    """The one tool a `tool_choice` names, if it names one."""
    if isinstance(tool_choice, dict):
        return str(tool_choice.get("function", {}).get("name") or tool_choice.get("name") or "")
    if isinstance(tool_choice, str) and tool_choice not in {"auto", "any", "required", "none"}:
        return tool_choice
    return None


class DemoChatModel(BaseChatModel):
    """A deterministic, offline chat model: a keyword tool router and a templated answer."""

    model_name: str = "bernard-demo"
    token_delay_s: float = 0.02
    """Pause between streamed tokens, so the demo visibly streams."""

    @property
    def _llm_type(self) -> str:
        return "bernard-demo"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools as OpenAI tool schemas, the same shape `ChatOpenAI` sends upstream."""
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def plan(self, messages: Sequence[BaseMessage], **kwargs: Any) -> AIMessage:
        """The whole answer to `messages` as one message: tool calls, or text with usage."""
        tool_calls = self._route(messages, kwargs.get("tools") or [], kwargs.get("tool_choice"))
        if tool_calls:
            content = ""
            output_tokens = sum(3 + _count_tokens(json.dumps(c["args"])) for c in tool_calls)
        else:
            content = self._answer(messages)
            output_tokens = len(_WORDS.findall(content))
        input_tokens = sum(4 + _count_tokens(_text(m)) for m in messages)
        return AIMessage(
            content=content,
            tool_calls=tool_calls,
            usage_metadata={
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
            },
            response_metadata={
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "model_name": self.model_name,
            },
        )

    def _route(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]], tool_choice: Any
    ) -> list[ToolCall]:
        names = {_tool_name(t) for t in tools}
        if not names or tool_choice == "none":
            return []
        last_human = _last_human_index(messages)
        question = _text(messages[last_human]) if last_human is not None else ""
        answered = last_human is not None and any(
            isinstance(m, ToolMessage) for m in messages[last_human + 1 :]
        )

        wanted: list[tuple[str, dict[str, Any]]] = []
        if not answered:
            if _TIME_WORDS.search(question):
                wanted.append(("get_time", {"timezone": _find_timezone(question)}))
            if (expression := _find_expression(question)) is not None:
                wanted.append(("calculator", {"expression": expression}))
        wanted = [(name, args) for name, args in wanted if name in names]
        forced = _forced_tool(tool_choice)
        if forced is not None and forced in names:
            wanted = [w for w in wanted if w[0] == forced] or [(forced, {})]
        elif not wanted and "respond" in names:
            wanted = [("respond", {})]

        # Ids continue the conversation's count, so they are unique and repeatable.
        seen = sum(len(m.tool_calls) for m in messages if isinstance(m, AIMessage))
        return [
            tool_call(name=name, args=args, id=f"call_demo_{seen + i + 1}")
            for i, (name, args) in enumerate(wanted)
        ]

    def _answer(self, messages: Sequence[BaseMessage]) -> str:
        last_human = _last_human_index(messages)
        if last_human is None:
            return f"Hello! I'm Bernard. {DEMO_NOTICE}"
        question = " ".join(_text(messages[last_human]).split())
        if len(question) > _QUOTE_MAX_CHARS:
            question = question[: _QUOTE_MAX_CHARS - 1].rstrip() + "…"
        later = messages[last_human + 1 :]
        calls = {c["id"]: c for m in later if isinstance(m, AIMessage) for c in m.tool_calls}
        results = [
            _summarize(m, calls.get(m.tool_call_id))
            for m in later
            if isinstance(m, ToolMessage) and (m.name or "") != "respond"
        ]
        results = [r for r in results if r]
        if results:
            body = " ".join(results)
        else:
            body = (
                "I can tell the time and do arithmetic: try "
                '"What time is it in Europe/Paris?" or "What is (2 + 3) * 4?".'
            )
        stop = "" if question.endswith((".", "?", "!", "…")) else "."
        return f'You said: "{question}"{stop} {body} {DEMO_NOTICE}'

    def _chunks(self, messages: list[BaseMessage], **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        message = self.plan(messages, **kwargs)
        if message.tool_calls:
            for index, call in enumerate(message.tool_calls):
                args = json.dumps(call["args"])
                chunk = tool_call_chunk(name=call["name"], args=args, id=call["id"], index=index)
                yield ChatGenerationChunk(
                    message=AIMessageChunk(content="", tool_call_chunks=[chunk])
                )
        else:
            for token in _WORDS.findall(str(message.content)):
                yield ChatGenerationChunk(message=AIMessageChunk(content=token))
        last = AIMessageChunk(
            content="",
            usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata,
            chunk_position="last",
        )
        yield ChatGenerationChunk(message=last)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.plan(messages, **kwargs))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # No I/O: answering inline beats the default hop to a thread.
        return self._generate(messages, stop, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for i, chunk in enumerate(self._chunks(messages, **kwargs)):
            if i and self.token_delay_s > 0:
                time.sleep(self.token_delay_s)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for i, chunk in enumerate(self._chunks(messages, **kwargs)):
            if i and self.token_delay_s > 0:
                await asyncio.sleep(self.token_delay_s)
            yield chunk


def _last_human_index(messages: Sequence[BaseMessage]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], HumanMessage):
            return index
    return None


def _summarize(result: ToolMessage, call: ToolCall | None) -> str:
    """One sentence about one tool result, for the templated answer."""
    name = result.name or (call["name"] if call else "tool")
    args = call["args"] if call else {}
    content = " ".join(_text(result).split()).rstrip(".")
    if result.status == "error" or content.startswith("Error"):
        return f"The {name} tool reported a problem: {content}."
    if name == "get_time":
        return f"The time in {args.get('timezone', 'UTC')} is {content}."
    if name == "calculator" and "expression" in args:
        return f"The result of {args['expression']} is {content}."
    if name == "calculator":
        return f"The result is {content}."
    return f"The {name} tool returned: {content}."
