"""Every Redis key and channel name Bernard uses, in one place, and how each one ends.

Two roles, which may be two deployments (`BERNARD_QUEUE_REDIS_URL`, `REDIS_URL`; both default
to one server, and then nothing below costs a round trip more than one Redis did):

- **queue** (`BERNARD_QUEUE_REDIS_URL`): arq's queue and job keys (`arq:job:*`,
  `arq:in-progress:*`, `arq:retry:*`, the health check), the wake lists (`wake`), the
  owners of queued turns (`job_owner`), `RUNNING_TURNS`, `WORKERS`, each worker's
  liveness (`worker_alive`, `worker_turns`: shared/liveness.py), `CANCELS`, `METRICS`,
  `TOOLS`, `DEPLOYMENT`, `MCP_SERVERS`, `CANCEL_CHANNEL`, the per-user counters `active_turns`,
  `open_streams`, `background_jobs` and `rate` (the token bucket), and the queue's
  `queued_background`. Small (entries per live turn, worker and user, not per token),
  touched a few times per turn, and each must be one consistent view: a user's limits hold
  across every API process, the reapers share one running set, and arq's own scripts span
  its keys. arq has no Cluster support, so this role is one primary: a plain Redis or one
  behind Sentinel (`redis+sentinel://`), never a Cluster.
- **data** (`REDIS_URL`): everything that grows with the traffic. Per turn `{<turn_id>}`:
  `turn`, `events`, `cancel`, `lease`, `attached`; per conversation `{c:<owner>/<id>}`;
  per user `{<owner>}`: `notes`, `timers` (the payloads: their jobs are on the queue),
  `conversations`, `usage`, `kept`, `pending`, `turns`; the user's event stream
  `{user:<owner>}`; the hub's wake streams. A plain Redis, Sentinel, or a Cluster
  (`redis+cluster://`): every script and transaction here touches one hash tag, so one
  slot; only pipelines (which a Cluster client splits per node) mix tags. In a Cluster the
  stream hub cannot `XREAD` streams of different slots together, so there it waits on
  sharded pub/sub instead of wake streams (api/cluster_hub.py): the stream's writer
  `SPUBLISH`es `stream_wake(id)`, a channel in the stream's own slot, after its appends.

No script or transaction spans the two roles. What spanned them is split in two halves,
each idempotent, run in the order that leaves a crash between them to a path that already
ends turns (shared/turns.py). With one server for both roles, halves that do not wait
on each other's answer share one pipeline, so they still cost one round trip:

- create: admit on the queue (`active_turns`); then the data half (record, stream with its
  `start`, attachment: one script; the owner's `turns` index beside it); then the queue
  half (arq's job and the wake-up). If the queue half fails the API ends the turn
  `turn_lost` at once. If the process dies between the halves, the turn stays `queued` with
  no job on the queue; whoever next looks at it finds it stranded (`queued` past a grace,
  and arq holds neither its job nor its in-progress key) and ends it `turn_lost`: the
  relay of a client waiting on it (after each quiet keepalive), and the admission of its
  owner at the limit. A turn nobody looks at again expires with its TTL.
- claim: the queue half first (`RUNNING_TURNS` with the deadline past which it is overdue
  whatever its worker, and the worker's `worker_turns`), then the data half (`queued` ->
  `running`, the record naming its worker). A worker dying between them leaves the turn
  among a dead worker's: a reaper ends it `worker_lost`. A refused claim takes the turn out
  of the worker's, and its running-set entry too if the turn has ended or is gone.
- finish: the data half ends the turn (once: seals the stream); then the
  queue half releases it (`RUNNING_TURNS`, the owner's `active_turns` entry) and, only for
  the call that ended it, counts the ending (`METRICS`). A crash between them leaves the
  running-set entry: a reaper finds it, its finish returns "already ended", and the release
  runs then (the count of that one ending is lost), with the webhook's delivery if no job
  took it yet (the target left in the record: shared/webhooks.py). A turn ended while still
  queued has no running-set entry; its `active_turns` entry goes at the admission check of
  its owner, and its webhook, should that crash come between, is queued by the refused
  claim of its job (`TurnStore.claim`).
- reaping: the candidates are the turns of workers whose `worker_alive` lapsed, the
  entries of `RUNNING_TURNS` a live worker let go of (a negative score: shared/liveness.py)
  and its overdue ones (queue); the owners and the ending come from the data
  role; each ending is the finish above. No script spans the worker's key and the turn's:
  the reaper looks at the one, then ends the other (shared/liveness.py says why that holds).
- cancel: the cancel key (data: the durable fact, read by the claim) before the message on
  `CANCEL_CHANNEL` and the entry in `CANCELS` (queue: the fast path, and what each
  worker's liveness renewal reads in case it missed the message).
- open stream: the count (`open_streams`, queue) and the turn's `attached` entry (data) are
  sent together; a refused stream takes its `attached` entry back.

A failover (Sentinel, or a Cluster shard) can lose the writes its primary had not yet
replicated; docs/scaling.md says what that means for a turn and how its client is told.

Every key either expires or has an owner that deletes it (tests/test_abuse.py walks them):

- per turn (`turn`, `events`, `cancel`, `lease`, `attached`): a TTL from creation (a week
  for a turn nobody runs), set to the retention when the turn ends; `attached` is deleted
  when the turn ends. `lease` is only what a worker of before issue 25 renews (seconds).
- per worker: `worker_alive` lives `BERNARD_LEASE_TTL_S` from its last renewal;
  `worker_turns` an hour (`shared.liveness.TURNS_TTL_S`), renewed with it, emptied by the
  worker as its turns end and by the reapers once it died. `CANCELS`: an hour from the last
  cancel (`shared.cancel.CANCEL_NOTICE_S`), each entry lapsing at its score, lapsed ones
  dropped at every worker's renewal.
- per conversation: the retention (`BERNARD_CONVERSATION_RETENTION_S`), renewed on use;
  `DELETE /v1/conversations/{id}` removes them at once; the keys of every turn that ran on
  it (`conversation_turns`) lose their content at once and go a minute later, so the
  clients of a turn the deletion ended still read that ending (shared/turns.py, `forget`).
- per user (`active_turns`, `open_streams`, `background_jobs`) and per queue
  (`queued_background`): a TTL renewed on use; each entry also lapses at its own deadline
  (the score), so a crashed process cannot hold a slot for long. A background job's
  entries leave when the worker that ran it finishes it (shared/queue.py).
  `rate` expires once its bucket would be full again. `usage` (the storage ledger) lives
  a minute longer than the conversations it counts, renewed by each append; its entries
  leave with their conversation's index entry (shared/budgets.py). `pending` lives as long
  as the confirmations it counts, each entry lapsing at its own (the score); `asked:<digest>`
  (which conversation asked the history of that digest a question) as long as the calls it
  asked about wait, one per paused step (so within the `pending` budget).
  `notes`, `timers`, the owner's event stream (`events(user_stream_id(owner))`, capped
  at 1,000 entries) and `conversations` (the index of the owner's conversations) live as long as
  conversations do, renewed on use; index entries of expired conversations are dropped
  as the index is read.
  `webhooks` (the owner's log of webhook attempts) keeps the newest 100 and lives
  `BERNARD_WEBHOOK_LOG_RETENTION_S` from the latest.
  `turns` (the index of the owner's turns, `GET /v1/turns`) is renewed at each turn's
  creation to the longest a turn can live (a week unfinished plus the turn retention),
  keeps the newest `TURN_INDEX_MAX` entries, and drops those of expired turns as it is read.
- `job_owner`: arq's job expiry (a day), as the job key it stands beside; deleted when a
  worker starts the job.
- the hub's wake streams: an hour, renewed while the API process lives. `TOOLS` (what the
  workers offer) and `DEPLOYMENT` (what they run: shared/deployment.py): a day from the
  last time a worker published them (each does hourly).
  `MCP_SERVERS` (a field per worker: its MCP servers' health, shared/mcp_health.py): the
  same day, renewed with each publish; a worker deletes its field when it stops, and each
  publish drops the fields of workers no longer in `WORKERS`.
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


def lease(turn_id: str) -> str:
    """String a worker keeps alive while it runs the turn."""
    return f"{PREFIX}:{{{turn_id}}}:lease"


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
    `turn`, `events`, `cancel`, `lease`, `attached`, `stream_wake`."""
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
