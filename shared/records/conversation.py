"""A conversation as the record keeper gives it back (`Conversation`, `Continuation`), and
the errors its writes raise.

shared/records/keeper.py reads and writes them in Redis; a conversation's status and its
moves are shared/conversation_state.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.records.messages import Message
from shared.titles import TitleSource

__all__ = [
    "Continuation",
    "Conversation",
    "ConversationExistsError",
    "ConversationFullError",
    "ConversationLostError",
    "ConversationNotFoundError",
]


@dataclass(slots=True)
class Continuation:
    """What continuing a conversation stored: the `new` messages, the whole `history`
    (oldest first) they now end, and the number of messages stored (`length`)."""

    new: list[Message]
    history: list[Message]
    length: int


class ConversationNotFoundError(LookupError):
    """No conversation has this id."""


class ConversationLostError(ConversationNotFoundError):
    """The writing turn no longer holds the conversation: it was deleted (and perhaps
    created again), or another turn holds it."""


class ConversationExistsError(ValueError):
    """A conversation with this id already exists."""


class ConversationFullError(ValueError):
    """Appending would take the conversation over its cap of bytes (shared/budgets.py)."""

    def __init__(self, conversation_id: str, limit: int) -> None:
        super().__init__(
            f"the conversation '{conversation_id}' is full: what it stores would go over "
            f"{limit} bytes (BERNARD_MAX_CONVERSATION_BYTES); start a new conversation or "
            "delete this one"
        )
        self.limit = limit


@dataclass(slots=True)
class Conversation:
    """A conversation's metadata."""

    id: str
    owner: str
    created_at: float
    updated_at: float
    message_count: int
    metadata: dict[str, Any] = field(default_factory=dict)
    # What its status derives from (shared/conversation_state.py): the turn that last
    # claimed it (running, or ended) and when, and the turn whose proposed calls wait for a
    # decision until `paused_until`.
    active_turn: str | None = None
    active_since: float | None = None
    paused_turn: str | None = None
    paused_until: float | None = None
    # The turns of messages waiting in line behind the running turn, first first.
    waiting: tuple[str, ...] = ()
    # A fresh id per creation: a re-created id is another incarnation.
    incarnation: str | None = None
    # What its messages and call records hold (shared/budgets.py).
    bytes: int = 0
    # Its title, generated after the first exchange or the user's (shared/titles.py).
    title: str | None = None
    title_source: TitleSource | None = None
