"""A user's notes and their budget (shared/notes.py), against the real Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from shared.connection import connect
from shared.notes import NotesFullError, NoteStore
from tests.support.session_redis import session_redis_url
from tests.support.stack import make_settings


@pytest.fixture
async def store() -> AsyncIterator[NoteStore]:
    redis: Redis = connect(session_redis_url())
    settings = make_settings(max_notes_per_user=5, max_note_chars=40)
    notes = NoteStore.of(redis, f"test-notes-{uuid.uuid4().hex}", settings)
    yield notes
    await redis.delete(notes.key)
    await redis.aclose()


async def test_the_notes_cap_holds_under_concurrent_adds(store: NoteStore) -> None:
    async def add(n: int) -> str:
        try:
            await store.add(f"note {n}")
        except NotesFullError:
            return "full"
        return "saved"

    outcomes = await asyncio.gather(*(add(n) for n in range(20)))

    assert sorted(outcomes) == ["full"] * 15 + ["saved"] * 5
    assert await store.redis.hlen(store.key) == 5  # type: ignore[misc]


async def test_a_full_notebook_and_a_long_note_are_refused_naming_their_settings(
    store: NoteStore,
) -> None:
    with pytest.raises(ValueError, match="BERNARD_MAX_NOTE_CHARS"):
        await store.add("x" * 41)
    for n in range(5):
        await store.add(f"note {n}")
    with pytest.raises(NotesFullError, match="BERNARD_MAX_NOTES_PER_USER"):
        await store.add("one too many")
    await store.forget("note 0")
    assert (await store.add("room again")).text == "room again"
