"""Conversation titles: what a title may be, and the prompt that asks the router model for one.

A conversation gets a short title in the background after its first exchange
(worker/titles.py, a background job like a summary: shared/queue.py), or from its user
(`PATCH /v1/conversations/{id}`, api/conversations.py). Both are stored in the
conversation's metadata hash (shared/records/keeper.py: `title`, `title_source`); a user's title is
never replaced by a generated one. Pure functions here, shared by the API (which checks what
a user sends) and the worker (which tidies what the model answers).
"""

from __future__ import annotations

import unicodedata
from enum import StrEnum

__all__ = [
    "TITLE_MAX_CHARS",
    "TITLE_PROMPT",
    "TitleSource",
    "clean_title",
    "title_problem",
]

# Long enough for a sentence's worth, short enough for a sidebar row or a table column.
TITLE_MAX_CHARS = 80
# What the model is asked for is shorter than what a user may set.
_GENERATED_MAX_WORDS = 8

TITLE_PROMPT = (
    "You name conversations between a user and an assistant. Read the first exchange and "
    "answer with a short title for the conversation: at most six words, in the user's "
    "language, no quotes, no final punctuation. Answer with the title alone."
)

_QUOTES = "\"'`“”‘’«»"


class TitleSource(StrEnum):
    """Who set a conversation's title: the background job, or the user (never replaced)."""

    GENERATED = "generated"
    USER = "user"


def _is_control(character: str) -> bool:
    # Cc: C0 and C1 controls (newlines, tabs, escapes); Cf: format characters such as
    # bidirectional overrides, which reorder what a terminal or a page shows.
    return unicodedata.category(character) in ("Cc", "Cf")


def title_problem(title: str) -> str | None:
    """What is wrong with `title` as a user sends it (None: nothing). A title is one line of
    1 to `TITLE_MAX_CHARS` characters, not blank, without control characters."""
    if not title.strip():
        return "a title may not be empty"
    if len(title) > TITLE_MAX_CHARS:
        return f"a title may hold at most {TITLE_MAX_CHARS} characters"
    if any(_is_control(character) for character in title):
        return "a title may not hold control characters (newlines, tabs, escapes)"
    return None


def clean_title(answer: str) -> str | None:
    """The title in a model's `answer`: its first line, without a "Title:" label, quotes,
    Markdown emphasis, control characters or final punctuation, at most eight words and
    `TITLE_MAX_CHARS` characters; None when nothing is left."""
    line = next((line for line in answer.strip().splitlines() if line.strip()), "")
    line = "".join(" " if _is_control(character) else character for character in line)
    line = line.strip().lstrip("#").strip()
    if line.lower().startswith("title:"):
        line = line[len("title:") :]
    line = line.strip().strip("*_").strip().strip(_QUOTES).strip()
    line = line.rstrip(".!,;:").strip()
    words = line.split()[:_GENERATED_MAX_WORDS]
    title = " ".join(words)
    if len(title) > TITLE_MAX_CHARS:
        title = title[: TITLE_MAX_CHARS - 1].rstrip() + "…"
    return title or None
