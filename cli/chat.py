"""`bernard chat`: an interactive conversation on the conversations API.

Each message is posted to `POST /v1/conversations/{id}/messages` with
`Accept: text/event-stream` and drawn as it streams (cli/live.py). A tool call that waits
for a decision is asked about (y / n / e to edit its arguments) and the decision sent to
`POST /v1/conversations/{id}/resume`, which streams the rest of the turn. Ctrl-C during a
turn asks whether to cancel it (`POST /v1/turns/{id}/cancel`) or leave it running, then
leaves; Ctrl-C or Ctrl-D at the prompt leaves.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from cli.client import Api, ApiError, TurnStream
from cli.frames import TurnEvent
from cli.live import print_ending, watch
from cli.view import ConfirmationBlock, TurnView, render

PROMPT = "[bold cyan]you>[/] "
DECISION_PROMPT = "Approve? (y)es / (n)o / (e)dit arguments: "
EXIT_WORDS = frozenset({"/exit", "/quit"})

Choice = Literal["approve", "reject", "edit"]


class Leave(Exception):
    """The user is done: Ctrl-C or Ctrl-D (at a prompt, or after Ctrl-C in a turn)."""


def parse_choice(answer: str) -> Choice | None:
    """What an answer to `DECISION_PROMPT` chooses, or None to ask again."""
    word = answer.strip().lower()
    if word in ("y", "yes"):
        return "approve"
    if word in ("n", "no"):
        return "reject"
    if word in ("e", "edit"):
        return "edit"
    return None


def parse_arguments(text: str) -> dict[str, Any]:
    """Edited arguments: a JSON object, else ValueError saying what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, dict):
        raise ValueError('the arguments must be a JSON object, like {"text": "..."}')
    return value


class Chat:
    """One terminal's conversation."""

    def __init__(self, api: Api, console: Console, conversation_id: str) -> None:
        self.api = api
        self.console = console
        self.conversation_id = conversation_id

    def ask(self, prompt: str) -> str:
        try:
            return self.console.input(prompt)
        except (EOFError, KeyboardInterrupt):
            self.console.print()
            raise Leave from None

    def run(self, pending: dict[str, Any] | None = None) -> None:
        """Prompt, answer, repeat, until the user leaves (`Leave`)."""
        if pending is not None:
            # The conversation's pending proposal has the shape of the event that made it.
            view = TurnView(status="awaiting_confirmation")
            view.apply(TurnEvent("awaiting_confirmation", pending))
            for piece in view.settle():
                self.console.print(render(piece))
            self.decide(view)
        while True:
            line = self.ask(PROMPT)
            if not line.strip():
                continue
            if line.strip() in EXIT_WORDS:
                raise Leave
            try:
                view = self.turn(
                    "POST",
                    f"/v1/conversations/{self.conversation_id}/messages",
                    {"content": line},
                )
            except ApiError as exc:
                self.console.print(f"[red]error:[/] {escape(str(exc))}")
                continue
            self.decide(view)

    def decide(self, view: TurnView) -> None:
        """While the turn waits for a decision: ask, send it, show what follows."""
        decided: set[str] = set()
        while view.status == "awaiting_confirmation":
            waiting = [c for c in view.confirmations if c.confirmation_id not in decided]
            if not waiting:
                return
            proposal = waiting[0]
            try:
                body = self.ask_decision(proposal)
            except Leave:
                self.console.print(
                    "The tool call still waits; decide later with: "
                    f"bernard chat --conversation {self.conversation_id}",
                    highlight=False,
                    markup=False,
                )
                raise
            try:
                view = self.turn("POST", f"/v1/conversations/{self.conversation_id}/resume", body)
            except ApiError as exc:
                self.console.print(f"[red]error:[/] {escape(str(exc))}")
                if exc.status == 400:
                    continue  # edited arguments the tool refuses: ask again
                return
            decided.add(proposal.confirmation_id)

    def ask_decision(self, proposal: ConfirmationBlock) -> dict[str, Any]:
        while True:
            choice = parse_choice(self.ask(DECISION_PROMPT))
            if choice is None:
                continue
            body: dict[str, Any] = {"confirmation_id": proposal.confirmation_id}
            if choice != "edit":
                return {**body, "decision": choice}
            self.console.print(f"Arguments now: {escape(proposal.arguments)}", highlight=False)
            try:
                arguments = parse_arguments(self.ask("New arguments (a JSON object): "))
            except ValueError as exc:
                self.console.print(f"[red]{escape(str(exc))}[/]")
                continue
            return {**body, "decision": "approve", "arguments": arguments}

    def turn(self, method: str, path: str, body: dict[str, Any]) -> TurnView:
        """Run one request's turn on screen; on Ctrl-C, ask what to do with it and leave."""
        stream = TurnStream(self.api)
        view = TurnView()
        if watch(self.console, stream, stream.start(method, path, body), view):
            print_ending(self.console, view)
            self.console.print()
            return view
        self.interrupted(view)
        raise Leave

    def interrupted(self, view: TurnView) -> None:
        turn_id = view.turn_id
        if turn_id is None or view.done:
            return
        try:
            answer = self.console.input(
                f"\nCancel turn {turn_id}? [bold]y[/] cancels it, anything else leaves it running: "
            )
        except (EOFError, KeyboardInterrupt):
            answer = ""
        if answer.strip().lower() in ("y", "yes"):
            try:
                turn = self.api.post(f"/v1/turns/{turn_id}/cancel")
            except ApiError as exc:
                self.console.print(f"[red]error:[/] {escape(str(exc))}")
                return
            self.console.print(f"Turn {turn_id} is {turn['status']}.")
        else:
            self.console.print(
                f"Turn {turn_id} goes on; follow it with: bernard turns tail {turn_id}"
            )


def open_conversation(api: Api, conversation_id: str | None) -> dict[str, Any]:
    """The conversation to chat in: the one named (created when the caller has none by
    that id), else a new one."""
    if conversation_id is None:
        return dict(api.post("/v1/conversations"))
    try:
        return dict(api.get(f"/v1/conversations/{conversation_id}"))
    except ApiError as exc:
        if exc.status != 404:
            raise
    return dict(api.post("/v1/conversations", {"id": conversation_id}))


def chat(api: Api, console: Console, conversation_id: str | None) -> int:
    """`bernard chat`: the exit code."""
    try:
        conversation = open_conversation(api, conversation_id)
    except ApiError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    session = Chat(api, console, conversation["id"])
    console.print(
        f"[bold]Bernard[/] · conversation [bold]{escape(conversation['id'])}[/] · "
        "Ctrl-D or /exit leaves, Ctrl-C stops a turn",
        highlight=False,
    )
    pending = conversation.get("pending_confirmation")
    with contextlib.suppress(Leave):
        session.run(pending if conversation.get("status") == "awaiting_confirmation" else None)
    return 0
