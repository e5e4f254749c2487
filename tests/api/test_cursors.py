"""Frame ids as cursors (api/cursors.py): how an entry's frames are numbered, and the frames
a new turn's stream starts with."""

from __future__ import annotations

import pytest

from api.cursors import after_start, numbered, parse_cursor
from api.encodings import encoder_for
from shared.events import Start
from shared.lifecycle import SEALED_ID
from shared.requests import AgentRequest, Delivery, TurnRequest
from shared.turn_record import TurnRecord


@pytest.mark.parametrize(
    ("frames", "ids"),
    [
        ([], []),
        (["a"], ["5-0"]),
        (["a", "b", "c"], ["5-0:0", "5-0:1", "5-0:2"]),
    ],
    ids=["none", "one keeps the entry id", "several are numbered"],
)
def test_an_entrys_frames_are_numbered(frames: list[str], ids: list[str]) -> None:
    assert numbered("5-0", list(frames)) == list(zip(ids, frames, strict=True))


@pytest.mark.parametrize(
    ("count", "frames"), [(1, [None]), (3, [0, 1, 2])], ids=["one frame", "several"]
)
def test_every_numbered_id_parses_back_as_a_cursor_on_its_frame(
    count: int, frames: list[int | None]
) -> None:
    cursors = [parse_cursor(frame_id) for frame_id, _ in numbered("5-0", ["x"] * count)]
    assert [(c.entry_id, c.frame) for c in cursors if c] == [("5-0", k) for k in frames]


def test_the_done_entrys_frames_are_named_done_and_parse_back_to_it() -> None:
    # The sentinel that seals a stream is no id to show: "18446744073709551615-...".
    assert [frame_id for frame_id, _ in numbered(SEALED_ID, ["a", "b", "c"])] == [
        "done:0",
        "done:1",
        "done:2",
    ]
    assert [frame_id for frame_id, _ in numbered(SEALED_ID, ["a"])] == ["done"]
    parsed = [parse_cursor(text) for text in ("done", "done:2", f"{SEALED_ID}:1")]
    assert [(c.entry_id, c.frame) for c in parsed if c] == [
        (SEALED_ID, None),
        (SEALED_ID, 2),
        (SEALED_ID, 1),
    ]


@pytest.mark.parametrize("kind", ["chat", "completion", "conversation"])
def test_a_new_stream_starts_with_its_start_entrys_frames(kind: str) -> None:
    record = TurnRecord(
        id="t1", owner="o", request=TurnRequest(AgentRequest([]), Delivery(kind)), model="bernard"
    )
    encoder = encoder_for(record)
    resume = after_start(encoder, "7-1")
    assert resume.after == "7-1"
    assert not resume.finished
    assert resume.head == numbered("7-1", encoder.frames(Start()))
