"""Every Redis key and channel name Bernard uses, in one place, and how each one ends.

A turn's keys share the hash tag `{<turn_id>}` (a conversation's, `{c:<owner>/<id>}`), so
the scripts that move a turn touch one slot's keys. Bernard still needs one Redis primary,
not a Cluster, as arq does: the turn's creating transaction also queues arq's job, the
claim script also adds the turn to `RUNNING_TURNS`, and the finish script also releases
the owner's `active_turns` entry, one round trip each instead of two.

Every key either expires or has an owner that deletes it (tests/test_abuse.py walks them):

- per turn (`turn`, `events`, `cancel`, `lease`, `attached`): a TTL from creation (a week
  for a turn nobody runs), set to the retention when the turn ends; the lease lives
  seconds; `attached` is deleted when the turn ends.
- per conversation: the retention (`BERNARD_CONVERSATION_RETENTION_S`), renewed on use;
  `DELETE /v1/conversations/{id}` removes them at once.
- per user (`active_turns`, `open_streams`): a TTL renewed on use; each entry also lapses
  at its own deadline (the score), so a crashed process cannot hold a slot for long.
  `notes`, `timers`, the owner's event stream (`events(user_stream_id(owner))`, capped
  at 1,000 entries) and `conversations` (the index of the owner's conversations) live as long as
  conversations do, renewed on use; index entries of expired conversations are dropped
  as the index is read.
  `turns` (the index of the owner's turns, `GET /v1/turns`) is renewed at each turn's
  creation to the longest a turn can live (a week unfinished plus the turn retention),
  keeps the newest `TURN_INDEX_MAX` entries, and drops those of expired turns as it is read.
- the hub's wake streams: an hour, renewed while the API process lives. `TOOLS` (what the
  workers offer): a day from the last worker's start.
- no TTL, one per deployment and small: `RUNNING_TURNS` and `WORKERS` (entries removed by
  the processes that reap and by the workers that stop, stale ones trimmed), `METRICS` (a
  counter per ending), and arq's queue with its wake list (`wake`: at most 100 entries).
"""

from __future__ import annotations

from urllib.parse import quote

PREFIX = "bernard"

CANCEL_CHANNEL = f"{PREFIX}:cancel"
RUNNING_TURNS = f"{PREFIX}:running"
WORKERS = f"{PREFIX}:workers"
METRICS = f"{PREFIX}:metrics"
TOOLS = f"{PREFIX}:tools"


def turn(turn_id: str) -> str:
    """Hash holding the turn record."""
    return f"{PREFIX}:{{{turn_id}}}:turn"


def events(turn_id: str) -> str:
    """Stream holding the turn's events, one entry per event."""
    return f"{PREFIX}:{{{turn_id}}}:events"


def cancel(turn_id: str) -> str:
    """String set when somebody asked the turn to stop."""
    return f"{PREFIX}:{{{turn_id}}}:cancel"


def lease(turn_id: str) -> str:
    """String a worker keeps alive while it runs the turn."""
    return f"{PREFIX}:{{{turn_id}}}:lease"


def attached(turn_id: str) -> str:
    """Sorted set of client attachments to the turn's stream (member: attachment id)."""
    return f"{PREFIX}:{{{turn_id}}}:attached"


def wake(queue_name: str) -> str:
    """List a blocked worker waits on; the API pushes a token after each enqueue."""
    return f"{queue_name}:wake"


def hub_wake(hub_id: str) -> str:
    """Stream an API process's reader waits on beside its turns, to learn of new readers."""
    return f"{PREFIX}:hub:{hub_id}"


def _user(owner: str) -> str:
    # Percent-encoded, so no owner name can reach into another's keys or hash tag
    # ("/", ":", "{" and "}" are all encoded).
    return quote(owner, safe="")


def active_turns(owner: str) -> str:
    """Sorted set of the owner's queued and running turns (score: when the entry lapses)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:active"


def open_streams(owner: str) -> str:
    """Sorted set of the owner's open SSE streams (member: attachment id; score: lapse)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:streams"


def notes(owner: str) -> str:
    """Hash of the owner's notes (shared/notes.py)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:notes"


def timers(owner: str) -> str:
    """Hash of the owner's timers (shared/timers.py)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:timers"


def user_stream_id(owner: str) -> str:
    """The id under which the owner's event stream (`GET /v1/events`) lives: its key is
    `events(user_stream_id(owner))`, so the API's stream hub reads it like a turn's."""
    return f"user:{_user(owner)}"


def conversations(owner: str) -> str:
    """Sorted set of the owner's conversation ids (score: when each was last used)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:conversations"


# The most entries an owner's turn index keeps (the newest); older turns still resolve by id.
TURN_INDEX_MAX = 10_000


def turns(owner: str) -> str:
    """Sorted set of the owner's turn ids (score: when each was created)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:turns"


def _conversation(owner: str, conversation_id: str) -> str:
    # Conversation ids are the owner's: two users may both have "kitchen-satellite".
    return f"{PREFIX}:{{c:{_user(owner)}/{conversation_id}}}"


def conversation(owner: str, conversation_id: str) -> str:
    """Hash holding a conversation's metadata."""
    return f"{_conversation(owner, conversation_id)}:conversation"


def conversation_messages(owner: str, conversation_id: str) -> str:
    """List of a conversation's recorded messages, oldest first."""
    return f"{_conversation(owner, conversation_id)}:messages"


def conversation_calls(owner: str, conversation_id: str) -> str:
    """List of a conversation's recorded LLM and tool calls."""
    return f"{_conversation(owner, conversation_id)}:calls"


def conversation_summary(owner: str, conversation_id: str) -> str:
    """String: the running summary of a conversation's older messages (JSON)."""
    return f"{_conversation(owner, conversation_id)}:summary"


def conversation_proposals(owner: str, conversation_id: str) -> str:
    """Hash of a conversation's tool calls that waited for the user's decision, by id."""
    return f"{_conversation(owner, conversation_id)}:proposals"
