"""The tests' users: the API keys that name them and the headers that sign a request in as one.

Key `key-<name>` belongs to user `<name>-<run>`, a user no other test has, so the
conversations, notes and turns a test finds are its own.
"""

from __future__ import annotations

import uuid

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


def as_user(name: str) -> dict[str, str]:
    """The headers of a request signed in with `key-<name>`."""
    return {"Authorization": f"Bearer key-{name}"}


def keys_for_two() -> str:
    """`BERNARD_API_KEYS` for a test's own alice and bob."""
    run = uuid.uuid4().hex[:8]
    return f"key-alice:alice-{run},key-bob:bob-{run}"
