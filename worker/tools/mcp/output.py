"""What the model reads of an MCP tool's result, and what is kept beside it.

- Text blocks are the text, in order.
- Structured content is kept: as the text when the result has no text, after it when the
  text does not already say it (servers are asked to mirror it as JSON text, and the SDK's
  own wraps a plain value as `{"result": value}`), and in the artifact (below).
- Images, audio and binary resources are referenced (their type and size), never inlined:
  the model reads text. An embedded text resource is inlined up to `INLINE_RESOURCE_CHARS`,
  referenced beyond; a resource link is referenced.
- The whole is cut at `max_chars` (`BERNARD_MCP_RESULT_MAX_CHARS`), saying how much was
  left out, as every tool's output is bounded: what the model reads is what the turn streams
  and the conversation stores. Blocks past the cut are counted, not rendered; structured
  content is not written out as JSON once the text fills the cut.
- The artifact is bounded the same way: structured content is kept whole only within
  `max_chars` of JSON (its size beyond), and at most `MAX_REFERENCES` blocks are referenced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

__all__ = ["INLINE_RESOURCE_CHARS", "MAX_REFERENCES", "Output", "render_result"]

INLINE_RESOURCE_CHARS = 4_000
# Blocks the artifact refers to, at most: a result of a million tiny images is one line.
MAX_REFERENCES = 64


@dataclass(frozen=True, slots=True)
class Output:
    """The text the model reads, and what the result held beyond it (`None`: nothing)."""

    text: str
    artifact: dict[str, Any] | None = None


def render_result(result: CallToolResult, *, max_chars: int) -> Output:
    """`result` as the model reads it (see the module docstring)."""
    text = _Cut(max_chars)
    references: list[dict[str, Any]] = []
    unread = 0  # blocks past the cut, or past `MAX_REFERENCES`, the artifact does not list
    for block in result.content:
        if text.cut:  # past the cut: counted, not rendered
            text.skip(_length(block))
            unread += not isinstance(block, TextContent)  # each other block is referred to
            continue
        text.add(_block(block))
        reference = _reference(block)
        if reference is None:
            continue
        if len(references) < MAX_REFERENCES:
            references.append(reference)
        else:
            unread += 1
    structured = result.structured_content
    artifact: dict[str, Any] = {}
    if structured is not None:
        shown = json.dumps(structured, ensure_ascii=False)
        if not text.cut and not _says(text.so_far, structured):
            text.add(f"Structured content: {shown}" if text.so_far else shown)
        if len(shown) <= max_chars:
            artifact["structured_content"] = structured
        else:  # the text carries what fits; the artifact never holds more than it
            artifact["structured_content_chars"] = len(shown)
    if references:
        artifact["content"] = references
    if unread:
        artifact["content_not_listed"] = unread
    return Output(text=text.text(), artifact=artifact or None)


class _Cut:
    """A result's parts joined by newlines, kept up to `limit` characters; `left_out`
    counts the characters beyond (the parts past the cut are only measured)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[str] = []
        self._kept = 0
        self.left_out = 0

    @property
    def cut(self) -> bool:
        return self.left_out > 0

    @property
    def so_far(self) -> str:
        return "".join(self._parts)

    def add(self, part: str) -> None:
        if not part:
            return
        sep = "\n" if self._kept or self.left_out else ""
        length, room = len(sep) + len(part), self.limit - self._kept
        if length > room:  # sliced before it is joined: a long part is never copied whole
            self.left_out += length - room
            part = f"{sep}{part[: max(room - len(sep), 0)]}"[:room]
        else:
            part = f"{sep}{part}"
        self._parts.append(part)
        self._kept += len(part)

    def skip(self, length: int) -> None:
        if length:
            self.left_out += 1 + length  # and the newline before it

    def text(self) -> str:
        if not self.left_out:
            return self.so_far
        return f"{self.so_far}\n…[cut: the server sent {self.left_out} characters more]"


def _block(block: ContentBlock) -> str:
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ImageContent | AudioContent):
        kind = "image" if isinstance(block, ImageContent) else "audio"
        return f"[{kind}: {block.mime_type}, {_size(_decoded_bytes(block.data))}, not shown]"
    if isinstance(block, ResourceLink):
        size = f", {_size(block.size)}" if block.size is not None else ""
        mime = f", {block.mime_type}" if block.mime_type else ""
        return f"[resource link: {block.name} <{block.uri}>{mime}{size}]"
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        mime = f", {resource.mime_type}" if resource.mime_type else ""
        if isinstance(resource, TextResourceContents):
            if len(resource.text) <= INLINE_RESOURCE_CHARS:
                return f"[resource <{resource.uri}>{mime}]\n{resource.text}"
            return f"[resource <{resource.uri}>{mime}, {len(resource.text)} characters, not shown]"
        size = _size(_decoded_bytes(resource.blob))
        return f"[resource <{resource.uri}>{mime}, {size}, not shown]"
    return ""  # pragma: no cover - a content type of a protocol newer than this client


def _length(block: ContentBlock) -> int:
    """How many characters `_block` renders `block` as, without copying a text block."""
    return len(block.text) if isinstance(block, TextContent) else len(_block(block))


def _reference(block: ContentBlock) -> dict[str, Any] | None:
    """What the artifact keeps of a block the text only refers to (never its data)."""
    if isinstance(block, ImageContent | AudioContent):
        return {
            "type": block.type,
            "mime_type": block.mime_type,
            "bytes": _decoded_bytes(block.data),
        }
    if isinstance(block, ResourceLink):
        return {
            "type": "resource_link",
            "uri": block.uri,
            "name": block.name,
            "mime_type": block.mime_type,
        }
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        entry: dict[str, Any] = {
            "type": "resource",
            "uri": resource.uri,
            "mime_type": resource.mime_type,
        }
        if isinstance(resource, BlobResourceContents):
            entry["bytes"] = _decoded_bytes(resource.blob)
        return entry
    return None


def _says(text: str, structured: Any) -> bool:
    """Whether `text` already says what `structured` holds: its JSON, or the value the
    SDK's servers wrap as `{"result": value}`."""
    try:
        if json.loads(text) == structured:
            return True
    except ValueError:
        pass
    if isinstance(structured, dict) and set(structured) == {"result"}:
        value = structured["result"]
        return text == (value if isinstance(value, str) else json.dumps(value))
    return False


def _decoded_bytes(data: str) -> int:
    """The size of base64 `data` once decoded, without decoding it."""
    return len("".join(data.split()).rstrip("=")) * 3 // 4


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} bytes"
    if count < 1024 * 1024:
        return f"{count / 1024:.0f} KB"
    return f"{count / (1024 * 1024):.1f} MB"
