"""The table a state machine is written as: one row per move a transition makes from some
statuses. A turn's (shared/lifecycle.py `TRANSITIONS`) and a conversation's
(shared/conversation_state.py `TABLE`) are such tables, which their scripts follow and
their tests hold row by row against Redis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

# Covariant: a row is read, never written, so a row of `RUNNING` to `Claimed.CLAIMED` is a
# row of any status to any outcome (shared/lifecycle.py `Move`).
TransitionT = TypeVar("TransitionT", covariant=True)
StatusT = TypeVar("StatusT", covariant=True)
OutcomeT = TypeVar("OutcomeT", covariant=True)
_Transition = TypeVar("_Transition")
_Status = TypeVar("_Status")
_Outcome = TypeVar("_Outcome")


@dataclass(frozen=True, slots=True)
class Row(Generic[TransitionT, StatusT, OutcomeT]):
    """From any of `source`, `transition` has `outcome` and leaves the machine `target`
    (None: as it was). `when` names what else decides between rows of the same source; a
    row without it is the only one for its statuses."""

    transition: TransitionT
    source: frozenset[StatusT]
    outcome: OutcomeT
    target: StatusT | None
    when: str = ""


def row(
    transition: _Transition,
    source: _Status | frozenset[_Status],
    outcome: _Outcome,
    target: _Status | None = None,
    when: str = "",
) -> Row[_Transition, _Status, _Outcome]:
    """A row from one status (`source`) or several (a frozenset of them)."""
    sources = source if isinstance(source, frozenset) else frozenset({source})
    return Row(transition, sources, outcome, target, when)
