"""A backlog starts round-robin across owners, the owners running least first, live jobs
before background ones (worker/fairness.py)."""

from __future__ import annotations

import pytest

from worker.fairness import Candidate, fair_order


def live(job_id: str, owner: str | None) -> Candidate:
    return Candidate(job_id, owner)


def background(job_id: str, owner: str) -> Candidate:
    return Candidate(job_id, owner, background=True)


@pytest.mark.parametrize(
    ("candidates", "running", "order"),
    [
        # One owner: queue order.
        ([live("a1", "a"), live("a2", "a")], {}, ["a1", "a2"]),
        # A backlog in front of another user's first turn: round-robin.
        (
            [live("a1", "a"), live("a2", "a"), live("a3", "a"), live("b1", "b")],
            {},
            ["a1", "b1", "a2", "a3"],
        ),
        # The owner already running jobs here waits for those that run none.
        ([live("a1", "a"), live("a2", "a"), live("b1", "b")], {"a": 2}, ["b1", "a1", "a2"]),
        ([live("a1", "a"), live("b1", "b"), live("c1", "c")], {"a": 1, "b": 2}, ["c1", "a1", "b1"]),
        # Live before background, whoever queued first; background fair among itself.
        (
            [background("s1", "a"), background("s2", "a"), live("b1", "b"), background("s3", "c")],
            {},
            ["b1", "s1", "s3", "s2"],
        ),
        # An owner's live jobs count as served rounds for its background ones.
        ([live("a1", "a"), background("s1", "a"), background("s2", "b")], {}, ["a1", "s2", "s1"]),
        # Jobs of no known owner (queued before jobs named theirs) share one turn.
        ([live("x1", None), live("x2", None), live("b1", "b")], {}, ["x1", "b1", "x2"]),
        ([], {"a": 3}, []),
    ],
)
def test_a_backlog_is_ordered_round_robin_across_owners(
    candidates: list[Candidate], running: dict[str | None, int], order: list[str]
) -> None:
    assert [c.job_id for c in fair_order(candidates, running)] == order
