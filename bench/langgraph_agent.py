"""The LangGraph agent the bench sets beside Bernard (bench/first_word.py in the load
generator's process, bench/langgraph_app.py behind FastAPI): the prebuilt ReAct agent on
`ChatOpenAI` with the calculator, and the text its model streams."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from worker.tools import calculator


def react_agent(**model_options: Any) -> Any:
    """The agent; `model_options` go to `ChatOpenAI` (without them it reads `OPENAI_*` from
    the environment)."""
    from langgraph.prebuilt import create_react_agent

    model = ChatOpenAI(model="gpt-4o-mini", max_retries=0, streaming=True, **model_options)
    return create_react_agent(model, [calculator])


async def text_pieces(agent: Any, messages: list[dict[str, Any]]) -> AsyncIterator[str]:
    """The text of the agent's answer to `messages`, piece by piece as its model streams."""
    async for message, _ in agent.astream({"messages": messages}, stream_mode="messages"):
        if isinstance(message, AIMessageChunk) and (piece := message.text):
            yield piece
