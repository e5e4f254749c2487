"""`bernard turns list|show|tail|cancel`: the caller's turns (`GET /v1/turns`), one turn,
its events as they happen, and stopping it."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

from cli.client import Api, TurnStream
from cli.live import print_ending, watch
from cli.view import CANCELLED_CODE, TurnView

_STATUS_STYLES = {
    "completed": "green",
    "running": "yellow",
    "queued": "yellow",
    "awaiting_confirmation": "magenta",
    "decided": "green",
    "expired": "dim",
    "failed": "red",
    "cancelled": "yellow",
}


def when(epoch: float | None) -> str:
    """An API timestamp in local time ("" for none)."""
    if not epoch:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def status_text(status: str) -> Text:
    return Text(status, style=_STATUS_STYLES.get(status, ""))


def about(turn: dict[str, Any]) -> Text:
    """What the turn was about: its preview, or what a turn without one did."""
    if turn.get("preview"):
        return Text(str(turn["preview"]))
    return Text("(a decision carried out)" if turn.get("conversation_id") else "", style="dim")


def turns_table(turns: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("turn", "status", "created", "about", "conversation", "error"):
        table.add_column(
            column,
            no_wrap=column in ("turn", "status", "created"),
            overflow="ellipsis" if column == "about" else "fold",
            ratio=2 if column == "about" else None,
        )
    for turn in turns:
        error = turn.get("error") or {}
        code = error.get("code") or ""
        table.add_row(
            turn["id"],
            status_text(turn["status"]),
            when(turn.get("created_at")),
            about(turn),
            turn.get("conversation_id") or "",
            "" if code == CANCELLED_CODE else code,
        )
    return table


def show_turn(api: Api, console: Console, turn_id: str) -> dict[str, Any]:
    turn = dict(api.get(f"/v1/turns/{turn_id}"))
    facts = Table.grid(padding=(0, 2))
    facts.add_row("turn", turn["id"])
    facts.add_row("status", status_text(turn["status"]))
    if turn.get("preview"):
        facts.add_row("about", turn["preview"])
    facts.add_row("conversation", turn.get("conversation_id") or "")
    for name in ("created_at", "started_at", "finished_at"):
        if turn.get(name):
            facts.add_row(name.removesuffix("_at"), when(turn[name]))
    error = turn.get("error")
    if error and error.get("code") != CANCELLED_CODE:
        facts.add_row("error", Text(f"{error.get('code')}: {error.get('message')}", style="red"))
    result = turn.get("result") or {}
    usage = result.get("usage") or {}
    if usage:
        facts.add_row(
            "tokens", f"{usage.get('prompt_tokens', 0)} in, {usage.get('completion_tokens', 0)} out"
        )
    console.print(facts)
    # A chat completion's body keeps them under `bernard`, a conversation turn's at the top.
    ran = result.get("bernard") or result
    outputs = {o.get("id"): o.get("content") for o in ran.get("tool_outputs") or []}
    for call in ran.get("tool_calls") or []:
        output = str(outputs.get(call.get("id"), "(no output)"))
        line = f"tool {call.get('name')} {call.get('arguments', '')} → {output}"
        console.print(Text(line[:300], style="dim"))
    content = _content_of(result)
    if content:
        console.print()
        console.print(Markdown(content))
    return turn


def _content_of(result: dict[str, Any]) -> str:
    """The answer text of a turn object's `result`, whichever encoding shaped it."""
    if "content" in result:
        return str(result.get("content") or "")
    for choice in result.get("choices") or []:
        message = choice.get("message") or {}
        return str(message.get("content") or choice.get("text") or "")
    return ""


def tail_turn(api: Api, console: Console, turn_id: str) -> int:
    """Follow the turn's events from its start to its end (a finished turn is shown whole)."""
    stream = TurnStream(api, turn_id=turn_id)
    view = TurnView(turn_id=turn_id)
    if not watch(console, stream, stream.follow(), view):
        return 0
    # A chat completion's stream ends in `[DONE]`, which does not say how the turn ended.
    turn = api.get(f"/v1/turns/{turn_id}")
    view.status, view.error = turn["status"], turn.get("error")
    print_ending(console, view)
    return 0 if view.status in ("completed", "awaiting_confirmation") else 1


def cancel_turn(api: Api, console: Console, turn_id: str) -> dict[str, Any]:
    turn = dict(api.post(f"/v1/turns/{turn_id}/cancel"))
    console.print(Text.assemble(f"turn {turn_id} ", status_text(turn["status"])))
    return turn
