"""`bernard chat`: an interactive conversation on the conversations API.

Each message is posted to `POST /v1/conversations/{id}/messages` with
`Accept: text/event-stream` and drawn as it streams (cli/live.py). A tool call that waits
for a decision is asked about (y / n / e to edit its arguments) and the decision sent to
`POST /v1/conversations/{id}/resume`, which streams the rest of the turn. The keyboard is
cli/prompt.py's: line editing, history, multi-line input, `/commands`.

Ctrl-C during a turn stops it at once (`POST /v1/turns/{id}/cancel`) and draws the turn to
its end, which follows: what it said before it stopped, then `stopped` (or all of it, when
it had ended already); a second Ctrl-C stops drawing at once. Ctrl-C at the prompt clears
the line; Ctrl-D (or `/exit`) leaves.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cli.client import Api, ApiCallError, TurnStream
from cli.frames import TurnEvent
from cli.live import print_ending, watch
from cli.prompt import LineEditor
from cli.view import ConfirmationBlock, TurnView, render

DECISION_PROMPT = "Approve? (y)es / (n)o / (e)dit arguments: "
COMMANDS = {
    "/help": "the keys and commands",
    "/new": "start a new conversation",
    "/exit": "leave (Ctrl-D too)",
    "/quit": "leave",
}
EXIT_WORDS = frozenset({"/exit", "/quit"})
KEYS = [
    ("Enter", "send"),
    ("Alt-Enter, Esc Enter, Ctrl-J", "a new line (a paste keeps its lines)"),
    ("Up, Down", "earlier messages, from past sessions too"),
    ("Ctrl-R", "search them"),
    ("Tab", "complete a /command"),
    ("Ctrl-C", "clear the line; during an answer, stop it (twice: stop drawing it too)"),
    ("Ctrl-D", "leave"),
]

Choice = Literal["approve", "reject", "edit"]


class Leave(Exception):
    """The user is done: Ctrl-D or /exit (at a prompt or a question)."""


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
        raise ValueError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(value, dict):
        raise ValueError('the arguments must be a JSON object, like {"text": "..."}')
    return value


def editable(arguments: str) -> str:
    """A tool call's arguments laid out for editing (as they came when not JSON)."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False) + "\n"
    except ValueError:
        return arguments


def help_table() -> Table:
    table = Table.grid(padding=(0, 2))
    for key, meaning in [*KEYS, *COMMANDS.items()]:
        table.add_row(Text(key, style="bold"), meaning)
    return table


class Chat:
    """One terminal's conversation."""

    def __init__(
        self, api: Api, console: Console, conversation_id: str, keyboard: LineEditor
    ) -> None:
        self.api = api
        self.console = console
        self.conversation_id = conversation_id
        self.keyboard = keyboard
        # The arguments last edited, kept across a refused edit so the next one starts there.
        self._draft: dict[str, str] = {}

    def error(self, exc: ApiCallError) -> None:
        self.console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)

    def ask(self, question: str) -> str:
        """An answer; Ctrl-D raises `Leave`, Ctrl-C asks again."""
        while True:
            try:
                return self.keyboard.ask(question)
            except EOFError:
                raise Leave from None
            except KeyboardInterrupt:
                continue

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
            try:
                line = self.keyboard.message()
            except KeyboardInterrupt:
                continue  # the line is dropped, as a shell does
            except EOFError:
                raise Leave from None
            try:
                self.handle(line)
            except KeyboardInterrupt:  # outside a turn's drawing: a request waiting
                self.console.print("interrupted", style="yellow")

    def handle(self, line: str) -> None:
        """One line typed at the prompt: a command, or a message and its turn."""
        command = line.strip()
        if not command:
            return
        if command in EXIT_WORDS:
            raise Leave
        if command == "/help":
            self.console.print(help_table())
        elif command == "/new":
            self.new_conversation()
        else:
            answered = self.turn(
                "POST", f"/v1/conversations/{self.conversation_id}/messages", {"content": line}
            )
            if answered is not None:
                self.decide(answered)

    def new_conversation(self) -> None:
        try:
            conversation = self.api.post("/v1/conversations")
        except ApiCallError as exc:
            self.error(exc)
            return
        self.conversation_id = str(conversation["id"])
        self.console.print(f"New conversation [bold]{escape(self.conversation_id)}[/]")

    def decide(self, view: TurnView) -> None:
        """While the turn waits for a decision: ask, send it, show what follows."""
        decided: set[str] = set()
        approved: dict[str, str] = {}
        drawn: set[str] = set()
        while view.status == "awaiting_confirmation":
            drawn |= {c.confirmation_id for c in view.confirmations}
            waiting = [c for c in view.confirmations if c.confirmation_id not in decided]
            if not waiting:
                return
            proposal = waiting[0]
            if len(waiting) > 1 or decided:
                # Several cards are on screen: say which one the question is about.
                self.console.print(Text(f"About: {proposal.summary}", style="magenta"))
            try:
                body = self.ask_decision(proposal)
            except Leave:
                self.console.print(
                    "The tool call still waits; decide later with: "
                    f"bernard chat --conversation {self.conversation_id}",
                    highlight=False,
                    markup=False,
                    soft_wrap=True,
                )
                raise
            if body["decision"] == "approve" and proposal.call_id:
                # Drawn on its confirmation (or as edited, just above): its panel in the
                # turn that runs it need not repeat them.
                edited = body.get("arguments")
                approved[proposal.call_id] = (
                    proposal.arguments if edited is None else json.dumps(edited)
                )
            try:
                resumed = self.turn(
                    "POST",
                    f"/v1/conversations/{self.conversation_id}/resume",
                    body,
                    refuse=True,
                    approved=approved,
                    drawn=drawn,
                )
            except ApiCallError as exc:
                self.error(exc)
                if exc.status == 400:
                    continue  # edited arguments the tool refuses: ask again
                return
            decided.add(proposal.confirmation_id)
            if resumed is None:
                return
            view = resumed

    def ask_decision(self, proposal: ConfirmationBlock) -> dict[str, Any]:
        body: dict[str, Any] = {"confirmation_id": proposal.confirmation_id}
        while True:
            choice = parse_choice(self.ask(DECISION_PROMPT))
            if choice is None:
                continue
            if choice != "edit":
                return {**body, "decision": choice}
            arguments = self.edit_arguments(proposal)
            if arguments is not None:
                return {**body, "decision": "approve", "arguments": arguments}

    def edit_arguments(self, proposal: ConfirmationBlock) -> dict[str, Any] | None:
        """The arguments as the user edited them, or None (said why) to ask again."""
        draft = self._draft.get(proposal.confirmation_id) or editable(proposal.arguments)
        self.console.print("Edit the arguments (a JSON object)…", style="dim")
        edited = self.keyboard.edit(draft)
        if edited is None:
            self.console.print("Not edited; the arguments stay as they were.", style="yellow")
            return None
        self._draft[proposal.confirmation_id] = edited
        try:
            arguments = parse_arguments(edited)
        except ValueError as exc:
            self.console.print(f"[red]{escape(str(exc))}[/] (e edits them again)")
            return None
        self.console.print(
            Text(f"{proposal.name} {json.dumps(arguments, ensure_ascii=False)}", style="dim")
        )
        return arguments

    def turn(
        self,
        method: str,
        path: str,
        body: dict[str, Any],
        *,
        refuse: bool = False,
        approved: dict[str, str] | None = None,
        drawn: set[str] | None = None,
    ) -> TurnView | None:
        """Run one request's turn on screen: its view once it ended, or None when the user
        stopped following it (Ctrl-C) or the request failed (said). With `refuse`, an
        error answer is raised instead, for the caller to judge. `approved`: the calls the
        user approved on screen (`TurnView.approved`); `drawn`: the confirmations on screen
        (`TurnView.drawn`)."""
        stream = TurnStream(self.api)
        view = TurnView(approved=dict(approved or {}), drawn=set(drawn or ()))
        stop_failed: list[ApiCallError] = []
        try:
            finished = watch(
                self.console,
                stream,
                stream.start(method, path, body),
                view,
                stop=lambda turn_id: self.stop(turn_id, stop_failed),
            )
        except ApiCallError as exc:
            if refuse and view.turn_id is None:
                raise
            self.error(exc)
            return None
        for refused in stop_failed:
            self.error(refused)
        if finished:
            print_ending(self.console, view)
            self.console.print()
            return view
        self.left(view)
        return None

    def stop(self, turn_id: str, failed: list[ApiCallError]) -> None:
        """Ask for the turn to stop (on the drawing's stop thread); a refusal is said once
        the drawing is done."""
        try:
            self.api.post(f"/v1/turns/{turn_id}/cancel")
        except ApiCallError as exc:
            failed.append(exc)

    def left(self, view: TurnView) -> None:
        """After a second Ctrl-C, or one before the turn began: back to the prompt."""
        turn_id = view.turn_id
        if turn_id is None:
            self.console.print("stopped before the turn began", style="yellow")
            return
        self.console.print(
            f"Stopped drawing it; see how it ended with: bernard turns tail {turn_id}",
            highlight=False,
            markup=False,
            soft_wrap=True,  # the command stays one line, to copy
        )


def chat_conversation(api: Api, conversation_id: str | None) -> dict[str, Any]:
    """The conversation to chat in: the one named (created when the caller has none by
    that id), else a new one."""
    if conversation_id is None:
        return dict(api.post("/v1/conversations"))
    try:
        return dict(api.get(f"/v1/conversations/{conversation_id}"))
    except ApiCallError as exc:
        if exc.status != 404:
            raise
    return dict(api.post("/v1/conversations", {"id": conversation_id}))


def chat(api: Api, console: Console, conversation_id: str | None, keyboard: LineEditor) -> int:
    """`bernard chat`: the exit code."""
    try:
        conversation = chat_conversation(api, conversation_id)
    except ApiCallError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    except KeyboardInterrupt:
        return 130
    session = Chat(api, console, conversation["id"], keyboard)
    console.print(
        f"[bold]Bernard[/] · conversation [bold]{escape(conversation['id'])}[/] · "
        "Enter sends, Alt-Enter a new line, Ctrl-C stops an answer, Ctrl-D leaves, /help",
        highlight=False,
    )
    pending = conversation.get("pending_confirmation")
    with contextlib.suppress(Leave):
        session.run(pending if conversation.get("status") == "awaiting_confirmation" else None)
    return 0
