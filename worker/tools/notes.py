"""Notes the user asks Bernard to keep: `save_note` and `delete_note` change what is stored,
so they wait for the user's confirmation (worker/tools/confirmation.py); `list_notes` reads.

Notes belong to the turn's owner (shared/notes.py); the tools find the owner and the Redis
client in their config (worker/tools/runtime.py).
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException, tool

from shared.notes import NotesFullError, NoteStore
from worker.tools.progress import get_reporter
from worker.tools.runtime import get_runtime

__all__ = ["delete_note", "list_notes", "save_note"]


def _store(config: RunnableConfig) -> NoteStore:
    runtime = get_runtime(config)
    return NoteStore.of(runtime.redis, runtime.owner, runtime.settings)


def _quoted(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return f"“{text if len(text) <= limit else text[: limit - 1] + '…'}”"


@tool
async def save_note(text: str, config: RunnableConfig) -> str:
    """Remember something for the user, to recall in later conversations.

    `text` is what to remember, in the user's words ("the door code is 1234").
    """
    get_reporter(config).step("Saving the note")
    try:
        note = await _store(config).add(text)
    except (ValueError, NotesFullError) as exc:
        raise ToolException(f"Error: {exc}") from exc
    return f"Saved: {note.text}"


@tool
async def list_notes(config: RunnableConfig) -> str:
    """List everything the user asked to remember."""
    notes = await _store(config).all()
    if not notes:
        return "There are no notes."
    return "\n".join(f"- {note.text}" for note in notes)


@tool
async def delete_note(match: str, config: RunnableConfig) -> str:
    """Forget the user's notes that mention `match` (any case)."""
    gone = await _store(config).forget(match)
    if not gone:
        return f"No note mentions {_quoted(match)}."
    return f"Forgot {len(gone)} note(s): " + "; ".join(note.text for note in gone)


def _summarize_save(args: dict[str, Any]) -> str:
    return f"Remember {_quoted(str(args.get('text', '')))}"


def _summarize_delete(args: dict[str, Any]) -> str:
    return f"Forget the notes that mention {_quoted(str(args.get('match', '')))}"


def _configure(write: BaseTool, summarize: Any) -> None:
    write.handle_tool_error = True  # the model reads the error and can try again
    write.metadata = {"requires_confirmation": True, "confirmation_summary": summarize}


_configure(save_note, _summarize_save)
_configure(delete_note, _summarize_delete)
list_notes.handle_tool_error = True
