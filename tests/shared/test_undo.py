"""shared/records/undo.py: which call "undo" puts back, from a conversation's call records
(table-driven; through the API and a real Home Assistant: tests/test_policy.py,
tests/homeassistant/test_house_policy.py)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.records.undo import Restore, TooLate, Undoable, find_undo

OFF = {
    "calls": [
        {"domain": "light", "service": "turn_on", "entity_id": "light.k", "data": {"brightness": 9}}
    ],
    "said": "light.k back to on, brightness 4 %",
}
RESTORE = Restore(tuple(OFF["calls"]), OFF["said"])
NOW, WINDOW = 1000.0, 60.0


def done(call_id: str, at: float, **more: Any) -> dict[str, Any]:
    return {"call_id": call_id, "kind": "tool", "status": "completed", "completed_at": at, **more}


CASES: list[tuple[str, list[dict[str, Any]], Undoable | TooLate | None]] = [
    ("no calls", [], None),
    ("a call that changed nothing", [done("a", 990)], None),
    ("the last change", [done("a", 990, undo=OFF)], Undoable("a", RESTORE, 990)),
    ("at the window's edge", [done("a", 940, undo=OFF)], Undoable("a", RESTORE, 940)),
    ("past the window", [done("a", 939.5, undo=OFF)], TooLate(939.5, WINDOW)),
    (
        "the latest of two",
        [done("a", 980, undo=OFF), done("b", 990, undo=OFF)],
        Undoable("b", RESTORE, 990),
    ),
    ("a failed call", [{**done("a", 990, undo=OFF), "status": "failed"}], None),
    ("a call still running", [{"call_id": "a", "status": "running", "undo": OFF}], None),
    ("undone", [done("a", 980, undo=OFF), done("u", 990, undid="a")], None),
    (
        "undone, the one before next",
        [done("a", 970, undo=OFF), done("b", 980, undo=OFF), done("u", 990, undid="b")],
        Undoable("a", RESTORE, 970),
    ),
    (
        "undone, the one before too late",
        [done("a", 900, undo=OFF), done("b", 980, undo=OFF), done("u", 990, undid="b")],
        TooLate(900, WINDOW),
    ),
    ("no calls to make", [done("a", 990, undo={"calls": [], "said": "x"})], None),
    ("not calls", [done("a", 990, undo={"calls": [{"domain": "light"}], "said": "x"})], None),
    ("five calls", [done("a", 990, undo={"calls": OFF["calls"] * 5, "said": "x"})], None),
    ("no words", [done("a", 990, undo={"calls": OFF["calls"]})], None),
]


@pytest.mark.parametrize(
    ("records", "found"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_the_last_change_not_undone_within_the_window(
    records: list[dict[str, Any]], found: Undoable | TooLate | None
) -> None:
    assert find_undo(records, now=NOW, window_s=WINDOW) == found
