"""worker/harness/answers.py: what the router's step decided of the calls waiting on the
user's words (the routes' tests run it end to end: tests/test_answers_in_words.py)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from worker.harness.answers import Waiting


def proposal(n: int) -> dict[str, Any]:
    call = {"id": f"call_{n}", "name": "save_note", "arguments": '{"text": "x"}'}
    return {"confirmation_id": f"conf_{n}", "tool_call": call, "summary": f"Remember {n}"}


WAITING = Waiting([proposal(1), proposal(2)], [HumanMessage("only the first")])


def step(*calls: tuple[str, Any]) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[
            {"name": name, "args": args, "id": f"t{i}", "type": "tool_call"}
            for i, (name, args) in enumerate(calls)
        ],
    )


@pytest.mark.parametrize(
    ("calls", "decided"),
    [
        ([], ["reject", "reject"]),  # nothing approved: nothing runs
        ([("approve_pending", {"confirmation_ids": ["conf_1", "conf_2"]})], ["approve", "approve"]),
        ([("approve_pending", {"confirmation_ids": ["conf_2"]})], ["reject", "approve"]),
        ([("approve_pending", {"confirmation_ids": "conf_1"})], ["approve", "reject"]),
        ([("approve_pending", {"confirmation_ids": ["call_2"]})], ["reject", "approve"]),
        ([("approve_pending", {"confirmation_ids": ["conf_9", 7]})], ["reject", "reject"]),
        ([("approve_pending", {})], ["reject", "reject"]),
        (
            [
                ("approve_pending", {"confirmation_ids": ["conf_1", "conf_2"]}),
                ("reject_pending", {"confirmation_ids": ["conf_1"]}),
            ],
            ["reject", "approve"],  # approved and rejected: rejected
        ),
        ([("reject_pending", {"confirmation_ids": ["conf_1"]})], ["reject", "reject"]),
    ],
)
def test_only_what_the_step_approved_and_did_not_reject_is_approved(
    calls: list[tuple[str, Any]], decided: list[str]
) -> None:
    decisions, _ = WAITING.decide(step(*calls))
    assert [(d["confirmation_id"], d["decision"]) for d in decisions] == list(
        zip(["conf_1", "conf_2"], decided, strict=True)
    )


def test_the_steps_other_calls_are_kept_and_the_decisions_dropped() -> None:
    message = step(
        ("reject_pending", {"confirmation_ids": ["conf_1"]}),
        ("save_note", {"text": "9999"}),
    )
    _, rest = WAITING.decide(message)
    assert [(c["name"], c["args"]) for c in rest.tool_calls] == [("save_note", {"text": "9999"})]


def test_the_prompt_answers_each_waiting_call_with_its_id_then_the_words() -> None:
    notes = WAITING.prompt()
    assert [m.type for m in notes] == ["tool", "tool", "human"]
    assert [m.tool_call_id for m in notes[:2]] == ["call_1", "call_2"]  # type: ignore[attr-defined]
    assert "conf_1" in str(notes[0].content) and "Remember 1" in str(notes[0].content)
