"""The bounds of a request's fields, one place each, whichever API brings them (api/schemas.py
for Chat Completions and the conversations' messages, api/responses_schema.py for the
Responses API): OpenAI's own on names, ids and tools, and the operator's limits
(shared/settings.py) counted across a request, each refusal a 400 naming the parameter and
the setting.
"""

from __future__ import annotations

import re
from typing import Any, TypeGuard

import orjson

from api.errors import invalid
from shared.settings import Settings

# What the model APIs take: token counts are 32-bit.
MAX_INT32 = 2**31 - 1
# OpenAI's own limits on names and ids (on tools: shared/client_tools.py).
MAX_NAME_CHARS = 256
MAX_ID_CHARS = 256
# OpenAI's rule for a function's name.
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"
MAX_DESCRIPTION_CHARS = 16_384

_FUNCTION_NAME = re.compile(FUNCTION_NAME)


def is_function_name(name: object) -> TypeGuard[str]:
    """Whether `name` is a name OpenAI takes for a function (`FUNCTION_NAME`)."""
    return isinstance(name, str) and _FUNCTION_NAME.fullmatch(name) is not None


def check_message_chars(size: int, settings: Settings, param: str, what: str) -> None:
    """`what` (one message, input item or prompt) holds at most `BERNARD_MAX_MESSAGE_CHARS`."""
    if size > settings.max_message_chars:
        raise invalid(
            f"{what} may hold at most {settings.max_message_chars} characters "
            f"(BERNARD_MAX_MESSAGE_CHARS); this one has {size}",
            param,
        )


class RequestSize:
    """What a request holds, counted item by item (its messages, its input items): each
    item at most `BERNARD_MAX_MESSAGE_CHARS` characters, all of them at most
    `BERNARD_MAX_CONTENT_CHARS`, carrying at most `BERNARD_MAX_TOOL_CALLS` tool calls in
    all; and the client's tools at most `BERNARD_MAX_TOOLS_BYTES` as JSON (the turn's
    record holds them while it runs, a response keeps them to show them back, and every
    prompt of the router carries them)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.chars = 0
        self.tool_calls = 0

    def add(self, chars: int, param: str, what: str, tool_calls: int = 0) -> None:
        """One item, `what` at `param`, of `chars` characters and `tool_calls` tool calls."""
        check_message_chars(chars, self.settings, param, what)
        self.chars += chars
        self.tool_calls += tool_calls

    def check(self, param: str, what: str, tools: list[Any]) -> None:
        """The items added, `what` at `param` in all, and the request's `tools`."""
        settings = self.settings
        if self.chars > settings.max_content_chars:
            raise invalid(
                f"{what} may hold at most {settings.max_content_chars} characters in all "
                f"(BERNARD_MAX_CONTENT_CHARS); this has {self.chars}",
                param,
            )
        if self.tool_calls > settings.max_tool_calls:
            raise invalid(
                f"a request may carry at most {settings.max_tool_calls} tool calls in all "
                f"(BERNARD_MAX_TOOL_CALLS); this one carries {self.tool_calls}",
                param,
            )
        size = len(orjson.dumps(tools)) if tools else 0
        if size > settings.max_tools_bytes:
            raise invalid(
                f"the tools may take at most {settings.max_tools_bytes} bytes as JSON "
                f"(BERNARD_MAX_TOOLS_BYTES); these take {size}",
                "tools",
            )
