"""Where a turn that joined its conversation's line stands (shared/conversation_state.py):
holding the conversation, waiting behind a turn that may still run, or out of it."""

from __future__ import annotations

import time
from enum import StrEnum

from shared import keys
from shared.connection import reply_text
from shared.conversation_state import may_run
from shared.turns.reaping import Reaping


class InLine(StrEnum):
    """Where a turn that joined its conversation's line stands (`TurnStore.take_turn`)."""

    HOLDS = "holds"  # its turn came: it holds the conversation
    WAITS = "waits"  # behind a turn that may still run
    OUT = "out"  # the conversation is gone, or the turn left the line


class TurnTaking(Reaping):
    """Finds a waiting turn's place in its conversation's line, moving a line whose holder
    ended on."""

    async def take_turn(self, owner: str, conversation_id: str, turn_id: str) -> InLine:
        """Where `turn_id`, a turn that joined its conversation's line, stands: `HOLDS` the
        conversation, `WAITS` behind a turn that may still run, or is `OUT` of it (the
        conversation is gone, or the turn left the line). A holder found ended moves the
        line on first (`advance`): a move whoever ended it did not live to make is made
        here."""
        meta = keys.conversation(owner, conversation_id)
        for _ in range(3):  # the line moved between the read and the advance
            fields = ["active_turn", "active_since", "waiting"]
            active_raw, since, waiting = await self.redis.hmget(meta, fields)  # type: ignore[misc]
            active = reply_text(active_raw) if active_raw else None
            if active == turn_id:
                return InLine.HOLDS
            if turn_id not in reply_text(waiting or b"").split():
                return InLine.OUT
            now = time.time()
            if active is not None:
                status = await self.settle(active)
                if may_run(status, float(since) if since else None, now):
                    return InLine.WAITS
            await self.advance(owner, conversation_id, active or "")
        return InLine.WAITS
