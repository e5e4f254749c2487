"""The keeper's writing half, `Recorder`: what the turn runner records a turn with. Every
append is one script (`_APPEND`) counted in the conversation and its owner's ledger (in the
same script where one server holds both: `COUNTED`), and written only while the writing
turn holds the conversation."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

import orjson
from redis.commands.core import AsyncScript

from shared import budgets, keys
from shared.backends import backend_of
from shared.connection import reply_text
from shared.conversation_state import ConversationMachine, Outcome
from shared.queue import (
    SUMMARIZE,
    TITLE,
    Admission,
    BackgroundKind,
    BackgroundLimits,
    request_background,
)
from shared.records.call_log import CallEvent
from shared.records.conversation import (
    Continuation,
    ConversationExistsError,
    ConversationFullError,
    ConversationLostError,
    ConversationNotFoundError,
)
from shared.records.decisions import answer_as_decided, open_call_answers, with_arguments
from shared.records.history_diff import new_messages
from shared.records.messages import Message, MessageLike, stored_message, to_openai_message
from shared.records.store import ConversationStore
from shared.scripts import in_pipeline, unless_refused, unless_refused_call
from shared.titles import TitleSource

# Optimistic retries of append_new_messages before giving up: each retry means another
# writer appended in between, which for one conversation is rare.
_APPEND_RETRIES = 10

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

# KEYS: meta, list. ARGV: where the window starts (0: the whole list, -n: its last n), '1'
# to ask whether the conversation is there ('' not to). The list's length and the window's
# rows, in one command: {length, rows[, 1 or 0]}.
_WINDOW = """
local length = redis.call('LLEN', KEYS[2])
local rows = redis.call('LRANGE', KEYS[2], ARGV[1], -1)
if ARGV[2] == '1' then return {length, rows, redis.call('EXISTS', KEYS[1])} end
return {length, rows}
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


# The scripts that write a conversation's lists, each joined with its ledger share where
# one server holds both (`Recorder._counted`): one command, not two, on every append.
COUNTED = {script: unless_refused(script, budgets.ACCOUNT) for script in (_APPEND, _AMEND)}


class Recorder(ConversationStore):
    """Write access to conversations: what the turn runner records a turn with."""

    @cached_property
    def _machine(self) -> ConversationMachine:
        return ConversationMachine(self._redis, self.owner, retention_s=self.retention_s)

    @cached_property
    def _window(self) -> AsyncScript:
        return self._redis.register_script(_WINDOW)

    @cached_property
    def _save_summary(self) -> AsyncScript:
        return self._redis.register_script(_SAVE_SUMMARY)

    @cached_property
    def _save_title(self) -> AsyncScript:
        return self._redis.register_script(_SAVE_TITLE)

    @cached_property
    def _counting(self) -> dict[str, AsyncScript] | None:
        """Each writing script joined with the ledger's share (`COUNTED`), where one script
        may span the conversation's slot and its owner's; None on a Cluster."""
        if backend_of(self._redis).splits_by_slot:
            return None
        return {script: self._redis.register_script(text) for script, text in COUNTED.items()}

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
        trip; its answer. One server: one script, which counts only what it wrote. A
        Cluster: the two side by side in a pipeline, the ledger giving the bytes back when
        nothing was written."""
        ledger_keys, ledger_args = budgets.account_call(
            self.owner, conversation_id, size, used_at=used_at, retention_s=self.retention_s
        )
        if self._counting is not None:
            joined_keys, joined_args = unless_refused_call(
                script_keys, args, ledger_keys, ledger_args
            )
            return int(await self._counting[script](keys=joined_keys, args=joined_args))
        async with self._redis.pipeline(transaction=False) as pipe:
            in_pipeline(pipe, script, script_keys, args)
            in_pipeline(pipe, budgets.ACCOUNT, ledger_keys, ledger_args)
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
            # A turn's append is made whatever it finds, and says whether the conversation
            # is there (`_push`): only another writer asks first.
            length, raw, *exists = await self._window(
                keys=[meta_key, list_key], args=[start, "1" if turn_id is None else ""]
            )
            if exists == [0]:
                raise ConversationNotFoundError(conversation_id)
            if window == 0:
                raw = []
            stored = [orjson.loads(item) for item in raw]
            answers = (
                []
                if answer_open_calls is None
                else open_call_answers(stored, answer_open_calls, except_calls)
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
        """Answer each call of `answers` the user decided on as decided (shared/records/
        decisions.py), from the proposals of its step."""
        answer_as_decided(answers, await self._proposals(conversation_id))

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
            length, raw = await self._window(keys=[meta_key, list_key], args=[start, ""])
            triples: list[Any] = []
            size = 0
            for index, item in enumerate(raw, start=length - len(raw)):
                amended = with_arguments(orjson.loads(item), arguments)
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
        return await request_background(
            self._queue,
            limits,
            BackgroundKind.SUMMARY,
            self.owner,
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
        return await request_background(
            self._queue,
            limits,
            BackgroundKind.TITLE,
            self.owner,
            conversation_id,
            TITLE,
            refused="title of %s not queued: %s",
        )

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


def _rows(messages: Sequence[Message], length: int, turn_id: str | None) -> list[Message]:
    """`messages` as the rows they become after the `length` already stored."""
    now = time.time()
    return [
        {**message, "id": f"msg_{length + k + 1}", "turn_id": turn_id, "created_at": now}
        for k, message in enumerate(messages)
    ]
