"""What the terminal shows of one turn: the answer as Markdown, tool calls as panels with
their progress, confirmations, errors.

`TurnView.apply` folds the turn's events (cli/frames.py) into blocks. What can no longer
change is `settle`d: printed once, for good, into the scrollback; only the rest (the
paragraph being written, a tool still running) lives in the redrawn region at the bottom
(rich.live). So a long answer never has to be redrawn whole, and what was printed is never
printed again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.markdown import Markdown
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from cli.frames import TurnEvent
from shared.errors import ErrorCode

# What a panel shows of a tool's arguments and output, and how many of its steps.
ARGUMENTS_CHARS = 300
OUTPUT_LINES = 12
OUTPUT_CHARS = 1200
STEPS_SHOWN = 4

# A turn somebody stopped (shared/endings.py) is shown as "stopped", not as an error.
CANCELLED_CODE = ErrorCode.TURN_CANCELLED
INTERRUPTED_CODE = ErrorCode.TURN_INTERRUPTED

_FENCE = re.compile(r" {0,3}(```|~~~)")


@dataclass(slots=True)
class TextBlock:
    """Answer text; `shown` characters of it are printed for good."""

    text: str = ""
    shown: int = 0


@dataclass(slots=True)
class ToolBlock:
    """A tool call, its progress and, once it ran, its output."""

    id: str
    name: str
    arguments: str = ""
    # Approved by the user, who saw these very arguments on its confirmation: its panel
    # does not repeat them.
    approved: bool = False
    steps: list[str] = field(default_factory=list)
    current: float | None = None
    total: float | None = None
    progress: str = ""
    output: str | None = None
    is_error: bool = False


@dataclass(slots=True)
class ConfirmationBlock:
    """A tool call that waits for the user's decision."""

    confirmation_id: str
    name: str
    arguments: str
    summary: str
    call_id: str = ""


@dataclass(slots=True)
class ErrorBlock:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class TextPiece:
    """Settled answer text; `gap` when it continues a paragraph run printed before it."""

    text: str
    gap: bool = False


Block = TextBlock | ToolBlock | ConfirmationBlock | ErrorBlock
Piece = TextPiece | ToolBlock | ConfirmationBlock | ErrorBlock


def settled_end(text: str) -> int:
    """How much of streaming Markdown `text` is whole paragraphs: up to its last blank line
    outside a fenced code block (a fence still open settles nothing after it)."""
    end = 0
    fenced = False
    position = 0
    for line in text.splitlines(keepends=True):
        position += len(line)
        if not line.endswith("\n"):
            break  # the line is still being written
        if _FENCE.match(line):
            fenced = not fenced
            if not fenced:
                end = position  # a closed fence ends its block
        elif not fenced and not line.strip():
            end = position
    return end


@dataclass(slots=True)
class TurnView:
    """One turn as the terminal shows it."""

    turn_id: str | None = None
    blocks: list[Block] = field(default_factory=list)
    settled: int = 0
    status: str | None = None
    error: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    # A line about the connection ("reconnecting…"), shown under the live blocks.
    notice: str | None = None
    # The tool calls the user approved before this turn (a resume), by call id: the
    # arguments they approved, as drawn on the confirmation.
    approved: dict[str, str] = field(default_factory=dict)
    # The confirmations already on screen (by confirmation id): a decision that leaves
    # another of its step waiting answers with that one again, which is not drawn twice.
    drawn: set[str] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return self.status is not None

    @property
    def confirmations(self) -> list[ConfirmationBlock]:
        return [block for block in self.blocks if isinstance(block, ConfirmationBlock)]

    def text(self) -> str:
        """The whole answer so far."""
        return "".join(block.text for block in self.blocks if isinstance(block, TextBlock))

    def apply(self, event: TurnEvent) -> None:
        data = event.data
        match event.kind:
            case "text_delta":
                last = self.blocks[-1] if self.blocks else None
                if isinstance(last, TextBlock):
                    last.text += str(data.get("text", ""))
                else:
                    self.blocks.append(TextBlock(str(data.get("text", ""))))
            case "tool_call":
                call_id, arguments = str(data.get("id")), str(data.get("arguments") or "")
                seen = self.approved.get(call_id)
                self.blocks.append(
                    ToolBlock(
                        id=call_id,
                        name=str(data.get("name")),
                        arguments=arguments,
                        approved=seen is not None and _compact(seen) == _compact(arguments),
                    )
                )
            case "tool_progress":
                tool = self._tool(data.get("tool_call_id"), data.get("tool"))
                message = str(data.get("message") or "")
                if data.get("phase") == "progress":
                    tool.current, tool.total = data.get("current"), data.get("total")
                    tool.progress = message
                elif message:
                    tool.steps.append(message)
            case "tool_result":
                tool = self._tool(data.get("tool_call_id"), data.get("name"))
                tool.output = str(data.get("output") or "")
                tool.is_error = bool(data.get("is_error"))
            case "awaiting_confirmation":
                call = data.get("tool_call") or {}
                self.blocks.append(
                    ConfirmationBlock(
                        confirmation_id=str(data.get("confirmation_id")),
                        name=str(call.get("name")),
                        arguments=str(call.get("arguments") or ""),
                        summary=str(data.get("summary") or ""),
                        call_id=str(call.get("id") or ""),
                    )
                )
            case "error":
                self.blocks.append(
                    ErrorBlock(str(data.get("code") or "error"), str(data.get("message") or ""))
                )
            case "done":
                self.status = str(data.get("status") or "completed")
                self.error = data.get("error")
                self.usage = data.get("usage")
                self.turn_id = data.get("turn_id") or self.turn_id

    def _tool(self, call_id: Any, name: Any) -> ToolBlock:
        for block in reversed(self.blocks):
            if isinstance(block, ToolBlock) and block.id == call_id:
                return block
        tool = ToolBlock(id=str(call_id), name=str(name or "tool"))
        self.blocks.append(tool)
        return tool

    def settle(self) -> list[Piece]:
        """What can no longer change and was not printed yet, in order; once only."""
        out: list[Piece] = []
        while self.settled < len(self.blocks):
            block = self.blocks[self.settled]
            open_end = self.settled == len(self.blocks) - 1 and not self.done
            if isinstance(block, TextBlock):
                end = settled_end(block.text) if open_end else len(block.text)
                if end > block.shown:
                    fragment = block.text[block.shown : end]
                    if fragment.strip():
                        out.append(TextPiece(fragment, gap=block.shown > 0))
                    block.shown = end
                if open_end:
                    break
            elif isinstance(block, ToolBlock) and block.output is None and not self.done:
                break
            elif not self._drawn_before(block):
                out.append(block)
            self.settled += 1
        return out

    def _drawn_before(self, block: Block) -> bool:
        return isinstance(block, ConfirmationBlock) and block.confirmation_id in self.drawn

    def live(self) -> list[Piece]:
        """What is still changing: shown in the redrawn region."""
        out: list[Piece] = []
        for block in self.blocks[self.settled :]:
            if isinstance(block, TextBlock):
                if block.text[block.shown :].strip():
                    out.append(TextPiece(block.text[block.shown :], gap=block.shown > 0))
            elif not self._drawn_before(block):
                out.append(block)
        return out


def render(piece: Piece, *, live: bool = False) -> RenderableType:
    """One piece as rich draws it; `live` adds a spinner to a tool still running."""
    if isinstance(piece, TextPiece):
        markdown = Markdown(piece.text)
        return Group(Text(""), markdown) if piece.gap else markdown
    if isinstance(piece, ToolBlock):
        return _tool_panel(piece, live)
    if isinstance(piece, ConfirmationBlock):
        body = Group(
            Text(piece.summary, style="bold"),
            Text(f"{piece.name} {_short(piece.arguments, ARGUMENTS_CHARS)}", style="dim"),
        )
        return Panel(body, title="waits for your decision", border_style="magenta")
    return error_line(piece.code, piece.message)


def error_line(code: str, message: str) -> Text:
    """An error as the terminal says it; the user's own cancel is no error: "stopped", nor
    a newer message that took the turn's place."""
    if code == CANCELLED_CODE:
        return Text("stopped", style="yellow")
    if code == INTERRUPTED_CODE:
        return Text("interrupted: a newer message in this conversation runs next", style="yellow")
    return Text(f"error ({code}){': ' if message else ''}{message}", style="red")


def render_live(view: TurnView) -> RenderableType:
    """The redrawn region: the live pieces, then the notice."""
    parts = [render(piece, live=True) for piece in view.live()]
    if view.notice:
        parts.append(Text(view.notice, style="yellow"))
    return Group(*parts)


def _tool_panel(tool: ToolBlock, live: bool) -> Panel:
    rows: list[RenderableType] = []
    if tool.arguments and not tool.approved:
        rows.append(Text(_short(_compact(tool.arguments), ARGUMENTS_CHARS), style="dim"))
    for step in tool.steps[-STEPS_SHOWN:]:
        rows.append(Text(f"› {step}", style="cyan"))
    if tool.total:
        bar = Table.grid(padding=(0, 1))
        done = float(tool.current or 0)
        bar.add_row(
            ProgressBar(total=float(tool.total), completed=done, width=30),
            Text(tool.progress or f"{done:g}/{float(tool.total):g}"),
        )
        rows.append(bar)
    if tool.output is not None:
        rows.append(Text(_output(tool.output), style="red" if tool.is_error else ""))
    elif live:
        rows.append(Spinner("dots", text=Text("running", style="dim")))
    style = "yellow" if tool.output is None else "red" if tool.is_error else "green"
    title = Text.assemble((tool.name, "bold"), (" · approved" if tool.approved else "", "dim"))
    return Panel(Group(*rows), title=title, title_align="left", border_style=style)


def ending_line(view: TurnView) -> Text | None:
    """What to say of a turn that did not complete: None when it did, when it waits, or
    when its stream already told (its error frame, drawn as it came: each error once)."""
    if view.status in (None, "completed", "awaiting_confirmation"):
        return None
    error = view.error or {}
    code = str(error.get("code") or "")
    if any(isinstance(block, ErrorBlock) and block.code == code for block in view.blocks):
        return None
    if code in (CANCELLED_CODE, INTERRUPTED_CODE):
        return error_line(code, "")
    message = error.get("message") or ""
    return Text(
        f"turn {view.status}{f' ({code})' if code else ''}{': ' if message else ''}{message}",
        style="red",
    )


def _compact(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        return arguments


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _output(output: str) -> str:
    lines = output.splitlines()
    kept = "\n".join(lines[:OUTPUT_LINES])
    cut = _short(kept, OUTPUT_CHARS)
    hidden = len(lines) - OUTPUT_LINES
    if hidden > 0:
        cut += f"\n… ({hidden} more lines)"
    return cut
