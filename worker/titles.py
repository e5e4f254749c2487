"""The title job: names a conversation after its first exchange.

The turn that stores a conversation's first answer asks for it (worker/recording.py), with
`BERNARD_CONVERSATION_TITLES` on; it is its owner's background job (shared/queue.py,
`title:<owner>/<conversation>`), so it runs off the turn's path, one per conversation at a
time, and over the owner's or the deployment's budget it is not queued. It reads the first
user message and the first answer, asks the router model for a short title
(shared/titles.py: `TITLE_PROMPT`, `clean_title`), and stores it into the incarnation it
read, unless a title is there by then (a user's is never replaced). A failed call, or a
job over budget, leaves the conversation untitled until its user names it
(`PATCH /v1/conversations/{id}`).
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage

from shared.records.keeper import RecordKeeper
from shared.records.messages import Message
from shared.settings import Settings
from shared.titles import TITLE_PROMPT, TitleSource, clean_title
from worker.llm import Llm, LlmError

logger = logging.getLogger("bernard.worker")

# The first rows read: the first user message and the answer are among them but for a
# turn with many tool calls, where the first user message is enough.
_FIRST_ROWS = 20
# What of each message the model reads: a title needs the gist, not a pasted document.
_EXCERPT_CHARS = 1_000


class Titled(StrEnum):
    """What the title job did (its arq result)."""

    TITLED = "titled"
    NOTHING = "nothing"  # deleted since, titled already, or nothing to name it after
    FAILED = "failed"


async def name_conversation(
    redis: Any, router: Llm, settings: Settings, owner: str, conversation_id: str
) -> Titled:
    """Give the owner's conversation a title made of its first exchange, unless it has one."""
    keeper = RecordKeeper(redis, owner, retention_s=settings.conversation_retention_s)
    conversation = await keeper.get_conversation(conversation_id)
    if conversation is None or conversation.title is not None:
        return Titled.NOTHING
    first = await keeper.older(conversation_id, _FIRST_ROWS + 1, _FIRST_ROWS)
    exchange = _first_exchange(first)
    if not exchange:
        return Titled.NOTHING
    prompt = [SystemMessage(TITLE_PROMPT), HumanMessage(exchange)]
    try:
        result = await router.complete(prompt)
    except LlmError as exc:
        logger.warning("title of %s failed (%s); it stays untitled", conversation_id, exc)
        return Titled.FAILED
    title = clean_title(str(result.message.content))
    if title is None:
        return Titled.FAILED
    stored = await keeper.save_title(
        conversation_id, title, TitleSource.GENERATED, incarnation=conversation.incarnation
    )
    return Titled.TITLED if stored else Titled.NOTHING


def _first_exchange(rows: list[Message]) -> str:
    """The first user message and the first answer after it, as the model reads them."""
    lines: list[str] = []
    for row in rows:
        content = row.get("content")
        if not isinstance(content, str) or not content.strip():
            continue  # a tool call's message, or parts the title can do without
        if row["role"] == "user" and not lines:
            lines.append(f"user: {_excerpt(content)}")
        elif row["role"] == "assistant" and lines and not row.get("tool_calls"):
            lines.append(f"assistant: {_excerpt(content)}")
            break
    return "\n".join(lines)


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT_CHARS else text[: _EXCERPT_CHARS - 1] + "…"
