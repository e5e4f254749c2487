"""Every Redis key and channel name Bernard uses, in one place.

A turn's keys share the hash tag `{<turn_id>}` (a conversation's, `{c:<id>}`), so the
scripts that move a turn touch one slot's keys. Bernard still needs one Redis primary, not
a Cluster, as arq does: the turn's creating transaction also queues arq's job, and the
claim script also adds the turn to `RUNNING_TURNS`, one round trip each instead of two.
"""

from __future__ import annotations

PREFIX = "bernard"

CANCEL_CHANNEL = f"{PREFIX}:cancel"
RUNNING_TURNS = f"{PREFIX}:running"
WORKERS = f"{PREFIX}:workers"


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


def conversation(conversation_id: str) -> str:
    """Hash holding a conversation's metadata."""
    return f"{PREFIX}:{{c:{conversation_id}}}:conversation"


def conversation_messages(conversation_id: str) -> str:
    """List of a conversation's recorded messages, oldest first."""
    return f"{PREFIX}:{{c:{conversation_id}}}:messages"


def conversation_calls(conversation_id: str) -> str:
    """List of a conversation's recorded LLM and tool calls."""
    return f"{PREFIX}:{{c:{conversation_id}}}:calls"
