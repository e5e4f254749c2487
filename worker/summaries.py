"""The summary job: folds a conversation's older messages into its running summary.

A turn asks for it (worker/harness/memory.py) when the messages its prompt no longer holds,
and the summary does not cover yet, reach `BERNARD_SUMMARY_THRESHOLD_MESSAGES`; one job is
queued per conversation at a time, so it runs once per crossing, never on a turn's path. It
is its owner's background job (shared/queue.py): over their budget or the deployment's it
is not queued, and every later turn that finds the summary behind asks again.
It reads the summary and the messages after it up to where the turn that asked for it
started its prompts' messages (at most `_MAX_MESSAGES` at once; the rest wait for the next
crossing), asks the router
model for the new summary, and stores it with the position of the last message it covers.
A failed call leaves the previous summary in place. The job carries the incarnation of the
conversation it was asked for in (shared/conversation_state.py): after a delete and a
re-creation under the same id it summarizes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage

from shared.records.keeper import RecordKeeper
from shared.records.messages import Message
from shared.settings import Settings
from worker.llm import Llm, LlmError

logger = logging.getLogger("bernard.worker")

_MAX_MESSAGES = 400
_SUMMARY_MAX_CHARS = 6_000

SUMMARY_PROMPT = (
    "You keep the running summary of a conversation between a user and an assistant. Fold "
    "the new messages into the summary: keep facts, names, decisions, preferences, open "
    "questions and what tools did; drop small talk. Write at most 300 words, in plain "
    "sentences, third person. Answer with the summary alone."
)


async def summarize(
    redis: Any,
    router: Llm,
    settings: Settings,
    owner: str,
    conversation_id: str,
    until: int,
    *,
    incarnation: str | None = None,
) -> str:
    """Fold the messages before position `until` (where the prompts' messages started when
    the job was asked for) into the summary of the conversation's `incarnation` the job was
    asked for in (None, for a job queued before jobs carried it: the one it finds); what
    happened ("summarized", "nothing", "failed")."""
    keeper = RecordKeeper(redis, owner, retention_s=settings.conversation_retention_s)
    conversation = await keeper.get_conversation(conversation_id)
    if conversation is None:
        return "nothing"  # deleted since
    if incarnation is not None and conversation.incarnation != incarnation:
        # Deleted and created again under its id since: `until` counted another
        # conversation's messages, and this one's turns ask for their own summary.
        return "nothing"
    summary = await keeper.summary(conversation_id)
    covers = int(summary["covers_to"]) if summary else 0
    if until - 1 - covers < settings.summary_threshold_messages:
        # A job that ran since this one was asked for already folded most of them in.
        return "nothing"
    end = min(until - 1, covers + _MAX_MESSAGES)
    fresh = await keeper.older(conversation_id, end + 1, end - covers)
    prompt = [
        SystemMessage(SUMMARY_PROMPT),
        HumanMessage(
            f"Summary so far:\n{summary['text'] if summary else '(none yet)'}\n\n"
            f"New messages:\n{_transcript(fresh)}"
        ),
    ]
    try:
        result = await router.complete(prompt)
    except LlmError as exc:
        logger.warning("summary of %s failed (%s); the previous one stays", conversation_id, exc)
        return "failed"
    text = str(result.message.content).strip()[:_SUMMARY_MAX_CHARS]
    if not text:
        return "failed"
    # Not into the conversation created again under its id while the model wrote.
    await keeper.save_summary(conversation_id, text, end, incarnation=conversation.incarnation)
    return "summarized"


def _transcript(rows: list[Message]) -> str:
    lines = []
    for row in rows:
        content = row.get("content") or ""
        if row.get("tool_calls"):
            calls = ", ".join(c["function"]["name"] for c in row["tool_calls"])
            content = f"{content} [called {calls}]".strip()
        lines.append(f"{row['role']}: {content}")
    return "\n".join(lines)
