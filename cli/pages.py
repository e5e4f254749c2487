"""`bernard turns list` and `bernard conversations list`: one page of the caller's turns or
conversations (`GET /v1/turns`, `GET /v1/conversations`) as a table, and how to get the next."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from cli.client import Api


def print_page(
    api: Api,
    console: Console,
    what: str,
    table: Callable[[list[dict[str, Any]]], Table],
    limit: int,
    after: str | None,
) -> dict[str, Any]:
    """Print the page of `what` (`turns`, `conversations`) after `after` as `table` lays it
    out, and return it."""
    page = dict(api.get(f"/v1/{what}", limit=limit, after=after))
    if not page["data"]:
        console.print(f"No {what}.")
    else:
        console.print(table(page["data"]))
        if page.get("has_more"):
            console.print(f"More: bernard {what} list --after {page['last_id']}", style="dim")
    return page
