"""The tests' users: the API keys that name them and the headers that sign a request in as one.

Key `key-<name>` belongs to user `<name>-<run>`, a user no other test has, so the
conversations, notes and turns a test finds are its own.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


def as_user(name: str) -> dict[str, str]:
    """The headers of a request signed in with `key-<name>`."""
    return {"Authorization": f"Bearer key-{name}"}


@dataclass(frozen=True)
class Owners:
    """The users `key-alice` and `key-bob` sign in as, under names of one test's own: the
    suite's Redis holds other tests' alice and bob, and budgets count what a user holds."""

    alice: str
    bob: str

    @classmethod
    def fresh(cls) -> Owners:
        run = uuid.uuid4().hex[:8]
        return cls(alice=f"alice-{run}", bob=f"bob-{run}")

    @property
    def api_keys(self) -> str:
        """`BERNARD_API_KEYS` that give `key-alice` and `key-bob` to these two."""
        return f"key-alice:{self.alice},key-bob:{self.bob}"


def keys_for_two() -> str:
    """`BERNARD_API_KEYS` for a test's own alice and bob."""
    return Owners.fresh().api_keys
