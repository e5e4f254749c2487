"""A conversation's messages: OpenAI's chat shape (`to_openai_message`), and the rows a
client sees them as (`row_of`, `row_position`: `msg_<position>`, 1-based).

An answer its turn did not finish (cancelled, or interrupted by a newer message) is stored
as it stood, with `stopped`: the code of the turn's ending (`stopped_row`). A row shows it;
the model reads it as a note after the text (worker/harness/memory.py).

shared/records/keeper.py stores them; shared/records/history_diff.py compares them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "STOPPED",
    "Message",
    "MessageLike",
    "row_of",
    "row_position",
    "stopped_row",
    "stored_message",
    "to_openai_message",
]

Message = dict[str, Any]
# A message as a client or the worker hands it over: OpenAI's chat shape, maybe with more
# keys (the worker turns LangChain's messages into it: worker/recording.py).
MessageLike = Mapping[str, Any]

_OPTIONAL_FIELDS = ("name", "tool_call_id", "tool_calls")
# The field of an answer stored unfinished: its turn's ending code.
STOPPED = "stopped"


def to_openai_message(message: MessageLike) -> Message:
    """`message` as a plain OpenAI dict.

    Keeps `role` and `content` (`None` when absent) plus `name`, `tool_call_id` and
    `tool_calls` when set; any other key is dropped. Raises `ValueError` without a role.
    """
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ValueError(f"message without a role: {message!r}")
    out: Message = {"role": role, "content": message.get("content")}
    for name in _OPTIONAL_FIELDS:
        if message.get(name) is not None:
            out[name] = message[name]
    return out


def stored_message(message: MessageLike) -> Message:
    """`message` as the conversation stores it: its OpenAI fields, and `stopped` when set."""
    out = to_openai_message(message)
    if message.get(STOPPED):
        out[STOPPED] = str(message[STOPPED])
    return out


def stopped_row(text: str, code: str) -> Message:
    """The assistant's answer of a turn that ended `code` before finishing it, as it stood."""
    return {"role": "assistant", "content": text, STOPPED: code}


def row_position(row_id: str) -> int:
    """`msg_12` → 12: the 1-based position of a row id; `ValueError` for anything else."""
    prefix, _, number = row_id.partition("_")
    if prefix != "msg" or not number.isascii() or not number.isdigit() or len(number) > 12:
        raise ValueError(f"not a message id: {row_id!r}")
    return int(number)


def row_of(stored: Message) -> Message:
    """A stored message as a client sees the row: the OpenAI fields, `id`, `turn_id`,
    `created_at`."""
    row = stored_message(stored)
    row["id"] = stored["id"]
    row["turn_id"] = stored["turn_id"]
    row["created_at"] = stored["created_at"]
    return row
