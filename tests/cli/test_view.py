"""What the terminal shows of a turn (cli/view.py): events folded into blocks, and which of
them are settled (printed once, for good) while the rest is still being redrawn."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console
from rich.text import Text

from cli.frames import TurnEvent
from cli.view import (
    ConfirmationBlock,
    ErrorBlock,
    Piece,
    TextBlock,
    TextPiece,
    ToolBlock,
    TurnView,
    ending_line,
    render,
    render_live,
    settled_end,
)

FENCE = "```"


@pytest.mark.parametrize(
    ("text", "settled"),
    [
        ("", ""),
        ("Hello wor", ""),
        ("One line\n", ""),
        ("First paragraph.\n\nSecond", "First paragraph.\n\n"),
        ("One.\n\nTwo.\n\nThr", "One.\n\nTwo.\n\n"),
        ("- a\n- b\n", ""),
        (f"{FENCE}py\nx = 1\n\ny = 2\n", ""),
        (f"{FENCE}py\nx = 1\n\ny = 2\n{FENCE}\nafter", f"{FENCE}py\nx = 1\n\ny = 2\n{FENCE}\n"),
        (f"Intro\n\n{FENCE}\ncode\n\nmore", "Intro\n\n"),
        ("Trailing blank\n\n", "Trailing blank\n\n"),
        ("Spaces on the blank line\n   \nnext", "Spaces on the blank line\n   \n"),
    ],
)
def test_whole_paragraphs_outside_code_fences_are_settled(text: str, settled: str) -> None:
    assert text[: settled_end(text)] == settled


def event(kind: str, **data: Any) -> TurnEvent:
    return TurnEvent(kind, data)


CALL = event("tool_call", id="c1", name="survey", arguments='{"topic": "otters"}')
STEP = event("tool_progress", tool_call_id="c1", tool="survey", phase="step", message="Surveying")
PROGRESS = event(
    "tool_progress",
    tool_call_id="c1",
    tool="survey",
    phase="progress",
    message="1/3",
    current=1,
    total=3,
)
RESULT = event("tool_result", tool_call_id="c1", name="survey", output="3 counted", is_error=False)
PROPOSAL = event(
    "awaiting_confirmation",
    confirmation_id="conf_1",
    tool_call={"id": "c2", "name": "save_note", "arguments": '{"text": "x"}'},
    summary="Remember “x”",
    expires_at=1.0,
)

FOLDS = [
    (
        "deltas join one text block",
        [event("text_delta", text="Hel"), event("text_delta", text="lo")],
        [TextBlock("Hello")],
    ),
    (
        "a tool's steps, progress and result land on its block",
        [CALL, STEP, PROGRESS, RESULT],
        [
            ToolBlock(
                id="c1",
                name="survey",
                arguments='{"topic": "otters"}',
                steps=["Surveying"],
                current=1,
                total=3,
                progress="1/3",
                output="3 counted",
            )
        ],
    ),
    (
        "progress for a call never announced makes its block",
        [STEP],
        [ToolBlock(id="c1", name="survey", steps=["Surveying"])],
    ),
    (
        "text after a tool is a new block",
        [event("text_delta", text="Let me look. "), CALL, event("text_delta", text="Done.")],
        [
            TextBlock("Let me look. "),
            ToolBlock(id="c1", name="survey", arguments='{"topic": "otters"}'),
            TextBlock("Done."),
        ],
    ),
    (
        "a proposal and an error",
        [PROPOSAL, event("error", code="tool_error", message="boom")],
        [
            ConfirmationBlock("conf_1", "save_note", '{"text": "x"}', "Remember “x”", "c2"),
            ErrorBlock("tool_error", "boom"),
        ],
    ),
    (
        "rows stored and traces draw nothing",
        [event("message", id="msg_1"), event("trace", type="memory")],
        [],
    ),
]


@pytest.mark.parametrize(("events", "blocks"), [f[1:] for f in FOLDS], ids=[f[0] for f in FOLDS])
def test_events_fold_into_blocks(events: list[TurnEvent], blocks: list[Any]) -> None:
    view = TurnView()
    for item in events:
        view.apply(item)
    assert view.blocks == blocks


def test_done_says_how_the_turn_ended() -> None:
    view = TurnView()
    view.apply(
        event(
            "done", turn_id="t1", status="failed", error={"code": "upstream_error", "message": "no"}
        )
    )
    assert (view.turn_id, view.status, view.done) == ("t1", "failed", True)
    line = ending_line(view)
    assert line is not None and line.plain == "turn failed (upstream_error): no"
    assert ending_line(TurnView(status="completed")) is None


UPSTREAM_DOWN = {"code": "upstream_error", "message": "the upstream model failed"}
CANCEL = {"code": "turn_cancelled", "message": "the turn was cancelled"}


@pytest.mark.parametrize(
    ("events", "said"),
    [
        # The stream's error frame says it; the end says nothing more.
        (
            [event("error", **UPSTREAM_DOWN), event("done", status="failed", error=UPSTREAM_DOWN)],
            ["error (upstream_error): the upstream model failed"],
        ),
        # A chat completion's stream ends without saying how: the turn object does.
        (
            [event("done", status="failed", error=UPSTREAM_DOWN)],
            ["turn failed (upstream_error): the upstream model failed"],
        ),
        # The user's own cancel is no red error.
        (
            [event("error", **CANCEL), event("done", status="cancelled", error=CANCEL)],
            ["stopped"],
        ),
        ([event("done", status="cancelled", error=CANCEL)], ["stopped"]),
    ],
)
def test_how_a_turn_ended_is_said_once(events: list[TurnEvent], said: list[str]) -> None:
    view = TurnView()
    for item in events:
        view.apply(item)
    drawn = [draw(render(piece)).strip() for piece in view.settle()]
    line = ending_line(view)
    if line is not None:
        drawn.append(line.plain)
    assert drawn == said


def test_a_stop_is_not_drawn_as_an_error() -> None:
    stopped = render(ErrorBlock("turn_cancelled", "the turn was cancelled"))
    failed = render(ErrorBlock("upstream_error", "no"))
    assert isinstance(stopped, Text) and isinstance(failed, Text)
    assert (stopped.plain, str(stopped.style)) == ("stopped", "yellow")
    assert (failed.plain, str(failed.style)) == ("error (upstream_error): no", "red")


def settle_after(view: TurnView, *events: TurnEvent) -> list[Piece]:
    for item in events:
        view.apply(item)
    return view.settle()


def test_text_settles_a_paragraph_at_a_time_and_never_twice() -> None:
    view = TurnView()
    assert settle_after(view, event("text_delta", text="First para")) == []
    assert view.live() == [TextPiece("First para")]
    assert settle_after(view, event("text_delta", text="graph.\n\nSec")) == [
        TextPiece("First paragraph.\n\n")
    ]
    assert view.live() == [TextPiece("Sec", gap=True)]
    assert settle_after(view, event("text_delta", text="ond.")) == []
    assert settle_after(view, event("done", status="completed")) == [TextPiece("Second.", gap=True)]
    assert view.settle() == [] and view.live() == []


def test_a_tool_settles_once_it_has_its_result_and_holds_back_what_follows() -> None:
    view = TurnView()
    assert settle_after(view, event("text_delta", text="Looking.\n\n"), CALL, STEP) == [
        TextPiece("Looking.\n\n")
    ]
    assert [type(piece) for piece in view.live()] == [ToolBlock]
    assert settle_after(view, event("text_delta", text="Found.\n\nMore")) == []
    settled = settle_after(view, RESULT)
    assert [type(piece) for piece in settled] == [ToolBlock, TextPiece]
    assert settled[1] == TextPiece("Found.\n\n")
    assert view.live() == [TextPiece("More", gap=True)]


def test_everything_settles_when_the_turn_ends_even_a_tool_without_result() -> None:
    view = TurnView()
    settled = settle_after(view, CALL, PROPOSAL, event("done", status="awaiting_confirmation"))
    assert [type(piece) for piece in settled] == [ToolBlock, ConfirmationBlock]
    assert view.confirmations[0].confirmation_id == "conf_1"


def draw(renderable: Any, width: int = 60) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_a_running_tool_draws_its_steps_and_progress_bar_and_a_finished_one_its_output() -> None:
    view = TurnView()
    for item in (CALL, STEP, PROGRESS):
        view.apply(item)
    running = draw(render_live(view))
    assert "survey" in running and "Surveying" in running and "1/3" in running
    assert "━" in running and "running" in running
    view.apply(RESULT)
    finished = draw(render(view.blocks[0]))
    assert "3 counted" in finished and "running" not in finished


def test_a_call_approved_on_its_confirmation_does_not_repeat_its_arguments() -> None:
    # The resumed turn's view knows what the user approved, laid out as its card showed it.
    view = TurnView(approved={"c1": '{"topic":"otters"}', "c2": '{"topic": "seals"}'})
    view.apply(CALL)
    view.apply(event("tool_call", id="c2", name="survey", arguments='{"topic": "walrus"}'))
    view.apply(RESULT)
    same, edited = (draw(render(block), width=40) for block in view.blocks)

    assert [block.approved for block in view.blocks if isinstance(block, ToolBlock)] == [
        True,
        False,
    ]
    assert same.splitlines() == [
        "╭─ survey · approved ──────────────────╮",
        "│ 3 counted                            │",
        "╰──────────────────────────────────────╯",
    ]
    assert '{"topic": "walrus"}' in edited, "arguments other than those approved are shown"


def test_a_confirmation_already_on_screen_is_not_drawn_again() -> None:
    # A decision that leaves another call of its step waiting answers with that one.
    view = TurnView(drawn={"conf_1"})
    view.apply(PROPOSAL)
    view.apply(event("done", status="awaiting_confirmation"))

    assert view.live() == []
    assert view.settle() == []
    assert [c.confirmation_id for c in view.confirmations] == ["conf_1"], "still asked about"


def test_long_tool_output_is_cut_saying_how_much() -> None:
    tool = ToolBlock(id="c1", name="dump", output="\n".join(f"line {n}" for n in range(40)))
    drawn = draw(render(tool))
    assert "line 11" in drawn and "line 12" not in drawn
    assert "(28 more lines)" in drawn


def test_markdown_is_rendered_not_shown_raw() -> None:
    drawn = draw(render(TextPiece("Otters are **fine**.\n\n- one\n- two")))
    assert "Otters are fine." in drawn and "**" not in drawn
    assert "• one" in drawn
