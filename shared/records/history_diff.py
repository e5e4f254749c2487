"""What of a resent history is new: clients resend the whole conversation with every
request, and `new_messages` picks out the messages that continue the stored history rather
than repeat it (Knuth-Morris-Pratt over the messages' (role, text), linear in both).

shared/records/writes.py (`Recorder.append_new_messages`) runs it against the stored
history and appends what it finds, atomically.

A client that sends no conversation id but resends its history is known again by that
history (`history_digest`): a turn that asks the user a question keeps the digest of its
request's messages and the answer's text, and the next request whose messages up to its
last one have that digest continues the conversation that asked (api/conversations.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from shared.records.messages import STOPPED, Message, MessageLike, to_openai_message

__all__ = ["history_digest", "new_messages"]

_SYSTEM_ROLES = frozenset({"system", "developer"})


def new_messages(
    stored: Sequence[Mapping[str, Any]], requested: Sequence[MessageLike]
) -> list[Message]:
    """The messages of `requested` that continue `stored` rather than repeat it.

    A client's request is usually the stored history, perhaps trimmed at the front and
    without the tool messages it never saw, followed by the new messages. Both sides are
    reduced to their user messages and the assistant messages with text, compared by
    (role, text). The stored router steps (assistant messages carrying tool calls) never
    reached the client as text, so they are left out of the comparison. The repeat ends
    where the request first holds the whole stored history, or else where its longest
    start that equals the end of the stored history ends; everything after it is new.
    `stored` may be only the latest part of a longer history (`Recorder.append_new_messages`):
    found whole in the request, it marks the repeat just the same.

    - Nothing stored: the whole request is new, system messages included.
    - No overlap: the request's trailing turn (the messages after its last assistant or
      system message) is new.
    - The request only repeats the stored history (a retry): nothing is new.

    Tool calls are told apart by their ids, which the client sends back as it got them: a
    request's assistant message without text whose calls are all stored, and a tool
    message answering a call whose result is stored, repeat what is stored (a client's own
    tools' calls, stored when the turn handed them over: worker/harness/router.py; then
    their results, which the follow-up carries, are new).

    An answer stored unfinished (`stopped`: its turn was cancelled or interrupted) may come
    back as the client got it, which is all of it or less, or not at all (the client's
    history never finished it): it takes no part in the comparison, and a request's
    assistant message whose text it starts with repeats it.

    Linear in the size of both: a request and a history of thousands of messages cost
    milliseconds, not the worker's event loop.
    """
    request = _not_stored_calls(stored, [to_openai_message(m) for m in requested])
    request = _not_stopped_answers(stored, request)
    history = [key for m in stored if (key := _match_key(m, stored=True)) is not None]
    if not history:
        return request
    positions = [i for i, m in enumerate(request) if _match_key(m, stored=False) is not None]
    sent = [_match_key(request[i], stored=False) for i in positions]
    repeated = _find(history, sent)
    if repeated is None:
        repeated = _overlap(history, sent)
    if repeated == 0:
        return _trailing_turn(request)
    return request[positions[repeated - 1] + 1 :]


def _not_stored_calls(stored: Sequence[Mapping[str, Any]], request: list[Message]) -> list[Message]:
    """`request` without the tool calls and tool results `stored` holds (by call id)."""
    calls: set[Any] = set()
    answered: set[Any] = set()
    for row in stored:
        if row.get("role") == "assistant":
            calls.update(call.get("id") for call in row.get("tool_calls") or ())
        elif row.get("role") == "tool":
            answered.add(row.get("tool_call_id"))
    if not calls:
        return request

    def repeated(message: Message) -> bool:
        if message["role"] == "tool":
            return message.get("tool_call_id") in answered
        ids = [call.get("id") for call in message.get("tool_calls") or ()]
        text = _content_text(message.get("content"))
        return message["role"] == "assistant" and bool(ids) and not text and calls.issuperset(ids)

    return [message for message in request if not repeated(message)]


def _not_stopped_answers(
    stored: Sequence[Mapping[str, Any]], request: list[Message]
) -> list[Message]:
    """`request` without the assistant messages that repeat an answer `stored` holds
    unfinished: its text, or the start of it."""
    stopped = [
        text
        for row in stored
        if row.get("role") == "assistant" and row.get(STOPPED)
        if (text := _content_text(row.get("content")))
    ]
    if not stopped:
        return request

    def repeated(message: Message) -> bool:
        text = _content_text(message.get("content"))
        return (
            message["role"] == "assistant"
            and bool(text)
            and not message.get("tool_calls")
            and any(answer.startswith(text) for answer in stopped)
        )

    return [message for message in request if not repeated(message)]


def _prefix_function(pattern: Sequence[object]) -> list[int]:
    """Knuth-Morris-Pratt: for each i, the longest proper prefix of pattern[:i+1] that is
    also its suffix."""
    table = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = table[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        table[i] = k
    return table


def _find(pattern: Sequence[object], text: Sequence[object]) -> int | None:
    """Where the first whole occurrence of `pattern` in `text` ends, or None."""
    table = _prefix_function(pattern)
    k = 0
    for i, item in enumerate(text):
        while k and item != pattern[k]:
            k = table[k - 1]
        if item == pattern[k]:
            k += 1
        if k == len(pattern):
            return i + 1
    return None


def _overlap(history: Sequence[object], sent: Sequence[object]) -> int:
    """The length of the longest start of `sent` that equals the end of `history`."""
    if not sent:
        return 0
    table = _prefix_function(sent)
    k = 0
    for item in history:
        if k == len(sent):
            k = table[k - 1]
        while k and item != sent[k]:
            k = table[k - 1]
        if item == sent[k]:
            k += 1
    return k


def _match_key(message: Mapping[str, Any], *, stored: bool) -> tuple[str, str] | None:
    role = message.get("role")
    if role not in ("user", "assistant"):
        return None
    if stored and role == "assistant" and (message.get("tool_calls") or message.get(STOPPED)):
        return None
    text = _content_text(message.get("content"))
    if role == "assistant" and not text:
        return None
    return (role, text)


def _content_text(content: Any) -> str:
    # Clients may send text as a string or as content parts, and trim whitespace differently;
    # both must compare equal to what was stored.
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                pieces.append(str(part.get("text", "")))
            else:
                pieces.append(_stable_json(part))
        return "".join(pieces).strip()
    return _stable_json(content)


def _stable_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode()


def _trailing_turn(request: list[Message]) -> list[Message]:
    start = len(request)
    while start > 0 and request[start - 1]["role"] not in {"assistant", *_SYSTEM_ROLES}:
        start -= 1
    return request[start:]


def history_digest(messages: Sequence[MessageLike]) -> str:
    """A digest of a history as a client resends it: each message's role, its text (as
    `new_messages` compares texts: a string or text parts, whitespace around it aside) and
    the ids of the tool calls it makes or answers. Two histories that differ in any of these
    differ in digest."""
    shown = []
    for message in map(to_openai_message, messages):
        calls = [call.get("id") for call in message.get("tool_calls") or ()]
        answers = message.get("tool_call_id")
        shown.append([message["role"], _content_text(message.get("content")), calls, answers])
    return hashlib.sha256(orjson.dumps(shown)).hexdigest()
