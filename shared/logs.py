"""Logging for Bernard: text for a terminal, one JSON object a line for everything else.

Bernard logs with the standard library, a line's fields in `extra=`: uvicorn, arq, httpx and
LangChain log through it too, and one formatter gives all their lines one shape (structlog
would be a second pipeline to keep in step). Lines logged while a worker runs a turn carry
its `turn_id`, `conversation_id` and `user` (`TURN_FIELDS`). Prompts and content are logged
only with `BERNARD_LOG_PROMPTS`; every secret the settings hold, those handed to
`hide_in_logs` and the credentials inside any URL are replaced whatever it says; control
characters are escaped in both formats, so no line can drive a terminal or forge another.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Any

import orjson

from shared.redaction import redact_urls, url_secrets
from shared.settings import Settings, get_settings

__all__ = [
    "TURN_FIELDS",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "escape_controls",
    "hide_in_logs",
    "log_format",
    "log_handler",
    "secrets_of",
]

# The fields of the turn the current task runs (a worker's turn task sets it once).
TURN_FIELDS: ContextVar[Mapping[str, Any] | None] = ContextVar("bernard_turn", default=None)

# Attributes every LogRecord has: whatever else a record holds came in through `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's coloured copy of the message
}
# Shorter secrets are not looked for: replacing every "abc" would garble lines and hide
# nothing worth hiding.
_MIN_SECRET_CHARS = 6
REDACTED = "[redacted]"


def secrets_of(settings: Settings, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Every secret the settings (and the OTLP exporter's headers) hold, longest first: the
    keys and tokens, and the credentials inside each URL (shared/redaction.py)."""
    urls = (
        settings.openai_base_url,
        settings.anthropic_base_url,
        settings.otel_exporter_otlp_endpoint,
    )
    values: list[str | None] = [
        *(secret for url in urls for secret in url_secrets(url)),
        settings.openai_api_key,
        settings.anthropic_api_key,
        settings.metrics_key,
        *url_secrets(settings.redis_url),
        *url_secrets(settings.queue_url),
        *settings.api_key_users(),
    ]
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        for pair in environ.get(name, "").split(","):
            values.append(pair.partition("=")[2].strip())
    return _longest_first(values)


def _longest_first(values: Iterable[str | None]) -> tuple[str, ...]:
    # Longest first: a secret inside a longer one would otherwise leave the rest of it.
    found = {value for value in values if value and len(value) >= _MIN_SECRET_CHARS}
    return tuple(sorted(found, key=len, reverse=True))


# Secrets declared outside `Settings`, which this module does not read (a tool source's own
# settings, declared beside its tools). Process-wide, as logging is: every formatter, made
# before or after, hides them from the next line on.
_hidden: tuple[str, ...] = ()


def hide_in_logs(values: Iterable[str]) -> None:
    """Hide each of `values` (not the shortest: `_MIN_SECRET_CHARS`) wherever a line holds
    it, from now on, in every format."""
    global _hidden
    _hidden = _longest_first({*_hidden, *values})


class _Secrets:
    """A formatter's secrets: its settings' and those handed to `hide_in_logs`, merged
    again only when the latter changed."""

    def __init__(self, own: Iterable[str]) -> None:
        self.own = tuple(own)
        self._seen: tuple[str, ...] | None = None
        self._all = self.own

    def all(self) -> tuple[str, ...]:
        if self._seen is not _hidden:
            self._seen = _hidden
            self._all = _longest_first({*self.own, *_hidden})
        return self._all


# C0, DEL and C1: the characters a terminal acts on rather than shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_SHORT_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def escape_controls(text: str) -> str:
    """`text` with every control character written as JSON escapes it."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: _SHORT_ESCAPES.get(m[0]) or f"\\u{ord(m[0]):04x}", text)


def _redact(line: str, secrets: Iterable[str]) -> str:
    """`line` with the credentials of every URL in it hidden, then every known secret."""
    line = redact_urls(line)
    for secret in secrets:
        if secret in line:
            line = line.replace(secret, REDACTED)
    return line


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's `extra=` fields, and its turn's when it has none of its own."""
    fields = {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES}
    turn = TURN_FIELDS.get()
    if turn:
        for name, value in turn.items():
            fields.setdefault(name, value)
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, message, the record's fields, exc."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = _Secrets(secrets)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in _fields(record).items():
            line.setdefault(name, value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        # orjson escapes C0 itself; this catches DEL and C1, which can only be in strings.
        text = escape_controls(orjson.dumps(line, default=str).decode())
        return _redact(text, self.secrets.all())


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`, for a person at a terminal."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.secrets = _Secrets(secrets)

    def format(self, record: logging.LogRecord) -> str:
        # As `logging.Formatter.format`, each part escaped: the head on one line, then the
        # traceback's lines.
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        text = escape_controls(self.formatMessage(record))
        fields = _fields(record)
        if fields:
            text += " " + " ".join(
                f"{escape_controls(name)}={_text_value(value)}" for name, value in fields.items()
            )
        trace: list[str] = []
        if record.exc_info:
            trace.append(self.formatException(record.exc_info))
        elif record.exc_text:
            trace.append(record.exc_text)
        if record.stack_info:
            trace.append(self.formatStack(record.stack_info))
        for part in trace:
            text += "".join(f"\n{escape_controls(line)}" for line in part.splitlines())
        return _redact(text, self.secrets.all())


def _text_value(value: Any) -> str:
    if (
        isinstance(value, str)
        and value
        and not any(c.isspace() or c in "\"'=" or _CONTROL.match(c) for c in value)
    ):
        return value
    if isinstance(value, float):
        return f"{value:.1f}"
    return escape_controls(orjson.dumps(value, default=str).decode())


def log_format(settings: Settings, stream: IO[str] | None = None) -> str:
    """`json` or `text`: as set, else text when `stream` (stderr) is a terminal."""
    if settings.log_format is not None:
        return settings.log_format
    stream = stream if stream is not None else sys.stderr
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return "json"


def log_handler(settings: Settings, stream: IO[str] | None = None) -> logging.Handler:
    """A handler writing to `stream` (stderr) in the format the settings ask for."""
    handler = logging.StreamHandler(stream)  # None: stderr
    secrets = secrets_of(settings)
    if log_format(settings, stream) == "json":
        handler.setFormatter(JsonFormatter(secrets))
    else:
        handler.setFormatter(TextFormatter(secrets))
    return handler


def configure_logging(settings: Settings | None = None, level: int = logging.INFO) -> None:
    """Give the `bernard` logger a stderr handler unless something configured it already;
    with JSON on, arq's and uvicorn's loggers write through it too."""
    logger = logging.getLogger("bernard")
    if logger.handlers:
        return
    settings = settings or get_settings()
    handler = log_handler(settings)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    # The API's request line (api/access_log.py) replaces uvicorn's access line.
    access = logging.getLogger("uvicorn.access")
    access.handlers.clear()
    access.propagate = False
    if isinstance(handler.formatter, JsonFormatter):
        # uvicorn and arq set up their own loggers before Bernard's code runs: replaced here.
        for name in ("uvicorn", "arq"):
            other = logging.getLogger(name)
            other.handlers = [handler]
            other.propagate = False
