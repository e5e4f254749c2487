"""`bernard conversations list|show|rename|delete`: the caller's conversations
(`/v1/conversations`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

from cli.client import Api
from cli.turns import status_text, when

# The most messages one page of `GET /v1/conversations/{id}/messages` holds.
MESSAGES_PAGE = 1000


def conversations_table(conversations: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("conversation", "title", "status", "messages", "last used"):
        table.add_column(column, overflow="fold")
    for conversation in conversations:
        title = conversation.get("title")
        table.add_row(
            conversation["id"],
            Text(title) if title else Text("(untitled)", style="dim"),
            status_text(conversation["status"]),
            str(conversation.get("message_count", "")),
            when(conversation.get("updated_at")),
        )
    return table


def latest_messages(api: Api, conversation: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """The conversation's last `limit` rows, oldest first (row ids are `msg_<position>`)."""
    count = int(conversation.get("message_count") or 0)
    after = f"msg_{count - limit}" if count > limit else None
    path = f"/v1/conversations/{conversation['id']}/messages"
    rows: list[dict[str, Any]] = []
    while True:
        page = api.get(path, limit=min(limit - len(rows), MESSAGES_PAGE), after=after)
        rows += page["data"]
        if not page.get("has_more") or len(rows) >= limit:
            return rows
        after = page["last_id"]


def show_conversation(
    api: Api, console: Console, conversation_id: str, limit: int
) -> dict[str, Any]:
    conversation = dict(api.get(f"/v1/conversations/{conversation_id}"))
    rows = latest_messages(api, conversation, limit) if limit > 0 else []
    head = Table.grid(padding=(0, 2))
    head.add_row("conversation", conversation["id"])
    if conversation.get("title"):
        head.add_row("title", Text(conversation["title"]))
    head.add_row("status", status_text(conversation["status"]))
    head.add_row("messages", str(conversation.get("message_count", 0)))
    head.add_row("last used", when(conversation.get("updated_at")))
    for key, value in (conversation.get("metadata") or {}).items():
        head.add_row(f"metadata.{key}", str(value))
    pending = conversation.get("pending_confirmation")
    if pending:
        head.add_row("waits for", Text(str(pending.get("summary")), style="magenta"))
    console.print(head)
    shown = len(rows)
    if shown < int(conversation.get("message_count") or 0):
        console.print(f"(the last {shown} messages)", style="dim")
    for row in rows:
        console.print()
        print_row(console, row)
    return conversation


def print_row(console: Console, row: dict[str, Any]) -> None:
    role = row.get("role", "")
    content = row.get("content")
    text = content if isinstance(content, str) else ("" if content is None else str(content))
    if role == "user":
        console.print(Text.assemble(("you> ", "bold cyan"), text))
    elif role == "assistant":
        for call in row.get("tool_calls") or []:
            function = call.get("function") or {}
            line = f"→ {function.get('name')} {function.get('arguments', '')}"
            console.print(Text(line, style="yellow"))
        if text:
            console.print(Markdown(text))
    elif role == "tool":
        console.print(Text(f"  {text[:300]}", style="dim"))
    else:
        console.print(Text(f"{role}: {text}", style="dim"))


def rename_conversation(api: Api, console: Console, conversation_id: str, title: str) -> None:
    """Set the conversation's title (`PATCH`): the user's, never replaced by a generated one."""
    conversation = api.patch(f"/v1/conversations/{conversation_id}", {"title": title})
    console.print(
        Text.assemble("Renamed ", (conversation_id, "bold"), ": ", str(conversation["title"]))
    )


def delete_and_report(api: Api, console: Console, conversation_id: str) -> None:
    api.delete(f"/v1/conversations/{conversation_id}")
    console.print(f"Deleted conversation {conversation_id}.", highlight=False)
