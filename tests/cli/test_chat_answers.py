"""What `bernard chat` makes of the answers typed at its questions (cli/chat.py)."""

from __future__ import annotations

from typing import Any

import pytest

from cli.chat import parse_arguments, parse_choice


@pytest.mark.parametrize(
    ("typed", "choice"),
    [
        ("y", "approve"),
        ("Yes", "approve"),
        (" y ", "approve"),
        ("n", "reject"),
        ("no", "reject"),
        ("e", "edit"),
        ("EDIT", "edit"),
        ("", None),
        ("maybe", None),
        ("yn", None),
    ],
)
def test_a_decision_answer_chooses(typed: str, choice: str | None) -> None:
    assert parse_choice(typed) == choice


@pytest.mark.parametrize(
    ("typed", "arguments"),
    [
        ('{"text": "the door code is 4321"}', {"text": "the door code is 4321"}),
        ("{}", {}),
        ('  {"n": 1}  ', {"n": 1}),
    ],
)
def test_edited_arguments_are_a_json_object(typed: str, arguments: dict[str, Any]) -> None:
    assert parse_arguments(typed) == arguments


@pytest.mark.parametrize(
    ("typed", "says"),
    [
        ("{not json", "not JSON"),
        ("", "not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
    ],
)
def test_other_arguments_are_refused_saying_why(typed: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_arguments(typed)
