"""What the keeper's reading and writing halves share: a Redis client, the owner whose
conversations it reaches, and where each conversation's keys are (shared/records/keeper.py
says what they hold)."""

from __future__ import annotations

import orjson
from redis.asyncio import Redis

from shared import keys
from shared.records.messages import Message

DEFAULT_RETENTION_S = 30 * 86_400


class ConversationStore:
    """A Redis client and the owner whose conversations it reaches."""

    def __init__(
        self,
        redis: Redis,
        owner: str,
        *,
        retention_s: int = DEFAULT_RETENTION_S,
        queue: Redis | None = None,
    ) -> None:
        self._redis = redis
        # The queue role (shared/keys.py), for the background jobs; the same client by default.
        self._queue = queue if queue is not None else redis
        self.owner = owner
        self.retention_s = retention_s

    def _keys(self, conversation_id: str) -> tuple[str, str, str]:
        """The conversation's metadata, messages and calls keys."""
        return (
            keys.conversation(self.owner, conversation_id),
            keys.conversation_messages(self.owner, conversation_id),
            keys.conversation_calls(self.owner, conversation_id),
        )

    async def _proposals(self, conversation_id: str) -> list[Message]:
        """The tool calls of the conversation's latest step that waited for a decision,
        oldest first (`Archivist.proposals`)."""
        key = keys.conversation_proposals(self.owner, conversation_id)
        raw = await self._redis.hvals(key)  # type: ignore[misc]
        found = [orjson.loads(value) for value in raw]
        return sorted(found, key=lambda p: float(p.get("expires_at", 0)))
