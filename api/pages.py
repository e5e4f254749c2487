"""A page of a collection as the API answers it: OpenAI's list object (`GET
/v1/conversations`, `GET /v1/conversations/{id}/messages`, `GET /v1/turns`)."""

from __future__ import annotations

from typing import Any


def list_page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's list object of `data` (each item with an `id`); `more` when a next page
    exists (asked for with `after=last_id`)."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }
