"""A tool's free-text argument as the model sent it (a search query, a place, a topic): its
white space folded, refused when empty or longer than the tool takes."""

from __future__ import annotations

from langchain_core.tools import ToolException


def folded_text(text: str, what: str, max_chars: int) -> str:
    """`text` with each run of white space one space and none at its ends; a tool error
    naming it as `what` ("the search query") when nothing is left or more than `max_chars`
    characters."""
    folded = " ".join(text.split())
    if not folded:
        raise ToolException(f"Error: {what} is empty")
    if len(folded) > max_chars:
        raise ToolException(f"Error: {what} is longer than {max_chars} characters")
    return folded
