"""Which conversation a chat request continues.

A known id continues that conversation (the worker appends only the messages it has not
stored yet); an unknown id starts a conversation under that id, so a client may choose
its own (a voice satellite per room, say); no id starts one under a fresh id. Another
user's conversation answers 404, exactly as a missing one would to a prober.
"""

from __future__ import annotations

import re

from redis.asyncio import Redis

from api.errors import ApiError, invalid
from shared.records import ConversationExistsError, RecordKeeper

_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


async def resolve_conversation(redis: Redis, owner: str, conversation_id: str | None) -> str:
    """The id of the conversation this request belongs to, created if need be."""
    keeper = RecordKeeper(redis)
    if conversation_id is None:
        return await keeper.create_conversation(owner)
    if not _ID.match(conversation_id):
        raise invalid("conversation_id must be 1-128 letters, digits or _ . : -", "conversation_id")
    try:
        return await keeper.create_conversation(owner, conversation_id=conversation_id)
    except ConversationExistsError:
        existing = await keeper.get_conversation(conversation_id)
        if existing is None or existing.owner != owner:
            raise ApiError(
                404,
                f"no conversation with id '{conversation_id}'",
                param="conversation_id",
                code="conversation_not_found",
            ) from None
        return conversation_id
