"""`BERNARD_MCP_CONFIG`: the MCP servers a worker connects to, read from a JSON file in the
`mcpServers` format desktop assistants share (docs/tools.md, "MCP servers", shows it).

A server has a `url` (streamable HTTP, with its `headers`) or a `command` (a child process of
each worker, over stdio); `${NAME}` in any of its strings is the worker's environment
variable, so secrets stay out of the file. Bernard's own keys are `confirm`, `trust_hints`,
`timeout_s` and `disabled`; other assistants' keys are ignored. The file is read once, as
the worker starts: anything wrong is an `McpConfigError` naming the file, server and field.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "Confirm",
    "HttpServer",
    "McpConfig",
    "McpConfigError",
    "ServerConfig",
    "StdioServer",
    "expand",
    "load_config",
    "parse_config",
]

logger = logging.getLogger("bernard.worker.mcp")

# `${NAME}` or `${NAME:-default}`.
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class McpConfigError(ValueError):
    """`BERNARD_MCP_CONFIG` cannot be used; the message names the file, server and field."""


class Confirm(StrEnum):
    """Which calls of a server's tools wait for the user's decision."""

    ANNOTATIONS = "annotations"  # those the tool's annotations do not call read-only and safe
    ALWAYS = "always"
    NEVER = "never"


class _Server(BaseModel):
    # Keys other assistants keep in the same file (`alwaysAllow`, `description`, ...) are
    # left alone, not refused: one file may serve several assistants.
    model_config = ConfigDict(extra="allow", frozen=True)

    confirm: Confirm = Confirm.ANNOTATIONS
    # Whether a tool's `readOnlyHint` may spare the user the question (`confirm: annotations`).
    trust_hints: bool = False
    timeout_s: float | None = Field(None, gt=0)
    disabled: bool = False


class HttpServer(_Server):
    """A server reached over streamable HTTP."""

    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    type: Literal["http", "streamable-http", "streamableHttp"] | None = None

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not re.match(r"(?i)^https?://[^/\s]+", url):
            raise ValueError("must be an http:// or https:// URL")
        return url

    @property
    def transport(self) -> Literal["http"]:
        return "http"


class StdioServer(_Server):
    """A server started as a child process of each worker, spoken to over stdio."""

    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    type: Literal["stdio"] | None = None

    @property
    def transport(self) -> Literal["stdio"]:
        return "stdio"


ServerConfig = HttpServer | StdioServer


@dataclass(frozen=True, slots=True)
class McpConfig:
    """The servers to connect to, by their name in the file (disabled ones left out)."""

    servers: dict[str, ServerConfig]


def load_config(path: str, environ: Mapping[str, str] | None = None) -> McpConfig:
    """The servers `path` configures, their `${NAME}`s expanded from `environ` (the
    process's environment by default)."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise McpConfigError(f"BERNARD_MCP_CONFIG: cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise McpConfigError(f"BERNARD_MCP_CONFIG: {path} is not valid JSON: {exc}") from exc
    try:
        return parse_config(raw, os.environ if environ is None else environ)
    except McpConfigError as exc:
        raise McpConfigError(f"BERNARD_MCP_CONFIG ({path}): {exc}") from None


def parse_config(raw: Any, environ: Mapping[str, str]) -> McpConfig:
    """The servers of a parsed `mcpServers` document (see the module docstring)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("mcpServers"), dict):
        raise McpConfigError('the file must be a JSON object with an object "mcpServers"')
    servers: dict[str, ServerConfig] = {}
    for name, entry in raw["mcpServers"].items():
        where = f"mcpServers.{name}"
        if not isinstance(entry, dict):
            raise McpConfigError(f"{where}: must be an object")
        server = _server(where, expand(entry, environ, where))
        if server.model_extra:
            logger.info(
                "MCP server %s: ignoring keys Bernard does not read: %s",
                name,
                ", ".join(sorted(server.model_extra)),
            )
        if not server.disabled:
            servers[name] = server
    return McpConfig(servers=servers)


def _server(where: str, entry: dict[str, Any]) -> ServerConfig:
    kind = entry.get("type")
    if kind == "sse" or (
        kind is not None and kind not in ("http", "streamable-http", "streamableHttp", "stdio")
    ):
        raise McpConfigError(
            f"{where}.type: {kind!r} is not a transport Bernard speaks (streamable HTTP with "
            '"url", or stdio with "command")'
        )
    has_url, has_command = "url" in entry, "command" in entry
    if has_url == has_command:
        raise McpConfigError(
            f'{where}: give either "url" (streamable HTTP) or "command" (stdio)'
            + (", not both" if has_url else "")
        )
    model: type[HttpServer] | type[StdioServer] = HttpServer if has_url else StdioServer
    try:
        return model.model_validate(entry)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        raise McpConfigError(f"{where}.{field}: {error['msg']}") from None


def expand(value: Any, environ: Mapping[str, str], where: str) -> Any:
    """`value` with `${NAME}` and `${NAME:-default}` replaced in every string it holds
    (keys excepted); a variable that is not set and has no default is an error naming
    `where` it was asked for."""
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            found = environ.get(name)
            if found is not None:
                return found
            if default is not None:
                return default
            raise McpConfigError(f"{where}: ${{{name}}} is not set in the environment")

        return _VARIABLE.sub(replace, value)
    if isinstance(value, dict):
        return {key: expand(item, environ, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [expand(item, environ, f"{where}[{i}]") for i, item in enumerate(value)]
    return value
