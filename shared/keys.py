"""Every Redis key and channel name Bernard uses, in one place, and how each one ends.

Keys belong to one of two roles. The **queue** (`BERNARD_QUEUE_REDIS_URL`) holds arq's jobs,
the wake lists, the running set, each worker's liveness and the per-user counters: small,
one consistent view, one primary (arq cannot use a Cluster). The **data** (`REDIS_URL`)
holds what grows with the traffic: turns, streams, conversations, users' records; each
script touches one hash tag, so it may be a Cluster (but on one server, where a record's
append and its owner's ledger share one: shared/records/writes.py). No script spans the two
roles, and every key expires or has an owner that deletes it (tests/test_abuse.py walks
them). docs/redis.md says which key is whose, how each operation across the roles is split,
and how long each lives.
"""

from __future__ import annotations

from urllib.parse import quote

PREFIX = "bernard"

CANCEL_CHANNEL = f"{PREFIX}:cancel"
RUNNING_TURNS = f"{PREFIX}:running"
WORKERS = f"{PREFIX}:workers"
# A worker renews its entry in `WORKERS` with its liveness (1 s by default); one silent
# this long is taken for dead (`GET /v1/status`, `bernard doctor`).
WORKER_FRESH_S = 15
# Sorted set of turns somebody asked to stop (score: when the entry lapses), on the queue
# role: each worker's liveness script finds its cancelled turns in it (shared/liveness.py).
CANCELS = f"{PREFIX}:cancels"
METRICS = f"{PREFIX}:metrics"
TOOLS = f"{PREFIX}:tools"
DEPLOYMENT = f"{PREFIX}:deployment"
MCP_SERVERS = f"{PREFIX}:mcp"


def turn(turn_id: str) -> str:
    """Hash holding the turn record."""
    return f"{PREFIX}:{{{turn_id}}}:turn"


def events(turn_id: str) -> str:
    """Stream holding the turn's events, one entry per event."""
    return f"{PREFIX}:{{{turn_id}}}:events"


def cancel(turn_id: str) -> str:
    """String set when somebody asked the turn to stop."""
    return f"{PREFIX}:{{{turn_id}}}:cancel"


def worker_alive(worker_id: str) -> str:
    """String a worker keeps alive while it lives (queue role; shared/liveness.py): when it
    lapses, any process ends the turns the worker ran `worker_lost`."""
    return f"{PREFIX}:worker:{{{worker_id}}}:alive"


def worker_turns(worker_id: str) -> str:
    """Set of the turns a worker claimed and has not let go of (queue role;
    shared/liveness.py): what a reaper ends once the worker's liveness lapses."""
    return f"{PREFIX}:worker:{{{worker_id}}}:turns"


def attached(turn_id: str) -> str:
    """Sorted set of client attachments to the turn's stream (member: attachment id)."""
    return f"{PREFIX}:{{{turn_id}}}:attached"


def wake(queue_name: str) -> str:
    """List a blocked worker waits on; the API pushes a token after each enqueue."""
    return f"{queue_name}:wake"


def job_owner(queue_name: str, job_id: str) -> str:
    """String: the owner of a queued turn's job, written with the job and deleted when a
    worker starts it, for the workers' fair order across users (worker/queue.py)."""
    return f"{queue_name}:owner:{job_id}"


def queued_background(queue_name: str) -> str:
    """Sorted set of the queue's background jobs queued or running (member: job id; score:
    when the entry lapses): the deployment's bound on background work (shared/queue.py)."""
    return f"{queue_name}:background"


def stream_wake(stream_id: str) -> str:
    """Sharded pub/sub channel in the slot of `events(stream_id)`: its writers `SPUBLISH`
    to it after appending, where the data role is a Cluster (api/cluster_hub.py)."""
    return f"{PREFIX}:{{{stream_id}}}:wake"


def id_of(key: str) -> str:
    """The turn id (or `user_stream_id`) between the braces of a key named for one:
    `turn`, `events`, `cancel`, `attached`, `stream_wake`."""
    return key.split("{", 1)[1].split("}", 1)[0]


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


def background_jobs(owner: str) -> str:
    """Sorted set of the owner's background jobs queued or running (member: job id; score:
    when the entry lapses; shared/queue.py)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:background"


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


def usage(owner: str) -> str:
    """Hash of the bytes each of the owner's listed conversations stores, and each of their
    turns' kept requests (`t/<turn id>`), and their sum (field `*`): the owner's storage
    ledger (shared/budgets.py)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:usage"


def kept_turns(owner: str) -> str:
    """Sorted set of the owner's turns whose kept request the ledger counts (member: turn
    id; score: when the turn's record is gone by): their entries' lapses (shared/budgets.py)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:kept"


def pending_confirmations(owner: str) -> str:
    """Sorted set of the owner's tool calls waiting for a decision, across conversations
    (member: confirmation id; score: when it lapses): a budget's count (shared/budgets.py)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:pending"


def asked(owner: str, digest: str) -> str:
    """String: the conversation and turn that asked a question of a client that resends its
    history, by the digest of that history up to the question (shared/records/history_diff.py
    `history_digest`)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:asked:{digest}"


def rate(owner: str) -> str:
    """Hash holding the owner's token bucket (shared/budgets.py), on the queue role."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:rate"


def webhook_deliveries(owner: str) -> str:
    """List of the owner's webhook delivery attempts, newest first (shared/webhooks.py)."""
    return f"{PREFIX}:user:{{{_user(owner)}}}:webhooks"


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
    """Hash of the tool calls of a conversation's latest step that waited for the user's
    decision, by id (an earlier step's leave when the next one pauses)."""
    return f"{_conversation(owner, conversation_id)}:proposals"


def conversation_turns(owner: str, conversation_id: str) -> str:
    """Sorted set of the turns that ran on a conversation (score: when each claimed it), so
    deleting the conversation can forget them (shared/conversation_state.py)."""
    return f"{_conversation(owner, conversation_id)}:turns"
