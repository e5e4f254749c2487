"""The name the router knows an MCP server's tool by: `<server>__<tool>`, within OpenAI's
function-name rules (`^[a-zA-Z0-9_-]{1,64}$`), unique, and never one already taken (a
built-in tool's, another server's tool's)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection

__all__ = ["MAX_CHARS", "clean", "tool_name"]

MAX_CHARS = 64
_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_-]+")
# The part of a name too long to keep that is replaced by a hash of the whole name.
_HASH_CHARS = 8


def clean(part: str) -> str:
    """`part` with each run of characters a function name may not hold made one `_`."""
    return _NOT_ALLOWED.sub("_", part) or "_"


def tool_name(server: str, tool: str, taken: Collection[str] = ()) -> str:
    """`<server>__<tool>`, cleaned; cut to 64 characters with a hash of the whole name in
    place of the end when longer; `_2`, `_3`, ... added while the name is `taken`."""
    name = f"{clean(server)}__{clean(tool)}"
    if len(name) > MAX_CHARS:
        digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:_HASH_CHARS]
        name = f"{name[: MAX_CHARS - _HASH_CHARS - 1]}_{digest}"
    unique, n = name, 2
    while unique in taken:
        suffix = f"_{n}"
        unique = f"{name[: MAX_CHARS - len(suffix)]}{suffix}"
        n += 1
    return unique
