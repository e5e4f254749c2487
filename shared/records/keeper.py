"""The record keeper: conversations, their messages and their LLM and tool calls, stored in
Redis (what it stores and raises: the other modules of shared/records/).

Split by who may do what (seed 002): harnesses get an `Archivist` (reads.py), which only
reads; the turn runner gets a `Recorder` (writes.py), which writes; what a decided call is
answered is decisions.py's. `RecordKeeper` is both, and hands out each half as a separate
object, so a harness given `as_archivist()` cannot write even by mistake.

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

from shared.records.reads import Archivist
from shared.records.writes import Recorder

__all__ = ["RecordKeeper"]


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
