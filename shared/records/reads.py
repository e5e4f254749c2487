"""The keeper's reading half, `Archivist`: what harnesses get to build their prompts, and
the API to show conversations; it has no method that writes one."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import cached_property
from typing import Any

import orjson
from redis.commands.core import AsyncScript

from shared import budgets, keys
from shared.connection import reply_text
from shared.records.call_log import CallKind, calls_of
from shared.records.conversation import Conversation
from shared.records.messages import Message, row_of, row_position, to_openai_message
from shared.records.store import ConversationStore
from shared.titles import TitleSource

# KEYS: meta, messages. The conversation's metadata (fields and values, flat) and how many
# messages it holds, in one command.
_META = """
return {redis.call('HGETALL', KEYS[1]), redis.call('LLEN', KEYS[2])}
"""


class Archivist(ConversationStore):
    """Read-only access to conversations: what harnesses get to build their prompts."""

    @cached_property
    def _meta(self) -> AsyncScript:
        return self._redis.register_script(_META)

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        """The conversation's metadata (owner included), or `None` if there is none."""
        meta_key, list_key, _ = self._keys(conversation_id)
        fields, count = await self._meta(keys=[meta_key, list_key])
        raw = dict(zip(fields[::2], fields[1::2], strict=True))
        if not raw:
            return None
        return _conversation(raw, int(count))

    async def list_conversations(
        self, *, after: str | None = None, limit: int = 20
    ) -> tuple[list[Conversation], bool]:
        """The owner's conversations, last used first, from just after the one with id
        `after`; at most `limit`, and whether more follow. Entries of conversations that
        expired are dropped from the index on the way."""
        index = keys.conversations(self.owner)
        # Forgets the conversations that expired, with their bytes (shared/budgets.py).
        await budgets.read_usage(self._redis, self.owner, retention_s=self.retention_s)
        high: float | str = "+inf"
        if after is not None:
            score = await self._redis.zscore(index, after)
            if score is None:
                return [], False
            high = score
        # Ties (same score) are skipped by id below; fetch enough to get past them.
        raw = await self._redis.zrevrangebyscore(index, high, "-inf", start=0, num=limit + 50)
        ids = [reply_text(item) for item in raw]
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else ids
        found: list[Conversation] = []
        gone: list[str] = []
        for chunk_start in range(0, len(ids), 50):
            chunk = ids[chunk_start : chunk_start + 50]
            async with self._redis.pipeline(transaction=False) as pipe:
                for conversation_id in chunk:
                    meta_key, list_key, _ = self._keys(conversation_id)
                    pipe.hgetall(meta_key)
                    pipe.llen(list_key)
                replies = await pipe.execute()
            for conversation_id, meta, count in zip(
                chunk, replies[::2], replies[1::2], strict=True
            ):
                if meta:
                    found.append(_conversation(meta, int(count)))
                else:
                    gone.append(conversation_id)
            if len(found) > limit:
                break
        if gone:
            async with self._redis.pipeline(transaction=False) as pipe:
                budgets.forget(pipe, self.owner, gone)
                await pipe.execute()
        return found[:limit], len(found) > limit

    async def proposal(self, conversation_id: str, confirmation_id: str) -> Message | None:
        """The tool call proposed under `confirmation_id` (as `proposals` has it), or None."""
        key = keys.conversation_proposals(self.owner, conversation_id)
        raw = await self._redis.hget(key, confirmation_id)  # type: ignore[misc]
        return orjson.loads(raw) if raw else None

    async def asked(self, digest: str) -> tuple[str, str] | None:
        """The conversation and the turn that asked a question of the history whose digest
        is `digest` (shared/records/history_diff.py `history_digest`), while the calls it
        asked about may wait (`Recorder.keep_asked`); None for another history."""
        raw = await self._redis.get(keys.asked(self.owner, digest))
        if raw is None:
            return None
        found = orjson.loads(raw)
        return str(found["conversation_id"]), str(found["turn_id"])

    async def proposals(self, conversation_id: str) -> list[Message]:
        """The tool calls of the conversation's latest step that waited for a decision
        (`PAUSE` drops an earlier step's), oldest first, with its `state` (pending,
        approved, rejected or expired)."""
        return await self._proposals(conversation_id)

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
        list_key = self._keys(conversation_id)[1]
        # redis-py types its commands as sync-or-async; the client here is always async.
        raw = await self._redis.lrange(list_key, start, -1)  # type: ignore[misc]
        found = [to_openai_message(orjson.loads(item)) for item in raw]
        if wanted is not None:
            found = [m for m in found if m.get("role") in wanted]
        return found[-limit:] if limit is not None else found

    async def older(self, conversation_id: str, before: int, count: int) -> list[Message]:
        """The up to `count` stored messages just before position `before` (1-based: the
        row `msg_<before>`), oldest first."""
        if before <= 1 or count <= 0:
            return []
        start = max(0, before - 1 - count)
        list_key = self._keys(conversation_id)[1]
        raw = await self._redis.lrange(list_key, start, before - 2)  # type: ignore[misc]
        return [row_of(orjson.loads(item)) for item in raw]

    async def length(self, conversation_id: str) -> int:
        """How many messages the conversation holds."""
        return int(await self._redis.llen(self._keys(conversation_id)[1]))  # type: ignore[misc]

    async def summary(self, conversation_id: str) -> Message | None:
        """The running summary of the conversation's older messages: `{text, covers_to}`
        (the position of the last message it covers), or None before the first.

        Every turn of the conversation reads it (worker/harness/memory.py), so reading it
        renews its retention, as appending renews the messages': a summary lives as long as
        the conversation is used, however long ago it was written."""
        key = keys.conversation_summary(self.owner, conversation_id)
        raw = await self._redis.getex(key, ex=self.retention_s)
        return orjson.loads(raw) if raw else None

    async def rows(
        self, conversation_id: str, *, after: str | None = None, limit: int = 100
    ) -> tuple[list[Message], bool]:
        """Stored rows oldest first, from just after the row with id `after` (from the start
        without one), at most `limit`; and whether more follow.

        A row is the message in OpenAI's shape plus `id` (`msg_<position>`, 1-based),
        `turn_id` and `created_at`.
        """
        start = row_position(after) if after is not None else 0
        list_key = self._keys(conversation_id)[1]
        raw = await self._redis.lrange(list_key, start, start + limit)  # type: ignore[misc]
        found = [row_of(orjson.loads(item)) for item in raw]
        return found[:limit], len(found) > limit

    async def calls(self, conversation_id: str, *, kind: CallKind | None = None) -> list[Message]:
        """Recorded LLM and tool calls, in the order they started, one dict per call.

        Every call has `call_id`, `kind`, `turn_id`, `status` (`running`, `completed` or
        `failed`), `started_at`, and once completed `completed_at` and `latency_ms`.
        LLM calls add `stage`, `model`, `usage` and `error`; tool calls add `tool_call_id`,
        `name`, `arguments` and the whole `content`.
        """
        calls_key = self._keys(conversation_id)[2]
        raw = await self._redis.lrange(calls_key, 0, -1)  # type: ignore[misc]
        records = calls_of(raw)
        return [r for r in records if r["kind"] == kind] if kind is not None else records

    async def latest_calls(self, conversation_id: str, entries: int) -> list[Message]:
        """The calls of the log's last `entries` entries, as `calls` gives them (a call
        whose start is further back has only what its completion says)."""
        calls_key = self._keys(conversation_id)[2]
        raw = await self._redis.lrange(calls_key, -entries, -1)  # type: ignore[misc]
        return calls_of(raw)


def _conversation(raw: Mapping[Any, Any], count: int) -> Conversation:
    meta = {reply_text(k): reply_text(v) for k, v in raw.items()}
    return Conversation(
        id=meta["id"],
        owner=meta["owner"],
        created_at=float(meta["created_at"]),
        updated_at=float(meta["updated_at"]),
        message_count=count,
        metadata=orjson.loads(meta["metadata"]) if meta.get("metadata") else {},
        active_turn=meta.get("active_turn") or None,
        active_since=float(meta["active_since"]) if meta.get("active_since") else None,
        paused_turn=meta.get("paused_turn") or None,
        paused_until=float(meta["paused_until"]) if meta.get("paused_until") else None,
        waiting=tuple(meta.get("waiting", "").split()),
        incarnation=meta.get("incarnation") or None,
        bytes=int(meta.get("bytes") or 0),
        title=meta.get("title") or None,
        title_source=TitleSource(meta["title_source"]) if meta.get("title_source") else None,
    )
