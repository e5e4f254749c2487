"""A job's class and owner are told by its id alone (shared/queue.py)."""

from __future__ import annotations

import pytest

from shared.queue import BackgroundKind, background_job_id, background_owner


@pytest.mark.parametrize(
    ("kind", "owner", "key", "job_id"),
    [
        (BackgroundKind.SUMMARY, "alice", "conv_1", "summary:alice/conv_1"),
        (BackgroundKind.TIMER, "alice", "timer_ab12", "timer:alice/timer_ab12"),
        # No owner name reaches past its "/" or into the kind's ":".
        (BackgroundKind.SUMMARY, "a/b:c", "conv/x", "summary:a%2Fb%3Ac/conv/x"),
        (BackgroundKind.SUMMARY, "zoë", "k", "summary:zo%C3%AB/k"),
    ],
)
def test_a_background_job_id_names_its_kind_and_owner(
    kind: BackgroundKind, owner: str, key: str, job_id: str
) -> None:
    assert background_job_id(kind, owner, key) == job_id
    assert background_owner(job_id) == owner


@pytest.mark.parametrize(
    "job_id",
    [
        "0f8e3c2a9b7d4e6f8a1b2c3d4e5f6a7b",  # a turn's bare id: live
        "timer:timer_ab12",  # queued before jobs named their owner: runs unadmitted
        "cron:alice/x",  # no kind of ours
        "",
    ],
)
def test_ids_of_live_jobs_and_unknown_ones_name_no_background_owner(job_id: str) -> None:
    assert background_owner(job_id) is None
