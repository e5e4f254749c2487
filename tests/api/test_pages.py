"""The list object every paged route answers (api/pages.py): OpenAI's shape."""

from __future__ import annotations

from typing import Any

import pytest

from api.pages import list_page


@pytest.mark.parametrize(
    ("data", "more", "expected"),
    [
        ([], False, {"first_id": None, "last_id": None, "has_more": False}),
        ([{"id": "a"}], True, {"first_id": "a", "last_id": "a", "has_more": True}),
        (
            [{"id": "a"}, {"id": "b", "x": 1}, {"id": "c"}],
            False,
            {"first_id": "a", "last_id": "c", "has_more": False},
        ),
    ],
)
def test_a_page_names_its_first_and_last_ids_and_whether_more_follow(
    data: list[dict[str, Any]], more: bool, expected: dict[str, Any]
) -> None:
    assert list_page(data, more) == {"object": "list", "data": data, **expected}
