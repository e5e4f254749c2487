"""The order in which a worker starts a backlog: fair across users.

While every job slot of every worker is busy, new jobs wait on arq's queue, and a worker
that frees a slot would start them in the order they were queued: one user's backlog of
fifty turns in front of another user's first. `fair_order` orders the due jobs a worker
read instead: round-robin across their owners, each owner's own jobs in queue order,
with the jobs an owner already runs on this worker counted as rounds already served (an
owner running none comes first), and live jobs (turns) before background ones
(summaries, timer firings: shared/queue.py), which can wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    """A due job a worker read: its id, owner (None when unknown) and class."""

    job_id: str
    owner: str | None
    background: bool = False


def fair_order(
    candidates: Sequence[Candidate], running: Mapping[str | None, int]
) -> list[Candidate]:
    """`candidates` (in queue order) in the order to start them; `running` counts the jobs
    of each owner this worker runs now."""
    served: dict[str | None, int] = {}
    ranked = []
    for position, candidate in enumerate(candidates):
        owner = candidate.owner
        rank = served[owner] if owner in served else running.get(owner, 0)
        served[owner] = rank + 1
        ranked.append((candidate.background, rank, position))
    order = sorted(range(len(candidates)), key=ranked.__getitem__)
    return [candidates[index] for index in order]
