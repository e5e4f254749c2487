"""The record keeper: conversations, their messages and their LLM and tool calls, stored in
Redis (what it stores and raises: the other modules of shared/records/).

Split by who may do what (seed 002): harnesses get an `Archivist`, which only reads; the
turn runner gets a `Recorder`, which writes. `RecordKeeper` is both, and hands out each half
as a separate object, so a harness given `as_archivist()` cannot write even by mistake.

A record keeper belongs to one owner: conversation ids are the owner's own, so two users
may both use "kitchen-satellite" and neither can reach, or learn of, the other's.

Layout, all under one hash tag so a Lua script may touch every key of a conversation:

- `keys.conversation(owner, id)`: hash `id`, `owner`, `created_at`, `updated_at` (epoch
  seconds), `metadata`, `bytes` (what its messages and calls hold: shared/budgets.py),
  `title` and `title_source` once it has one (shared/titles.py), and what its state
  derives from (shared/conversation_state.py).
- `keys.conversation_messages(owner, id)`: list of orjson messages in OpenAI chat shape,
  oldest first: `{role, content, name?, tool_call_id?, tool_calls?}`.
- `keys.conversation_calls(owner, id)`: append-only list of call events (`started`, then
  `completed`: shared/records/call_log.py), merged per `call_id` on read. Appending instead
  of updating a record in place keeps every write one race-free `RPUSH`.

Every append of messages renews the retention of all three keys: a conversation in use
lives on, one left alone expires whole (call records appended between them give their list
the same retention when they start it, and find it at least the metadata's otherwise). A
turn writes only while it holds the conversation (its active turn:
shared/conversation_state.py says why); creating, deciding, pausing and deleting are that
module's transitions, which the keeper's writers call. Every append is counted, in the
conversation (`bytes`) and in its owner's storage ledger (shared/budgets.py), and an append
of a request's messages may be refused for the conversation's cap (`ConversationFullError`).

Clients resend the whole history with every request; `new_messages()`
(shared/records/history_diff.py) picks out what is not stored yet, and
`Recorder.append_new_messages()` does that and the append atomically.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import orjson
from redis.asyncio import Redis

from shared import budgets, keys
from shared.connection import reply_text
from shared.conversation_state import ConversationMachine, Outcome
from shared.queue import Admission, BackgroundKind, BackgroundLimits, enqueue_background
from shared.records.call_log import CallEvent, CallKind, calls_of
from shared.records.conversation import (
    Continuation,
    Conversation,
    ConversationExistsError,
    ConversationFullError,
    ConversationLostError,
    ConversationNotFoundError,
)
from shared.records.history_diff import new_messages
from shared.records.messages import (
    Message,
    MessageLike,
    row_of,
    row_position,
    stored_message,
    to_openai_message,
)
from shared.scripts import in_pipeline
from shared.titles import TitleSource

__all__ = [
    "ANSWERED_NOT_CARRIED_OUT",
    "APPROVED_STEP_LAPSED",
    "DECIDED_NOT_CARRIED_OUT",
    "DEFAULT_RETENTION_S",
    "SUMMARIZE",
    "TITLE",
    "Archivist",
    "RecordKeeper",
    "Recorder",
    "open_calls",
]

logger = logging.getLogger("bernard.records")

# Optimistic retries of append_new_messages before giving up: each retry means another
# writer appended in between, which for one conversation is rare.
_APPEND_RETRIES = 10
DEFAULT_RETENTION_S = 30 * 86_400
# The worker's job that folds a conversation's older messages into its summary.
SUMMARIZE = "summarize_conversation"
# The worker's job that names a conversation after its first exchange (worker/titles.py).
TITLE = "title_conversation"
# What a call the user approved is answered when the turn that was to run it left no result.
DECIDED_NOT_CARRIED_OUT = (
    "Unknown: the user approved this call, but the turn that was to run it ended before "
    "its result was recorded; it may not have run."
)
# ... and when the user answered in words, and the turn that read them left no result.
ANSWERED_NOT_CARRIED_OUT = (
    "Unknown: the user answered about this call in words, but the turn that read the answer "
    "ended before its result was recorded; it may have run."
)
# ... and when another call proposed with it lapsed undecided (the step never went on).
APPROVED_STEP_LAPSED = (
    "Not run: the user approved this call, but not every call proposed with it was decided in time."
)

# KEYS: meta, list[, calls]. ARGV: expected length ('' for any), now, retention s, the
# writing turn ('' for a writer that is no turn), byte cap ('' for none), how many of the
# items go to the list (the rest are call records, for the calls key), item...
# Appends only to an existing conversation, so a stray write never creates a list without
# its metadata; for a turn, only while it holds the conversation (its active turn), so a
# turn that lost it (deleted, re-created) writes nothing; and with an expected length only
# if the list still has it, so the history a caller compared against is the one it
# extends; with a cap, only if the conversation's bytes stay within it. Counts the bytes
# appended in the metadata (`bytes`). Appending messages (the calls key given) marks the
# conversation used and renews the retention of all three keys, and may carry call records
# too (a turn's last ones go with its messages: one step, not two). Call records alone give
# their list a retention only when they start it: a list already there lives as long as
# the metadata at least (what renews the metadata renews it: an append of messages, or
# ANNOUNCE; CREATE empties it), and the conversation ends with its metadata. Returns the
# list's new length, -1 for no conversation, -2 when the list changed since the caller read
# it, -3 when the turn does not hold the conversation, -4 over the cap. The metadata is read
# in one HMGET (a field found is a conversation found: only a miss asks EXISTS why), the
# list's length only for a caller that expects one (else the RPUSH answers it), and an
# append of messages writes its bytes and use in one HSET: each command here runs on every
# append of every turn.
_APPEND = """
local meta = redis.call('HMGET', KEYS[1], 'active_turn', 'bytes')
if ARGV[4] ~= '' and meta[1] ~= ARGV[4] then
  if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
  return -3
end
if not meta[1] and not meta[2] and redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local last = 6 + tonumber(ARGV[6])
local length = 0
if ARGV[1] ~= '' or last == 6 then
  length = redis.call('LLEN', KEYS[2])
  if ARGV[1] ~= '' and length ~= tonumber(ARGV[1]) then return -2 end
end
local size = 0
for i = 7, #ARGV do size = size + #ARGV[i] end
local held = tonumber(meta[2] or '0')
if ARGV[5] ~= '' and held + size > tonumber(ARGV[5]) then return -4 end
for i = 7, last do length = redis.call('RPUSH', KEYS[2], ARGV[i]) end
for i = last + 1, #ARGV do redis.call('RPUSH', KEYS[3], ARGV[i]) end
if KEYS[3] then
  redis.call('HSET', KEYS[1], 'bytes', string.format('%d', held + size), 'updated_at', ARGV[2])
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
else
  redis.call('HINCRBY', KEYS[1], 'bytes', size)
  if length == last - 6 then redis.call('EXPIRE', KEYS[2], ARGV[3]) end
end
return length
"""

# KEYS: meta, list. ARGV: the writing turn, then triples: index, the row there as read, the
# row to put in its place. Replaces the rows only while the turn holds the conversation
# (its active turn) and each is still as the caller read it, counting the bytes it changes
# by in the metadata (`bytes`). Returns 1, or as `_APPEND`: -1 for no conversation, -2
# when a row changed since the caller read it, -3 when the turn does not hold it.
_AMEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HGET', KEYS[1], 'active_turn') ~= ARGV[1] then return -3 end
for i = 2, #ARGV, 3 do
  if redis.call('LINDEX', KEYS[2], tonumber(ARGV[i])) ~= ARGV[i + 1] then return -2 end
end
local size = 0
for i = 2, #ARGV, 3 do
  redis.call('LSET', KEYS[2], tonumber(ARGV[i]), ARGV[i + 2])
  size = size + #ARGV[i + 2] - #ARGV[i + 1]
end
redis.call('HINCRBY', KEYS[1], 'bytes', size)
return 1
"""

# KEYS: summary, meta. ARGV: summary json, covers_to, retention s, incarnation ('' for
# any). Stores the summary unless the conversation is gone or another incarnation (deleted,
# then created again), or the summary there already covers as much or more (two summary
# jobs finishing out of order).
_SAVE_SUMMARY = """
local incarnation = redis.call('HGET', KEYS[2], 'incarnation')
if not incarnation or (ARGV[4] ~= '' and incarnation ~= ARGV[4]) then return 0 end
local current = redis.call('GET', KEYS[1])
if current and tonumber(cjson.decode(current)['covers_to']) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
return 1
"""

# KEYS: meta. ARGV: title, source ('generated' or 'user'), incarnation ('' for any).
# Stores the title unless the conversation is gone or another incarnation (deleted, then
# created again: the new one is not named after the old one's words); a generated title
# only where none is yet, so it never replaces the user's (nor a generated one stored
# meanwhile). 1 stored, 0 not.
_SAVE_TITLE = """
local incarnation = redis.call('HGET', KEYS[1], 'incarnation')
if not incarnation or (ARGV[3] ~= '' and incarnation ~= ARGV[3]) then return 0 end
if ARGV[2] ~= 'user' and redis.call('HEXISTS', KEYS[1], 'title') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'title', ARGV[1], 'title_source', ARGV[2])
return 1
"""


class _Store:
    """A Redis client, the owner whose conversations it reaches, and the scripts it runs."""

    def __init__(
        self,
        redis: Redis,
        owner: str,
        *,
        retention_s: int = DEFAULT_RETENTION_S,
        queue: Redis | None = None,
    ) -> None:
        self._redis = redis
        # The queue role (shared/keys.py), for the summary job; the same client by default.
        self._queue = queue if queue is not None else redis
        self.owner = owner
        self.retention_s = retention_s
        self._save_summary = redis.register_script(_SAVE_SUMMARY)
        self._save_title = redis.register_script(_SAVE_TITLE)
        self._machine = ConversationMachine(redis, owner, retention_s=retention_s)

    def _keys(self, conversation_id: str) -> tuple[str, str, str]:
        """The conversation's metadata, messages and calls keys."""
        return (
            keys.conversation(self.owner, conversation_id),
            keys.conversation_messages(self.owner, conversation_id),
            keys.conversation_calls(self.owner, conversation_id),
        )

    async def _counted(
        self,
        script: str,
        script_keys: list[str],
        args: list[Any],
        conversation_id: str,
        size: int,
        *,
        used_at: float | None = None,
    ) -> int:
        """Run `script` (one that writes the conversation's list and answers a negative code
        when it wrote nothing) with the owner's ledger counting `size` bytes in the same round
        trip; its answer. The ledger gives the bytes back when nothing was written."""
        async with self._redis.pipeline(transaction=False) as pipe:
            in_pipeline(pipe, script, script_keys, args)
            budgets.account(
                pipe,
                self.owner,
                conversation_id,
                size,
                used_at=used_at,
                retention_s=self.retention_s,
            )
            reply, _ = await pipe.execute()
        answer = int(reply)
        if answer < 0:
            async with self._redis.pipeline(transaction=False) as pipe:
                budgets.account(
                    pipe,
                    self.owner,
                    conversation_id,
                    -size,
                    used_at=None,
                    retention_s=self.retention_s,
                )
                await pipe.execute()
        return answer


class Archivist(_Store):
    """Read-only access to conversations: what harnesses get to build their prompts."""

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        """The conversation's metadata (owner included), or `None` if there is none."""
        meta_key, list_key, _ = self._keys(conversation_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(meta_key)
            pipe.llen(list_key)
            raw, count = await pipe.execute()
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
        key = keys.conversation_proposals(self.owner, conversation_id)
        raw = await self._redis.hvals(key)  # type: ignore[misc]
        found = [orjson.loads(value) for value in raw]
        return sorted(found, key=lambda p: float(p.get("expires_at", 0)))

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
        return [row_of(orjson.loads(item), start + k) for k, item in enumerate(raw)]

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
        found = [row_of(orjson.loads(item), start + k) for k, item in enumerate(raw)]
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


class Recorder(_Store):
    """Write access to conversations: what the turn runner records a turn with."""

    async def create_conversation(
        self,
        conversation_id: str | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
        active_turn: str | None = None,
    ) -> str:
        """Create a conversation of this keeper's owner and return its id.

        Pass `conversation_id` to choose the id (e.g. one a client sent); raises
        `ConversationExistsError` when the owner already has one with that id.
        `active_turn` starts it held by that turn (shared/conversation_state.py).
        """
        new_id = conversation_id or f"conv_{uuid.uuid4().hex}"
        created = await self._machine.create(new_id, metadata=metadata, turn_id=active_turn)
        if created is not Outcome.CREATED:
            raise ConversationExistsError(new_id)
        return new_id

    async def append_messages(
        self,
        conversation_id: str,
        messages: Iterable[MessageLike],
        *,
        turn_id: str | None = None,
        length: int | None = None,
        calls: Sequence[CallEvent] = (),
    ) -> list[Message]:
        """Append `messages` (in one atomic step) and return them as stored rows.

        `length` is how many messages the caller believes are stored (a turn knows it from
        its own `append_new_messages`): right, it saves reading it first; wrong, the
        append is refused and the length read as without it. `calls` go to the call log
        in the same step (a turn's last call records, written with its answer: one script
        and one ledger update where `record_calls` and this would be two).

        Written by a turn (`turn_id`), the rows are stored only while it holds the
        conversation.

        Raises `ConversationNotFoundError` for an unknown conversation (its subclass
        `ConversationLostError` when `turn_id` does not hold it), `ValueError` for a
        message without a role.
        """
        fresh = [stored_message(m) for m in messages]
        list_key = self._keys(conversation_id)[1]
        records = [call.encoded() for call in calls]
        for _ in range(_APPEND_RETRIES):
            if length is None:
                length = int(await self._redis.llen(list_key))  # type: ignore[misc]
            rows = _rows(fresh, length, turn_id)
            items = [orjson.dumps(row) for row in rows]
            pushed = await self._push(
                conversation_id,
                list_key,
                items,
                expected_length=length,
                turn_id=turn_id,
                calls=records,
            )
            if pushed >= 0:
                return rows
            length = None  # another writer appended meanwhile: read where the list ends now
        raise RuntimeError(f"conversation {conversation_id} kept changing while appending")

    async def append_new_messages(
        self,
        conversation_id: str,
        requested: Sequence[MessageLike],
        *,
        window: int | None = None,
        turn_id: str | None = None,
        answer_open_calls: str | None = None,
        except_calls: Collection[str] = (),
        limit: int | None = None,
        resent: bool = True,
    ) -> Continuation:
        """Append what `new_messages()` finds new in `requested`; return it and the history.

        With `window`, only the latest `window` stored messages are read and compared (and
        returned as the history): what a turn reads stays bounded however long the
        conversation grows. With `answer_open_calls`, each tool call the history ends on
        without a result (`open_calls`: a paused turn's nobody decided on) first gets a tool
        message saying it, in the same append: a prompt may not hold a tool call without
        its result; but the calls in `except_calls`, which the turn answers itself. Reading
        the history and appending are optimistic (the append is refused if the list changed
        since the read), so two requests continuing the same conversation at once cannot
        both append the same turn. Two round trips when nobody else writes; for a turn
        (`turn_id`) the second one is made even with nothing new, for it must hold the
        conversation to go on (`ConversationLostError` when it does not). With `limit`, an
        append that would take the conversation's bytes over it is refused whole
        (`ConversationFullError`). `resent=False` says the request holds only new messages
        (the conversations API's): all of them are appended, even one whose text the history
        ends with (the same message sent again after its turn was cancelled).
        """
        meta_key, list_key, _ = self._keys(conversation_id)
        start = -window if window is not None else 0
        for _ in range(_APPEND_RETRIES):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.llen(list_key)
                pipe.lrange(list_key, start, -1)
                # A turn's append is made whatever it finds, and says whether the
                # conversation is there (`_push`): only another writer asks first.
                if turn_id is None:
                    pipe.exists(meta_key)
                length, raw, *exists = await pipe.execute()
            if exists == [0]:
                raise ConversationNotFoundError(conversation_id)
            if window == 0:
                raw = []
            stored = [orjson.loads(item) for item in raw]
            answers = (
                []
                if answer_open_calls is None
                else _answers(stored, answer_open_calls, except_calls)
            )
            if answers:  # rare: a read more, to answer a decided call as it was decided
                await self._as_decided(conversation_id, answers)
            # Tool messages take no part in telling what is new: the answers change nothing.
            sent = (
                new_messages(stored, requested)
                if resent
                else list(map(to_openai_message, requested))
            )
            fresh = _rows([*answers, *sent], length, turn_id)
            if not fresh and turn_id is None:
                return Continuation(new=[], history=stored, length=length)
            items = [orjson.dumps(m) for m in fresh]
            pushed = await self._push(
                conversation_id,
                list_key,
                items,
                expected_length=length,
                turn_id=turn_id,
                limit=limit,
            )
            if pushed >= 0:
                return Continuation(new=fresh, history=[*stored, *fresh], length=pushed)
        raise RuntimeError(f"conversation {conversation_id} kept changing while appending")

    async def _as_decided(self, conversation_id: str, answers: list[Message]) -> None:
        """Answer each call of `answers` the user decided on as decided: its step's last
        decision claimed the conversation for a turn that never carried it out (the API
        stopped between the claim and the turn's creation; a worker died in the call), or
        another call of its step lapsed undecided, so the step never went on. The answer
        for a call nobody decided on does not hold for it: the user did confirm."""
        key = keys.conversation_proposals(self.owner, conversation_id)
        raw = await self._redis.hvals(key)  # type: ignore[misc]
        proposals = sorted(
            (orjson.loads(value) for value in raw), key=lambda p: float(p.get("expires_at", 0))
        )
        decided = {p["tool_call"]["id"]: p for p in proposals if p.get("tool_call")}
        for answer in answers:
            proposal = decided.get(answer["tool_call_id"]) or {}
            state = proposal.get("state")
            if state == "approved" and proposal.get("resumed_by"):
                answer["content"] = DECIDED_NOT_CARRIED_OUT
            elif state == "answering":
                answer["content"] = ANSWERED_NOT_CARRIED_OUT
            elif state == "approved":
                answer["content"] = APPROVED_STEP_LAPSED
            elif state == "rejected":
                answer["content"] = f"The user declined: {answer['name']} was not run."

    async def amend_tool_calls(
        self,
        conversation_id: str,
        arguments: Mapping[str, str],
        *,
        turn_id: str,
        window: int | None = None,
    ) -> None:
        """Give the stored tool calls named in `arguments` (tool call id → arguments as JSON
        text) those arguments: the user approved them edited (worker/harness/resume.py), so
        the history says the calls ran as they did, not as the model proposed them. Only
        the latest `window` rows are looked at (the calls a turn resumes are at the end).

        Written by the turn that carries the calls out, only while it holds the conversation
        and each row is as read (`_AMEND`): a compare-and-set, never a blind overwrite.
        Raises `ConversationNotFoundError` (`ConversationLostError` when `turn_id` does not
        hold it).
        """
        if not arguments:
            return
        meta_key, list_key, _ = self._keys(conversation_id)
        start = -window if window is not None else 0
        for _ in range(_APPEND_RETRIES):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.llen(list_key)
                pipe.lrange(list_key, start, -1)
                length, raw = await pipe.execute()
            triples: list[Any] = []
            size = 0
            for index, item in enumerate(raw, start=length - len(raw)):
                amended = _with_arguments(orjson.loads(item), arguments)
                if amended is not None:
                    # Bytes, as counted (a decoding client reads text).
                    old = item.encode() if isinstance(item, str) else item
                    new = orjson.dumps(amended)
                    triples += [index, old, new]
                    size += len(new) - len(old)
            if not triples:
                return
            done = await self._counted(
                _AMEND, [meta_key, list_key], [turn_id, *triples], conversation_id, size
            )
            if done == -1:
                raise ConversationNotFoundError(conversation_id)
            if done == -3:
                raise ConversationLostError(conversation_id)
            if done == 1:
                return
        raise RuntimeError(f"conversation {conversation_id} kept changing while amending")

    async def save_summary(
        self, conversation_id: str, text: str, covers_to: int, *, incarnation: str | None = None
    ) -> None:
        """Replace the running summary (see `Archivist.summary`); only ever forward, and only
        into the `incarnation` of the conversation the summary was made of (None: any)."""
        script_keys = [
            keys.conversation_summary(self.owner, conversation_id),
            keys.conversation(self.owner, conversation_id),
        ]
        value = orjson.dumps({"text": text, "covers_to": covers_to, "at": time.time()})
        await self._save_summary(
            keys=script_keys, args=[value, covers_to, self.retention_s, incarnation or ""]
        )

    async def request_summary(
        self, conversation_id: str, until: int, limits: BackgroundLimits, *, turn_id: str
    ) -> Admission | None:
        """Queue the job that folds the messages before position `until` into the summary
        (worker/summaries.py), one per conversation at a time, as the owner's background
        job (shared/queue.py): over the owner's or the deployment's budget it is not
        queued, and the next turn that finds the summary behind asks again.

        The job carries the incarnation of the conversation `turn_id` holds: one that runs
        after the conversation was deleted and created again under its id summarizes
        nothing (the positions it was asked for are another conversation's). None, and
        nothing queued, when the turn no longer holds it."""
        held, incarnation = await self._redis.hmget(  # type: ignore[misc]
            keys.conversation(self.owner, conversation_id), ["active_turn", "incarnation"]
        )
        if held is None or reply_text(held) != turn_id or incarnation is None:
            return None
        return await self._request_background(
            limits,
            BackgroundKind.SUMMARY,
            conversation_id,
            SUMMARIZE,
            until,
            reply_text(incarnation),
            refused="summary of %s not queued: %s; the next turn asks again",
        )

    async def save_title(
        self,
        conversation_id: str,
        title: str,
        source: TitleSource,
        *,
        incarnation: str | None = None,
    ) -> bool:
        """Store the conversation's title (checked by the caller: shared/titles.py); whether
        it was. Into the `incarnation` of the conversation it was made for (None: any); a
        `GENERATED` title only where there is none yet, so a user's is never replaced."""
        stored = await self._save_title(
            keys=[keys.conversation(self.owner, conversation_id)],
            args=[title, source.value, incarnation or ""],
        )
        return bool(stored)

    async def request_title(self, conversation_id: str, limits: BackgroundLimits) -> Admission:
        """Queue the job that names the conversation (worker/titles.py), one per
        conversation at a time, as the owner's background job (shared/queue.py), as
        `request_summary` does."""
        return await self._request_background(
            limits,
            BackgroundKind.TITLE,
            conversation_id,
            TITLE,
            refused="title of %s not queued: %s",
        )

    async def _request_background(
        self,
        limits: BackgroundLimits,
        kind: BackgroundKind,
        conversation_id: str,
        job: str,
        *job_args: Any,
        refused: str,
    ) -> Admission:
        """Queue the background job `job(owner, conversation_id, *job_args)` of `kind` for
        the conversation (shared/queue.py); over a budget it is not queued, and `refused`
        (formatted with the conversation and the admission) says so in the log."""
        admission = await enqueue_background(
            self._queue,
            limits,
            kind,
            self.owner,
            conversation_id,
            job,
            self.owner,
            conversation_id,
            *job_args,
        )
        if admission in (Admission.OVER_USER_BUDGET, Admission.OVER_DEPLOYMENT_BUDGET):
            logger.info(
                refused,
                conversation_id,
                admission.value,
                extra={"user": self.owner, "conversation_id": conversation_id},
            )
        return admission

    async def propose(
        self, conversation_id: str, proposals: Sequence[Mapping[str, Any]], *, turn_id: str
    ) -> None:
        """Store the tool calls `turn_id` proposed, each `pending` until decided (see the
        API's conversations), by `confirmation_id`: the conversation awaits the user's
        decision (shared/conversation_state.py, `PAUSE`). Raises
        `ConversationNotFoundError` (`ConversationLostError`) unless the turn holds it."""
        if not proposals:
            return
        paused = await self._machine.pause(conversation_id, turn_id, proposals)
        if paused is Outcome.NOT_FOUND:
            raise ConversationNotFoundError(conversation_id)
        if paused is not Outcome.PAUSED:
            raise ConversationLostError(conversation_id)

    async def keep_asked(
        self, digest: str, conversation_id: str, *, turn_id: str, until: float
    ) -> None:
        """Keep, until `until` (when the calls it asked about lapse), that `turn_id` of the
        conversation asked a question of the history whose digest is `digest`: a client that
        resends that history with an answer continues the conversation (api/conversations.py)."""
        ttl_s = max(1, math.ceil(until - time.time()))
        value = orjson.dumps({"conversation_id": conversation_id, "turn_id": turn_id})
        await self._redis.set(keys.asked(self.owner, digest), value, ex=ttl_s)

    async def record_calls(
        self, conversation_id: str, events: Sequence[CallEvent], *, turn_id: str | None = None
    ) -> None:
        """Append `events` to the conversation's call log, in order, in one step; written by
        a turn (`turn_id`), only while it holds the conversation."""
        if events:
            items = [event.encoded() for event in events]
            await self._push(
                conversation_id, self._keys(conversation_id)[2], items, turn_id=turn_id
            )

    async def _push(
        self,
        conversation_id: str,
        list_key: str,
        items: list[bytes],
        *,
        expected_length: int | None = None,
        turn_id: str | None = None,
        limit: int | None = None,
        calls: Sequence[bytes] = (),
    ) -> int:
        """Append `items` (and, with messages, the call records `calls` to the call log, in
        the same step), counted in the conversation and its owner's ledger (in the same
        round trip); the list's new length, or -2 if it no longer has `expected_length`.
        Raises `ConversationNotFoundError`, `ConversationLostError` when the writing turn
        `turn_id` does not hold the conversation, and with `limit`, `ConversationFullError`
        if the conversation's bytes would go over it."""
        meta_key, messages_key, calls_key = self._keys(conversation_id)
        script_keys = [meta_key, list_key]
        if list_key == messages_key:
            script_keys.append(calls_key)
        elif calls:
            raise ValueError("call records go with messages, or on their own")
        now = time.time()
        size = sum(len(item) for item in items) + sum(len(call) for call in calls)
        # Appending messages is a use of the conversation: it moves up the owner's index.
        used_at = now if list_key == messages_key else None
        args = [
            "" if expected_length is None else expected_length,
            repr(now),
            self.retention_s,
            turn_id or "",
            "" if limit is None else limit,
            len(items),
            *items,
            *calls,
        ]
        length = await self._counted(
            _APPEND, script_keys, args, conversation_id, size, used_at=used_at
        )
        if length == -1:
            raise ConversationNotFoundError(conversation_id)
        if length == -3:
            raise ConversationLostError(conversation_id)
        if length == -4:
            assert limit is not None
            raise ConversationFullError(conversation_id, limit)
        return length


class RecordKeeper(Archivist, Recorder):
    """Both halves on one client, for the code that wires a turn together.

    Hand harnesses `as_archivist()` and the turn runner `as_recorder()`: each returns an
    object of just that class, so the other half's methods do not exist on it.
    """

    def as_archivist(self) -> Archivist:
        """A read-only view on the same Redis client and owner."""
        return Archivist(self._redis, self.owner, retention_s=self.retention_s, queue=self._queue)

    def as_recorder(self) -> Recorder:
        """A write-only view on the same Redis client and owner."""
        return Recorder(self._redis, self.owner, retention_s=self.retention_s, queue=self._queue)


def open_calls(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls of the last assistant message with tool calls that no tool message
    answers, when the history ends on that message and its results (a paused turn's, or one
    cut short). `[]` when anything else came after it."""
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if message.get("role") == "tool":
            continue
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            return []
        answered = {m.get("tool_call_id") for m in history[index + 1 :]}
        return [call for call in message["tool_calls"] if call.get("id") not in answered]
    return []


def _answers(
    history: Sequence[Mapping[str, Any]], content: str, except_calls: Collection[str] = ()
) -> list[Message]:
    """A tool message saying `content` for each of the history's `open_calls` but those in
    `except_calls`."""
    return [
        {
            "role": "tool",
            "content": content,
            "tool_call_id": call["id"],
            "name": call.get("function", {}).get("name"),
        }
        for call in open_calls(history)
        if call.get("id") not in except_calls
    ]


def _with_arguments(row: Message, arguments: Mapping[str, str]) -> Message | None:
    """`row` with its tool calls named in `arguments` given those arguments; None when it
    holds none of them, or holds them with these arguments already."""
    calls = row.get("tool_calls") if row.get("role") == "assistant" else None
    if not isinstance(calls, list):
        return None
    changed = False
    amended = []
    for call in calls:
        function = call.get("function") or {}
        new = arguments.get(call.get("id"))
        if new is not None and function.get("arguments") != new:
            call = {**call, "function": {**function, "arguments": new}}
            changed = True
        amended.append(call)
    return {**row, "tool_calls": amended} if changed else None


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


def _rows(messages: Sequence[Message], length: int, turn_id: str | None) -> list[Message]:
    """`messages` as the rows they become after the `length` already stored."""
    now = time.time()
    return [
        {**message, "id": f"msg_{length + k + 1}", "turn_id": turn_id, "created_at": now}
        for k, message in enumerate(messages)
    ]
