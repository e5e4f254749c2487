"""What one MCP server may publish: each tool's description and input schema go into every
router request, so each tool is checked, and each tool, the count of a server's tools and
their total are bounded.

A tool is checked as the router would offer it (shared/schema_checks.py `SchemaChecks.tool`,
in a child process with a time bound): an input schema Bernard cannot check arguments
against (a `$ref` that names nothing, or names another document), or one LangChain cannot
convert for a model's `bind_tools`, would fail every router request of every turn, so its
tool is left out alone. A tool's size is the bytes it adds to a request: its description as
offered (cut at `DESCRIPTION_CHARS`, with its server named) and its parameters as the model
is offered them (JSON, `$ref`s inlined: a small schema may inline to megabytes). Taking a
server's tools in the order it lists them, a tool is left out when its schema is unusable,
when it is over `tool_max_bytes` (`BERNARD_MCP_TOOL_MAX_BYTES`), when `max_tools` were kept
already (`BERNARD_MCP_SERVER_MAX_TOOLS`; no more than twice as many are checked), or when it
would take the server's total past `max_bytes` (`BERNARD_MCP_SERVER_MAX_BYTES`); the others
are offered. What was left out, and why, is a warning in the worker's log and in the
server's health (shared/mcp_health.py `warnings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mcp.types import Tool

from shared.schema_checks import Unusable, Usable
from worker.tools.http import trim

__all__ = ["DESCRIPTION_CHARS", "Bounds", "Listing", "arguments_schema", "description", "size"]

# A tool's description reaches the model with every router call: a server's is cut here.
DESCRIPTION_CHARS = 1000
# The tools a warning names, at most (each name cut at `_NAME_CHARS`): a server may list
# hundreds.
_NAMED = 5
_NAME_CHARS = 64


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one server may publish (the settings' defaults)."""

    tool_max_bytes: int = 16 * 1024
    max_tools: int = 64
    max_bytes: int = 128 * 1024


def description(remote: Tool, server: str) -> str:
    """A tool's description as the router is offered it."""
    said = trim(remote.description or remote.title or remote.name, DESCRIPTION_CHARS)
    return f"{said} (from the MCP server “{server}”)"


def arguments_schema(remote: Tool) -> dict[str, Any]:
    """The input schema as a function's parameters: an object, whatever the server sent."""
    schema = dict(remote.input_schema)
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


def size(remote: Tool, server: str, offered: Usable) -> int:
    """The bytes `remote` adds to a router request: its description, and its parameters as
    `offered` (its check's verdict)."""
    return len(description(remote, server).encode()) + offered.bytes


@dataclass
class Listing:
    """A server's tools as its pages come, kept within `bounds` (see the module docstring)."""

    bounds: Bounds
    server: str
    tools: list[Tool] = field(default_factory=list)
    total: int = 0
    # The tools left out: (name, why) with a schema that cannot be used; (name, bytes) over
    # the per-tool bound; names past the count, and past the total.
    unusable: list[tuple[str, str]] = field(default_factory=list)
    too_large: list[tuple[str, int]] = field(default_factory=list)
    past_count: list[str] = field(default_factory=list)
    past_total: list[str] = field(default_factory=list)
    checked: int = 0

    @property
    def checking(self) -> bool:
        """Whether the next tool is checked (and may be kept), or is past the count."""
        return len(self.tools) < self.bounds.max_tools and self.checked < 2 * self.bounds.max_tools

    def add(self, tool: Tool, verdict: Usable | Unusable | None) -> None:
        """The next tool the server lists, with its check's verdict (None: not checked,
        as it came when no more were `checking`)."""
        if verdict is None or not self.checking:
            self.past_count.append(tool.name)
            return
        self.checked += 1
        if isinstance(verdict, Unusable):
            self.unusable.append((tool.name, verdict.reason))
            return
        bytes_ = size(tool, self.server, verdict)
        if bytes_ > self.bounds.tool_max_bytes:
            self.too_large.append((tool.name, bytes_))
        elif self.total + bytes_ > self.bounds.max_bytes:
            self.past_total.append(tool.name)
        else:
            self.tools.append(tool)
            self.total += bytes_

    def warnings(self) -> list[str]:
        """What was left out and why, one sentence per reason."""
        said = []
        if self.unusable:
            said.append(
                f"{_tools(len(self.unusable))} left out, the input schema unusable: "
                + _names([f"{_name(name)} ({why})" for name, why in self.unusable])
            )
        if self.too_large:
            said.append(
                f"{_tools(len(self.too_large))} left out, each over BERNARD_MCP_TOOL_MAX_BYTES "
                f"({self.bounds.tool_max_bytes} bytes of description and input schema): "
                + _names([f"{_name(name)} ({bytes_} bytes)" for name, bytes_ in self.too_large])
            )
        if self.past_count:
            said.append(
                f"{_tools(len(self.past_count))} left out past BERNARD_MCP_SERVER_MAX_TOOLS "
                f"({self.bounds.max_tools} tools): "
                + _names([_name(name) for name in self.past_count])
            )
        if self.past_total:
            said.append(
                f"{_tools(len(self.past_total))} left out past BERNARD_MCP_SERVER_MAX_BYTES "
                f"({self.bounds.max_bytes} bytes of descriptions and input schemas in all): "
                + _names([_name(name) for name in self.past_total])
            )
        return said


def _tools(n: int) -> str:
    return f"{n} tool{'' if n == 1 else 's'}"


def _name(name: str) -> str:
    return trim(name, _NAME_CHARS)


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_NAMED])
    return shown if len(names) <= _NAMED else f"{shown} and {len(names) - _NAMED} more"
