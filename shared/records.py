"""The record keeper: conversations, their messages and their LLM and tool calls, in Redis.

Split by who may do what (seed 002): harnesses get an `Archivist`, which only reads; the
turn runner gets a `Recorder`, which writes. `RecordKeeper` is both, and hands out each half
as a separate object, so a harness given `as_archivist()` cannot write even by mistake.

Layout, all under one hash tag so a Lua script may touch every key of a conversation:

- `keys.conversation(id)`: hash `id`, `owner`, `created_at`, `updated_at` (epoch seconds).
- `keys.conversation_messages(id)`: list of orjson messages in OpenAI chat shape, oldest
  first: `{role, content, name?, tool_call_id?, tool_calls?}`.
- `keys.conversation_calls(id)`: append-only list of call events (`started`, then
  `completed`), merged per `call_id` on read. Appending instead of updating a record in
  place keeps every write one race-free `RPUSH`.

Clients resend the whole history with every request; `new_messages()` picks out what is not
stored yet, and `Recorder.append_new_messages()` does that and the append atomically.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from langchain_core.messages import BaseMessage, convert_to_openai_messages
from redis.asyncio import Redis

from shared import keys

__all__ = [
    "Archivist",
    "CallKind",
    "Continuation",
    "Conversation",
    "ConversationExistsError",
    "ConversationNotFoundError",
    "Message",
    "RecordKeeper",
    "Recorder",
    "new_call_id",
    "new_messages",
    "to_openai_message",
]

Message = dict[str, Any]
CallKind = Literal["llm", "tool"]
MessageLike = Mapping[str, Any] | BaseMessage

_OPTIONAL_FIELDS = ("name", "tool_call_id", "tool_calls")
_SYSTEM_ROLES = frozenset({"system", "developer"})
# Optimistic retries of append_new_messages before giving up: each retry means another
# writer appended in between, which for one conversation is rare.
_APPEND_RETRIES = 10

# KEYS: meta, list. ARGV: expected length ('' for any), now, item... Appends only to an
# existing conversation, so a stray write never creates a list without its metadata, and
# with an expected length only if the list still has it, so the history a caller compared
# against is the one it extends. Returns the new length, -1 for no conversation, -2 when
# the list changed since the caller read it.
_APPEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if ARGV[1] ~= '' and redis.call('LLEN', KEYS[2]) ~= tonumber(ARGV[1]) then return -2 end
for i = 3, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[2])
return redis.call('LLEN', KEYS[2])
"""

# KEYS: meta. ARGV: id, owner, now.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'owner', ARGV[2],
           'created_at', ARGV[3], 'updated_at', ARGV[3])
return 1
"""


@dataclass(slots=True)
class Continuation:
    """What continuing a conversation stored: the `new` messages, and the whole `history`
    (oldest first) they now end."""

    new: list[Message]
    history: list[Message]


class ConversationNotFoundError(LookupError):
    """No conversation has this id."""


class ConversationExistsError(ValueError):
    """A conversation with this id already exists."""


@dataclass(slots=True)
class Conversation:
    """A conversation's metadata."""

    id: str
    owner: str
    created_at: float
    updated_at: float
    message_count: int


def new_call_id() -> str:
    """A fresh id for an LLM or tool call record."""
    return f"call_{uuid.uuid4().hex}"


def to_openai_message(message: MessageLike) -> Message:
    """`message` (an OpenAI-shaped mapping or a LangChain message) as a plain OpenAI dict.

    Keeps `role` and `content` (`None` when absent) plus `name`, `tool_call_id` and
    `tool_calls` when set; any other key is dropped. Raises `ValueError` without a role.
    """
    if isinstance(message, BaseMessage):
        message = convert_to_openai_messages(message)
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ValueError(f"message without a role: {message!r}")
    out: Message = {"role": role, "content": message.get("content")}
    for name in _OPTIONAL_FIELDS:
        if message.get(name) is not None:
            out[name] = message[name]
    return out


def new_messages(
    stored: Sequence[Mapping[str, Any]], requested: Sequence[MessageLike]
) -> list[Message]:
    """The messages of `requested` that continue `stored` rather than repeat it.

    A client's request is usually the stored history, perhaps trimmed at the front and
    without the tool messages it never saw, followed by the new messages. Both sides are
    reduced to their user messages and the assistant messages with text, compared by
    (role, text); the longest run at the start of the request that equals the end of the
    stored history is the repeat, and everything after it is new. The stored router steps
    (assistant messages carrying tool calls) never reached the client as text, so they are
    left out of the comparison.

    - Nothing stored: the whole request is new, system messages included.
    - No overlap: the request's trailing turn (the messages after its last assistant or
      system message) is new.
    - The request only repeats the stored history (a retry): nothing is new.
    """
    request = [to_openai_message(m) for m in requested]
    history = [key for m in stored if (key := _match_key(m, stored=True)) is not None]
    if not history:
        return request
    positions = [i for i, m in enumerate(request) if _match_key(m, stored=False) is not None]
    sent = [_match_key(request[i], stored=False) for i in positions]
    for overlap in range(min(len(sent), len(history)), 0, -1):
        start = len(history) - overlap
        if all(sent[i] == history[start + i] for i in range(overlap)):
            return request[positions[overlap - 1] + 1 :]
    return _trailing_turn(request)


class _Store:
    """A Redis client and the scripts the record keeper runs on it."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._append = redis.register_script(_APPEND)
        self._create = redis.register_script(_CREATE)


class Archivist(_Store):
    """Read-only access to conversations: what harnesses get to build their prompts."""

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        """The conversation's metadata (owner included), or `None` if there is none."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.conversation(conversation_id))
            pipe.llen(keys.conversation_messages(conversation_id))
            raw, count = await pipe.execute()
        if not raw:
            return None
        meta = {_text(k): _text(v) for k, v in raw.items()}
        return Conversation(
            id=meta["id"],
            owner=meta["owner"],
            created_at=float(meta["created_at"]),
            updated_at=float(meta["updated_at"]),
            message_count=int(count),
        )

    async def messages(
        self,
        conversation_id: str,
        *,
        roles: str | Collection[str] | None = None,
        limit: int | None = None,
    ) -> list[Message]:
        """Stored messages, oldest first: those with one of `roles`, the last `limit` of them.

        `limit` counts after the role filter, so `roles={"user"}, limit=3` is the last three
        user messages.
        """
        if limit is not None and limit <= 0:
            return []
        wanted = {roles} if isinstance(roles, str) else set(roles) if roles is not None else None
        # Without a role filter Redis can cut the list itself.
        start = -limit if limit is not None and wanted is None else 0
        list_key = keys.conversation_messages(conversation_id)
        # redis-py types its commands as sync-or-async; the client here is always async.
        raw = await self._redis.lrange(list_key, start, -1)  # type: ignore[misc]
        found = [orjson.loads(item) for item in raw]
        if wanted is not None:
            found = [m for m in found if m.get("role") in wanted]
        return found[-limit:] if limit is not None else found

    async def calls(self, conversation_id: str, *, kind: CallKind | None = None) -> list[Message]:
        """Recorded LLM and tool calls, in the order they started, one dict per call.

        Every call has `call_id`, `kind`, `turn_id`, `status` (`running`, `completed` or
        `failed`), `started_at`, and once completed `completed_at` and `latency_ms`.
        LLM calls add `stage`, `model`, `usage`, `error` and (if recorded) the prompt
        `messages`; tool calls add `tool_call_id`, `name`, `arguments` and the whole `content`.
        """
        calls_key = keys.conversation_calls(conversation_id)
        raw = await self._redis.lrange(calls_key, 0, -1)  # type: ignore[misc]
        merged: dict[str, Message] = {}
        for item in raw:
            entry = orjson.loads(item)
            event, at = entry.pop("event"), entry.pop("at")
            record = merged.setdefault(entry["call_id"], {"status": "running"})
            record.update(entry)
            record["started_at" if event == "started" else "completed_at"] = at
        records = list(merged.values())
        return [r for r in records if r["kind"] == kind] if kind is not None else records


class Recorder(_Store):
    """Write access to conversations: what the turn runner records a turn with."""

    async def create_conversation(self, owner: str, *, conversation_id: str | None = None) -> str:
        """Create a conversation owned by `owner` and return its id.

        Pass `conversation_id` to choose the id (e.g. one a client sent); raises
        `ConversationExistsError` when it is taken.
        """
        new_id = conversation_id or f"conv_{uuid.uuid4().hex}"
        created = await self._create(
            keys=[keys.conversation(new_id)], args=[new_id, owner, repr(time.time())]
        )
        if not int(created):
            raise ConversationExistsError(new_id)
        return new_id

    async def append_messages(self, conversation_id: str, messages: Iterable[MessageLike]) -> int:
        """Append `messages` (in one atomic step) and return how many the conversation holds.

        Raises `ConversationNotFoundError` for an unknown conversation, `ValueError` for a
        message without a role.
        """
        items = [orjson.dumps(to_openai_message(m)) for m in messages]
        return await self._push(conversation_id, keys.conversation_messages(conversation_id), items)

    async def append_new_messages(
        self, conversation_id: str, requested: Sequence[MessageLike]
    ) -> Continuation:
        """Append what `new_messages()` finds new in `requested`; return it and the history.

        Reading the history and appending are optimistic (the append is refused if the list
        changed since the read), so two requests continuing the same conversation at once
        cannot both append the same turn. Two round trips when nobody else writes.
        """
        meta_key = keys.conversation(conversation_id)
        list_key = keys.conversation_messages(conversation_id)
        for _ in range(_APPEND_RETRIES):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.exists(meta_key)
                pipe.lrange(list_key, 0, -1)
                exists, raw = await pipe.execute()
            if not exists:
                raise ConversationNotFoundError(conversation_id)
            stored = [orjson.loads(item) for item in raw]
            fresh = new_messages(stored, requested)
            if not fresh:
                return Continuation(new=[], history=stored)
            items = [orjson.dumps(m) for m in fresh]
            if await self._push(conversation_id, list_key, items, expected_length=len(raw)) >= 0:
                return Continuation(new=fresh, history=[*stored, *fresh])
        raise RuntimeError(f"conversation {conversation_id} kept changing while appending")

    async def llm_call_started(
        self,
        conversation_id: str,
        turn_id: str,
        stage: str,
        model: str,
        *,
        messages: Iterable[MessageLike] | None = None,
        call_id: str | None = None,
    ) -> str:
        """Record that a model call began and return its `call_id` (`new_call_id()` unless
        given: a caller that records in the background needs the id before the write).

        `messages`, the prompt, is stored only when given: it repeats the history on every
        call, so the caller decides whether the trace is worth the space.
        """
        call_id = call_id or new_call_id()
        entry: Message = {"kind": "llm", "turn_id": turn_id, "stage": stage, "model": model}
        if messages is not None:
            entry["messages"] = [to_openai_message(m) for m in messages]
        await self._call_event(conversation_id, call_id, "started", entry)
        return call_id

    async def llm_call_completed(
        self,
        conversation_id: str,
        call_id: str,
        *,
        latency_ms: float,
        usage: Mapping[str, int] | None = None,
        error: str | None = None,
    ) -> None:
        """Record that the model call `call_id` ended, with its token `usage` or `error`."""
        entry: Message = {
            "kind": "llm",
            "status": "failed" if error else "completed",
            "latency_ms": latency_ms,
            "usage": dict(usage) if usage is not None else None,
            "error": error,
        }
        await self._call_event(conversation_id, call_id, "completed", entry)

    async def tool_call_started(
        self,
        conversation_id: str,
        turn_id: str,
        *,
        tool_call_id: str,
        name: str,
        arguments: str,
        call_id: str | None = None,
    ) -> str:
        """Record that a tool began running and return the record's `call_id`.

        `tool_call_id` is the model's id for the call; `call_id` is ours (`new_call_id()`
        unless given), unique even when a provider reuses tool call ids across steps.
        """
        call_id = call_id or new_call_id()
        entry: Message = {
            "kind": "tool",
            "turn_id": turn_id,
            "tool_call_id": tool_call_id,
            "name": name,
            "arguments": arguments,
        }
        await self._call_event(conversation_id, call_id, "started", entry)
        return call_id

    async def tool_call_completed(
        self,
        conversation_id: str,
        call_id: str,
        *,
        latency_ms: float,
        content: str,
        status: Literal["success", "error"] = "success",
    ) -> None:
        """Record that the tool call `call_id` ended; `content` is stored whole, never cut."""
        entry: Message = {
            "kind": "tool",
            "status": "completed" if status == "success" else "failed",
            "latency_ms": latency_ms,
            "content": content,
        }
        await self._call_event(conversation_id, call_id, "completed", entry)

    async def _call_event(
        self, conversation_id: str, call_id: str, event: str, entry: Message
    ) -> None:
        item = orjson.dumps({"call_id": call_id, "event": event, "at": time.time(), **entry})
        await self._push(conversation_id, keys.conversation_calls(conversation_id), [item])

    async def _push(
        self,
        conversation_id: str,
        list_key: str,
        items: list[bytes],
        *,
        expected_length: int | None = None,
    ) -> int:
        """Append `items`; the new length, or -2 if the list no longer has `expected_length`."""
        length = int(
            await self._append(
                keys=[keys.conversation(conversation_id), list_key],
                args=[
                    "" if expected_length is None else expected_length,
                    repr(time.time()),
                    *items,
                ],
            )
        )
        if length == -1:
            raise ConversationNotFoundError(conversation_id)
        return length


class RecordKeeper(Archivist, Recorder):
    """Both halves on one client, for the code that wires a turn together.

    Hand harnesses `as_archivist()` and the turn runner `as_recorder()`: each returns an
    object of just that class, so the other half's methods do not exist on it.
    """

    def as_archivist(self) -> Archivist:
        """A read-only view on the same Redis client."""
        return Archivist(self._redis)

    def as_recorder(self) -> Recorder:
        """A write-only view on the same Redis client."""
        return Recorder(self._redis)


def _match_key(message: Mapping[str, Any], *, stored: bool) -> tuple[str, str] | None:
    role = message.get("role")
    if role not in ("user", "assistant"):
        return None
    if stored and role == "assistant" and message.get("tool_calls"):
        return None
    text = _content_text(message.get("content"))
    if role == "assistant" and not text:
        return None
    return (role, text)


def _content_text(content: Any) -> str:
    # Clients may send text as a string or as content parts, and trim whitespace differently;
    # both must compare equal to what was stored.
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                pieces.append(str(part.get("text", "")))
            else:
                pieces.append(_stable_json(part))
        return "".join(pieces).strip()
    return _stable_json(content)


def _stable_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode()


def _trailing_turn(request: list[Message]) -> list[Message]:
    start = len(request)
    while start > 0 and request[start - 1]["role"] not in {"assistant", *_SYSTEM_ROLES}:
        start -= 1
    return request[start:]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
