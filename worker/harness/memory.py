"""Memory: what of a conversation the turn's prompts hold, within the model's context.

The records keep every message (shared/records/keeper.py); a prompt holds, within
`BERNARD_CONTEXT_MAX_TOKENS` less the share kept for the answer:

- the system prompt (the client's, pinned even when its conversation grew long),
- the user's notes (shared/notes.py) as long-term memory, within `BERNARD_NOTES_MAX_TOKENS`,
- the running summary of the older messages, when there is one,
- as many of the latest messages as fit, whole, and never a tool result without the
  assistant message that called it (nor that message without its results). An answer
  stored unfinished (`stopped`: shared/records/messages.py) ends with a note saying where
  and why it was cut, so the model knows the user did not hear the rest.

Reading is linear in what it reads and stops once the budget is spent: the latest rows the
runner already read, then older ones a chunk at a time. When the messages left outside the
prompt and not yet in the summary reach `BERNARD_SUMMARY_THRESHOLD_MESSAGES`, the turn asks
for a summary job (worker/summaries.py), which runs off the turn's path: no turn waits for it.
Every such turn asks, so one whose job was not queued (its owner's background budget was
spent: shared/queue.py) is followed by another that asks again.

The stage runs first and yields a `memory` trace event saying what it chose.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import orjson
from langchain_core.messages import SystemMessage, convert_to_messages
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from shared.errors import ErrorCode
from shared.events import Event, Memory
from shared.notes import NoteStore
from shared.records.messages import STOPPED, Message, row_position, to_openai_message
from worker.context import ConversationGoneError, TurnContext
from worker.tokens import Encode, counter_for, message_tokens

# Older rows read at a time once the ones at hand are all in the prompt.
_CHUNK = 64
SUMMARY_HEADING = "Summary of the earlier conversation (older messages are not shown):"
NOTES_HEADING = "What the user asked you to remember (their notes):"
# What the model reads after an answer stored unfinished, by its turn's ending.
STOPPED_NOTES: dict[str, str] = {
    ErrorCode.TURN_INTERRUPTED: "[Interrupted here: the user spoke over this answer with the "
    "message that follows, so they did not hear the rest.]",
    ErrorCode.TURN_CANCELLED: "[Stopped here by the user before it was finished.]",
}


# Each tool's schema in tokens, by (tool, counter), the tool kept with it so that no id in a
# key is reused while it is cached: a worker offers the same few tools on every turn, and
# converting ten schemas cost 0.24 ms of every turn's first token.
_SCHEMA_TOKENS: dict[tuple[int, int], tuple[BaseTool, int]] = {}
_SCHEMA_CACHE = 256


def schema_tokens(tool: BaseTool, count: Encode) -> int:
    """Tokens of `tool`'s schema as the model receives it."""
    key = (id(tool), id(count))
    cached = _SCHEMA_TOKENS.get(key)
    if cached is None:
        if len(_SCHEMA_TOKENS) >= _SCHEMA_CACHE:
            _SCHEMA_TOKENS.clear()
        cached = (tool, count(orjson.dumps(convert_to_openai_tool(tool)).decode()))
        _SCHEMA_TOKENS[key] = cached
    return cached[1]


def select(
    rows: Sequence[Mapping[str, Any]],
    budget: int,
    count: Encode,
    *,
    used: int = 0,
    sizes: dict[int, int] | None = None,
) -> tuple[list[Mapping[str, Any]], int, bool]:
    """The latest whole units of `rows` (a message, or an assistant tool-call message with
    its results) that fit `budget` tokens beyond `used`; the tokens then used; whether every
    row fitted. The newest unit is kept even alone over budget: a prompt needs the question.

    `sizes` remembers each row's tokens by its identity, for a caller that selects again
    over the same rows with older ones before them: each row is counted once.
    """
    sizes = {} if sizes is None else sizes

    def tokens(message: Mapping[str, Any]) -> int:
        size = sizes.get(id(message))
        if size is None:
            size = sizes[id(message)] = message_tokens(message, count)
        return size

    # What is kept is always a suffix of `rows`: `rows[end:]`.
    end = len(rows)
    while end > 0:
        start = end - 1
        while start > 0 and rows[start].get("role") == "tool":
            start -= 1
        size = sum(tokens(m) for m in rows[start:end])
        if (end < len(rows) or used) and used + size > budget:
            return _whole(list(rows[end:])), used, False
        used += size
        end = start
    return _whole(list(rows)), used, True


def _whole(kept: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Without the tool results at its start whose call fell outside it."""
    start = 0
    while start < len(kept) and kept[start].get("role") == "tool":
        start += 1
    return kept[start:]


def render_notes(texts: Sequence[str], limit: int, count: Encode) -> str | None:
    """The notes as one message, newest kept first when they do not all fit."""
    lines: list[str] = []
    used = count(NOTES_HEADING)
    for text in reversed(texts):
        line = f"- {text}"
        cost = count(line) + 1
        if used + cost > limit:
            break
        lines.insert(0, line)
        used += cost
    return "\n".join([NOTES_HEADING, *lines]) if lines else None


async def _summary(ctx: TurnContext) -> dict[str, Any] | None:
    if ctx.archivist is None or ctx.conversation_id is None:
        return None
    return await ctx.archivist.summary(ctx.conversation_id)


async def _note_texts(ctx: TurnContext) -> list[str]:
    if ctx.runtime is None:
        return []
    store = NoteStore.of(ctx.runtime.redis, ctx.runtime.owner, ctx.settings)
    return [note.text for note in await store.all()]


async def memory_harness(ctx: TurnContext) -> AsyncIterator[Event]:
    """Fill `ctx.history` and `ctx.memory` within the budget; yield what was chosen."""
    from worker.harness.router import ROUTER_PROMPT  # the router imports the context too

    settings = ctx.settings
    count = counter_for(ctx.responder.name)
    memory: list[str] = []
    # Two reads of their own keys: at once, in one round trip's time rather than two.
    summary, note_texts = await asyncio.gather(_summary(ctx), _note_texts(ctx))
    notes = render_notes(note_texts, settings.notes_max_tokens, count)
    if notes is not None:
        memory.append(notes)
    if summary is not None:
        memory.append(f"{SUMMARY_HEADING}\n{summary['text']}")

    # The conversation the history is read from: the turn's own, or the one an unstored
    # continuation runs on (`history_of`), which it never writes to.
    source, rows = ctx.conversation_id, list(ctx.stored or ())
    if ctx.stored is None:
        source, earlier = await _history_of(ctx)
        rows = [*earlier, *(to_openai_message(m) for m in ctx.request.messages)]
    system = _pinned_system(rows)
    fixed = (
        max(count(ROUTER_PROMPT), count(settings.system_prompt))
        + sum(count(text) for text in memory)
        + sum(schema_tokens(tool, count) for tool in ctx.tools)
        # The client's own tools go to the router beside Bernard's (worker/harness/router.py).
        + sum(count(orjson.dumps(tool).decode()) for tool in ctx.request.client_tools)
    )
    budget = settings.context_max_tokens - settings.context_answer_tokens - fixed
    # Each row's tokens, counted once however often the loop below selects again.
    sizes: dict[int, int] = {}
    kept, used, complete = select(rows, budget, count, sizes=sizes)
    first = _position(kept[0]) if kept else None
    # Everything at hand fitted: older messages may fit too, read a chunk at a time.
    while complete and first is not None and first > 1 and ctx.archivist is not None:
        assert source is not None
        older = await ctx.archivist.older(source, first, _CHUNK)
        kept, used, complete = select([*older, *kept], budget, count, sizes=sizes)
        if not older or _position(kept[0]) == first:
            break
        first = _position(kept[0])
    if system is None and first is not None and first > 1 and ctx.archivist is not None:
        assert source is not None
        opening = await ctx.archivist.older(source, 2, 1)
        system = _pinned_system(opening)
    if system is not None and system not in kept:
        kept.insert(0, system)

    ctx.history = list(convert_to_messages([_plain(m) for m in kept]))
    ctx.memory = [SystemMessage(text) for text in memory]
    covers = int(summary["covers_to"]) if summary is not None else 0
    outside = (first or 1) - 1 - covers  # messages neither in the prompt nor the summary
    if ctx.conversation_id is not None and outside >= settings.summary_threshold_messages:
        ctx.summary_until = first
    yield Memory(
        kept=len(kept),
        stored=(_position(rows[-1]) or len(rows)) if rows else 0,
        summary_covers=covers if summary is not None else None,
        notes=len(memory) - (summary is not None),
        tokens=used + fixed,
        budget=budget,
    )


async def _history_of(ctx: TurnContext) -> tuple[str | None, list[Message]]:
    """The conversation an unstored continuation runs on (`AgentRequest.history_of`), and
    its latest rows up to the message it continues from (as many as a request may hold:
    older ones are read as the prompt has room, as a stored turn's are); none without one.
    Raises `ConversationGoneError` once that conversation no longer holds them."""
    history = ctx.request.history_of
    if history is None or ctx.archivist is None:
        return None, []
    conversation_id, through = str(history["conversation_id"]), int(history["through"])
    rows = await ctx.archivist.older(conversation_id, through + 1, ctx.settings.max_messages)
    if not rows or _position(rows[-1]) != through:
        raise ConversationGoneError(conversation_id)
    return conversation_id, rows


def _pinned_system(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The client's own system prompt, when the rows open with one."""
    if rows and rows[0].get("role") in ("system", "developer") and _position(rows[0]) in (None, 1):
        return rows[0]
    return None


def _position(row: Mapping[str, Any]) -> int | None:
    try:
        return row_position(str(row.get("id", "")))
    except ValueError:
        return None


def _plain(row: Mapping[str, Any]) -> Message:
    """A stored row as the model reads it (LangChain wants text where a call has none)."""
    message = to_openai_message(row)
    message["content"] = message.get("content") or ""
    note = STOPPED_NOTES.get(str(row.get(STOPPED) or ""))
    if note:
        message["content"] = f"{message['content']}\n\n{note}".lstrip()
    if message["role"] == "developer":
        message["role"] = "system"
    return message
