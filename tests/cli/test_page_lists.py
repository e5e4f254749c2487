"""`bernard turns list` and `bernard conversations list` (cli/pages.py `print_page`) against a
scripted transport: the page asked for, the table, and how to get the next page."""

from __future__ import annotations

from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from cli.client import Api
from cli.pages import print_page


def api_answering(page: dict[str, Any], asked: list[httpx.URL]) -> Api:
    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request.url)
        return httpx.Response(200, json=page)

    api = Api("http://bernard.test", "key")
    api.http = httpx.Client(base_url=api.base_url, transport=httpx.MockTransport(handle))
    return api


def ids_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False)
    for row in rows:
        table.add_row(row["id"])
    return table


def test_an_empty_page_says_there_is_nothing() -> None:
    asked: list[httpx.URL] = []
    api = api_answering({"object": "list", "data": [], "has_more": False}, asked)
    console = Console(record=True, width=80)

    print_page(api, console, "turns", ids_table, 20, None)

    assert [(url.path, dict(url.params)) for url in asked] == [("/v1/turns", {"limit": "20"})]
    assert console.export_text() == "No turns.\n"


def test_a_page_with_more_after_it_says_how_to_list_the_next() -> None:
    asked: list[httpx.URL] = []
    page = {
        "object": "list",
        "data": [{"id": "conv_1"}, {"id": "conv_2"}],
        "has_more": True,
        "last_id": "conv_2",
    }
    api = api_answering(page, asked)
    console = Console(record=True, width=80)

    listed = print_page(api, console, "conversations", ids_table, 2, "conv_0")

    assert listed == page
    assert [(url.path, dict(url.params)) for url in asked] == [
        ("/v1/conversations", {"limit": "2", "after": "conv_0"})
    ]
    assert console.export_text() == (
        "conv_1\nconv_2\nMore: bernard conversations list --after conv_2\n"
    )


def test_the_last_page_says_nothing_of_a_next() -> None:
    page = {"object": "list", "data": [{"id": "t_9"}], "has_more": False, "last_id": "t_9"}
    console = Console(record=True, width=80)

    print_page(api_answering(page, []), console, "turns", ids_table, 20, None)

    assert console.export_text() == "t_9\n"
